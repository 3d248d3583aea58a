/* churn WAVES PER GAP_MS ITERS [together]: thread churn. WAVES waves, each creating PER
 * threads and joining them, GAP_MS ms apart (0: none); each thread calls churn_mid ITERS
 * times, and churn_mid calls churn_leaf 3 times. `together`: the threads of a wave wait
 * for each other (a barrier) after their first event, so that PER of them are alive at
 * once; without it a wave's threads overlap as they happen to. Traced functions (patchable
 * entries): churn_worker, churn_mid, churn_leaf; main calls none.
 * Each thread prints "tid=<its tid> calls=<its traced calls>" as it ends; main, after the
 * last join, prints "workers=<W> mid=<M> leaf=<L>" (counted by the functions themselves). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static long iters;
static int together;
static pthread_barrier_t barrier;
static long n_workers, n_mid, n_leaf;
static __thread long my_calls;

__attribute__((noinline)) int churn_leaf(int x)
{
    __atomic_add_fetch(&n_leaf, 1, __ATOMIC_RELAXED);
    my_calls++;
    return x * 2 + 1;
}

__attribute__((noinline)) int churn_mid(int x)
{
    int s = 0;
    __atomic_add_fetch(&n_mid, 1, __ATOMIC_RELAXED);
    my_calls++;
    for (int i = 0; i < 3; i++)
        s += churn_leaf(x + i);
    return s;
}

__attribute__((noinline)) void *churn_worker(void *arg)
{
    long s = (long)arg;
    __atomic_add_fetch(&n_workers, 1, __ATOMIC_RELAXED);
    my_calls++;
    if (together)
        pthread_barrier_wait(&barrier);
    for (long i = 0; i < iters; i++)
        s += churn_mid((int)i);
    /* One write(2) per line: lines of threads do not mix. */
    char line[64];
    int n = snprintf(line, sizeof line, "tid=%d calls=%ld\n", gettid(), my_calls);
    if (write(1, line, n) != n)
        abort();
    return (void *)s;
}

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: churn WAVES PER GAP_MS ITERS [together]\n");
        return 2;
    }
    long waves = atol(argv[1]), per = atol(argv[2]), gap_ms = atol(argv[3]);
    iters = atol(argv[4]);
    together = argc > 5 && strcmp(argv[5], "together") == 0;
    if (per < 1 || per > 1024)
        return 2;
    if (together)
        pthread_barrier_init(&barrier, NULL, (unsigned)per);
    pthread_t t[1024];
    for (long w = 0; w < waves; w++) {
        for (long i = 0; i < per; i++)
            if (pthread_create(&t[i], NULL, churn_worker, (void *)i) != 0)
                abort();
        for (long i = 0; i < per; i++)
            pthread_join(t[i], NULL);
        if (gap_ms)
            usleep(gap_ms * 1000);
    }
    printf("workers=%ld mid=%ld leaf=%ld\n", n_workers, n_mid, n_leaf);
    return 0;
}
