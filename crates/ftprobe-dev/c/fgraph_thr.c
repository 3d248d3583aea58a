/* pthread_exit and pthread_cancel inside hooked functions (fgraph, issue 11): glibc ends the
 * thread by a forced unwind (libgcc_s's _Unwind_ForcedUnwind, which a C program loads only
 * at that moment), running the cleanup handlers of the frames it removes; a handler calls a
 * traced function. Threads run one after the other. The program keeps each thread's call
 * tree and prints it at the end, per thread: `T name` first, then `E depth name` for every
 * entry of a function with a site, in order, and `U name` for every call the unwind cut off,
 * in the order their frames went (the ones under a cleanup handler's frame when the handler
 * runs, the rest when the thread is gone). */

#include <pthread.h>
#include <semaphore.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Sites by attribute only (the rest of the program, constprop clones included, has none). */
#define SITE __attribute__((noinline, patchable_function_entry(5, 0)))
#define NOTRACE

static char logbuf[1 << 16];
static size_t loglen;
/* The running thread's own stack of calls (threads run one at a time). */
static const char *names[64];
static int depth;
static sem_t ready, never;

NOTRACE static void line(const char *k, int d, const char *name)
{
    if (d >= 0)
        loglen += snprintf(logbuf + loglen, sizeof logbuf - loglen, "%s %d %s\n", k, d, name);
    else
        loglen += snprintf(logbuf + loglen, sizeof logbuf - loglen, "%s %s\n", k, name);
}

#define ENTER() (line("E", depth, __func__), names[depth++] = __func__)
#define LEAVE() (depth--)

/* The calls above depth d are gone. */
NOTRACE static void cut_to(int d)
{
    while (depth > d)
        line("U", -1, names[--depth]);
}

SITE int leaf(int x)
{
    ENTER();
    LEAVE();
    return x * 2;
}

SITE void on_cleanup(int d)
{
    ENTER();
    leaf(d);
    LEAVE();
}

NOTRACE static void cleanup_handler(void *arg)
{
    int d = (int)(long)arg;
    cut_to(d);
    on_cleanup(d);
}

SITE void bottom(int how)
{
    ENTER();
    leaf(how);
    if (how == 0)
        pthread_exit((void *)7);
    sem_post(&ready);
    /* A cancellation point that never returns on its own. */
    for (;;)
        sem_wait(&never);
}

SITE void work(int n, int how)
{
    ENTER();
    int d = depth;
    if (n == 0) {
        bottom(how);
    } else if (n == 2) {
        pthread_cleanup_push(cleanup_handler, (void *)(long)d);
        work(n - 1, how);
        pthread_cleanup_pop(0);
    } else {
        work(n - 1, how);
    }
    leaf(n);
    LEAVE();
}

SITE void *thread_exits(void *arg)
{
    ENTER();
    work((int)(long)arg, 0);
    LEAVE();
    return NULL;
}

SITE void *thread_cancelled(void *arg)
{
    ENTER();
    work((int)(long)arg, 1);
    LEAVE();
    return NULL;
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 4;
    sem_init(&ready, 0, 0);
    sem_init(&never, 0, 0);
    for (int i = 0; i < 2; i++) {
        pthread_t t;
        void *ret;
        depth = 0;
        line("T", -1, i == 0 ? "exits" : "cancelled");
        pthread_create(&t, NULL, i == 0 ? thread_exits : thread_cancelled, (void *)(long)n);
        if (i == 1) {
            sem_wait(&ready);
            pthread_cancel(t);
        }
        pthread_join(t, &ret);
        cut_to(0);
        if (ret != (i == 0 ? (void *)7 : PTHREAD_CANCELED))
            line("bad", -1, "return");
    }
    printf("%s", logbuf);
    return 0;
}
