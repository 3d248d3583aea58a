/* report_tree: a known call tree for `ftprobe report` and `ftprobe dump` (sites by attribute
 * only). The main thread calls a(i) for i = 0, 1, 2; a(x) calls b(x) and b(x + 7); b(x)
 * calls c(x) and c(3 x + 1); every function spins a little on its own. Then a thread named
 * "worker" calls a(100) once. Each thread counts its own calls and prints them, then every
 * argument c was called with: `T name a=A b=B c=C` per thread, then `C x` per call of c. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>

#define SITE __attribute__((noinline, patchable_function_entry(5, 0)))

static __thread int na, nb, nc;
static volatile unsigned long sink;
static unsigned cargs[64];
static int ncargs;

static void spin(unsigned n)
{
    for (unsigned i = 0; i < n; i++)
        sink += i;
}

SITE void c(unsigned x)
{
    nc++;
    cargs[ncargs++] = x;
    spin(2000);
}

SITE void b(unsigned x)
{
    nb++;
    spin(1000);
    c(x);
    c(3 * x + 1);
}

SITE void a(unsigned x)
{
    na++;
    spin(500);
    b(x);
    b(x + 7);
}

static void report(const char *name)
{
    printf("T %s a=%d b=%d c=%d\n", name, na, nb, nc);
}

static void *worker(void *arg)
{
    (void)arg;
    a(100);
    report("worker");
    return NULL;
}

int main(void)
{
    for (unsigned i = 0; i < 3; i++)
        a(i);
    report("main");
    /* The thread is named "worker" from its start: it inherits the name main has when it
     * creates it (a thread's ring keeps the name the thread had when it claimed it). */
    pthread_t t;
    pthread_setname_np(pthread_self(), "worker");
    pthread_create(&t, NULL, worker, NULL);
    pthread_setname_np(pthread_self(), "report_tree");
    pthread_join(t, NULL);
    for (int i = 0; i < ncargs; i++)
        printf("C %u\n", cargs[i]);
    return 0;
}
