/* libfxctors: a library whose constructor calls lib_traced twice and whose destructor calls
 * it three times; the program calls it once (ctors.c). Each call is counted here, and the
 * destructor writes the final count to stderr with write(2) (stdio may be gone by then). */
#include <pthread.h>
#include <string.h>
#include <unistd.h>

static volatile long calls;

__attribute__((noinline)) long lib_traced(long x)
{
    calls++;
    return x + 1;
}

long lib_calls(void) { return calls; }

/* A thread the constructor starts, already running when main starts: thread_work 4 times. */
static pthread_t worker;
static volatile long thread_calls;

__attribute__((noinline)) long thread_work(long x)
{
    thread_calls++;
    return x * 2;
}

static void *worker_main(void *arg)
{
    (void)arg;
    for (long i = 0; i < 4; i++)
        thread_work(i);
    return NULL;
}

/* main joins the constructor's thread: returns thread_work's count. */
long lib_join(void)
{
    pthread_join(worker, NULL);
    return thread_calls;
}

__attribute__((constructor)) static void lib_init(void)
{
    lib_traced(1);
    lib_traced(2);
    pthread_create(&worker, NULL, worker_main, NULL);
}

__attribute__((destructor)) static void lib_fini(void)
{
    lib_traced(3);
    lib_traced(4);
    lib_traced(5);
    char buf[32] = "lib_traced calls=";
    size_t n = strlen(buf);
    buf[n++] = '0' + (char)calls;
    buf[n++] = '\n';
    write(2, buf, n);
}
