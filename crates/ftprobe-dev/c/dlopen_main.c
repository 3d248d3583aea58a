/* dlopen_main: objects loaded and unloaded while traced (built with
 * -fpatchable-function-entry=5; its libraries too). Prints its own counts on stdout.
 *
 *   dlopen_main cycle LIB N M   dlopen LIB (its constructor calls dl_work 3 times), call
 *                               dl_work(100 + i) N times, dlclose it (checking with
 *                               dl_iterate_phdr that it is unmapped), then dlopen it again
 *                               and call dl_work(200 + i) M times, and dlclose it. mark(1..5)
 *                               is called between the phases.
 *   dlopen_main threads LIB LIB2 K R
 *                               dlopen LIB; a second thread calls dl_work(i) until the main
 *                               thread is done (and at least K times) while the main thread
 *                               dlopens LIB2 (constructor: dl2_work 3 times), calls dl2_work
 *                               once and dlcloses it, R times.
 *   dlopen_main dlmopen LIB N   dlmopen LIB into a new namespace (a second libc with it),
 *                               call dl_work(300 + i) N times, dlclose it. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef long (*work_fn)(long);

__attribute__((noinline)) void mark(long phase)
{
    __asm__ volatile("" ::"r"(phase) : "memory");
}

static int seen_cb(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    const char *want = data;
    const char *base = strrchr(info->dlpi_name, '/');
    base = base ? base + 1 : info->dlpi_name;
    return strcmp(base, want) == 0;
}

/* Whether an object of that file name is mapped. */
static int mapped(const char *lib)
{
    const char *base = strrchr(lib, '/');
    return dl_iterate_phdr(seen_cb, (void *)(base ? base + 1 : lib));
}

static void *open_or_die(const char *lib)
{
    void *h = dlopen(lib, RTLD_NOW);
    if (!h) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        exit(2);
    }
    return h;
}

static long load_and_call(const char *lib, long n, long base, int period)
{
    void *h = open_or_die(lib);
    work_fn work = (work_fn)dlsym(h, "dl_work");
    long (*ctor_calls)(void) = (long (*)(void))dlsym(h, "dl_ctor_calls");
    long sum = 0;
    for (long i = 0; i < n; i++)
        sum += work(base + i);
    printf("period%d ctor_calls=%ld calls=%ld sum=%ld\n", period, ctor_calls(), n, sum);
    dlclose(h);
    return mapped(lib);
}

struct worker {
    work_fn work;
    long k;
    long calls;
    int started;
    int stop;
};

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    __atomic_store_n(&w->started, 1, __ATOMIC_RELEASE);
    for (long i = 0; i < w->k || !__atomic_load_n(&w->stop, __ATOMIC_ACQUIRE); i++) {
        w->work(i);
        w->calls++;
    }
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc == 5 && !strcmp(argv[1], "cycle")) {
        const char *lib = argv[2];
        long n = atol(argv[3]), m = atol(argv[4]);
        mark(1);
        printf("mapped_before=%d\n", mapped(lib));
        printf("mapped_after_close1=%d\n", (int)load_and_call(lib, n, 100, 1));
        mark(2);
        /* Nothing of the library runs here: it is not mapped. */
        mark(3);
        printf("mapped_after_close2=%d\n", (int)load_and_call(lib, m, 200, 2));
        mark(4);
        return 0;
    }
    if (argc == 6 && !strcmp(argv[1], "threads")) {
        const char *lib = argv[2], *lib2 = argv[3];
        long k = atol(argv[4]), r = atol(argv[5]);
        void *h = open_or_die(lib);
        struct worker w = {(work_fn)dlsym(h, "dl_work"), k, 0, 0, 0};
        pthread_t t;
        pthread_create(&t, NULL, worker_main, &w);
        while (!__atomic_load_n(&w.started, __ATOMIC_ACQUIRE))
            ;
        long calls2 = 0;
        for (long j = 0; j < r; j++) {
            void *h2 = open_or_die(lib2);
            work_fn work2 = (work_fn)dlsym(h2, "dl2_work");
            work2(1000 + j);
            calls2++;
            dlclose(h2);
        }
        __atomic_store_n(&w.stop, 1, __ATOMIC_RELEASE);
        pthread_join(t, NULL);
        printf("thread_calls=%ld lib2_loads=%ld lib2_calls=%ld\n", w.calls, r, calls2);
        dlclose(h);
        return 0;
    }
    if (argc == 4 && !strcmp(argv[1], "dlmopen")) {
        long n = atol(argv[3]);
        void *h = dlmopen(LM_ID_NEWLM, argv[2], RTLD_NOW);
        if (!h) {
            fprintf(stderr, "dlmopen: %s\n", dlerror());
            return 2;
        }
        work_fn work = (work_fn)dlsym(h, "dl_work");
        long (*ctor_calls)(void) = (long (*)(void))dlsym(h, "dl_ctor_calls");
        for (long i = 0; i < n; i++)
            work(300 + i);
        printf("dlmopen ctor_calls=%ld calls=%ld\n", ctor_calls(), n);
        dlclose(h);
        return 0;
    }
    fprintf(stderr, "usage: dlopen_main cycle LIB N M | threads LIB LIB2 K R | dlmopen LIB N\n");
    return 2;
}
