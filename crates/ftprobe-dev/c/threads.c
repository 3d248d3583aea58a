/* threads [N]: 4 threads, thread t calls work(i, t) for i in 0..N (default N = 1000), all
 * starting together behind a barrier; prints "total=<6 N^2>" (sum of 3i + t). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "work.c"

#define NTHREADS 4

static long iterations;
static pthread_barrier_t start;

struct job {
    long t;
    long sum;
};

__attribute__((noinline)) static void *thread_main(void *arg)
{
    struct job *job = arg;
    pthread_barrier_wait(&start);
    for (long i = 0; i < iterations; i++)
        job->sum += work(i, job->t);
    return NULL;
}

int main(int argc, char **argv)
{
    pthread_t tids[NTHREADS];
    struct job jobs[NTHREADS];
    long total = 0;

    iterations = argc > 1 ? atol(argv[1]) : 1000;
    pthread_barrier_init(&start, NULL, NTHREADS);
    for (long t = 0; t < NTHREADS; t++) {
        jobs[t].t = t;
        jobs[t].sum = 0;
        if (pthread_create(&tids[t], NULL, thread_main, &jobs[t]) != 0) {
            fprintf(stderr, "pthread_create failed\n");
            return 1;
        }
    }
    for (long t = 0; t < NTHREADS; t++) {
        pthread_join(tids[t], NULL);
        total += jobs[t].sum;
    }
    printf("total=%ld\n", total);
    return 0;
}
