// long-running: threads loop over work() with nanosleep/poll/read; prints own counts on SIGUSR1-less exit after SECS
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <string.h>
#include <errno.h>
static volatile long cnt[4]; static volatile int stop;
static long errs;
__attribute__((noinline)) long work(long x, const char *s) { return x + (long)strlen(s); }
static void *thr(void *a) {
    long id = (long)a; long s = 0;
    while (!stop) {
        for (int i = 0; i < 1000; i++) { s += work(i, "abc"); cnt[id]++; }
        struct timespec ts = {0, 1000000};
        if (nanosleep(&ts, 0)) __atomic_add_fetch(&errs, 1, __ATOMIC_RELAXED);
    }
    return (void *)s;
}
int main(int argc, char **argv) {
    int secs = argc > 1 ? atoi(argv[1]) : 5;
    pthread_t t[4]; for (long i = 0; i < 4; i++) pthread_create(&t[i], 0, thr, (void *)i);
    sleep(secs); stop = 1;
    long tot = 0; for (int i = 0; i < 4; i++) { pthread_join(t[i], 0); tot += cnt[i]; }
    printf("done errs=%ld\n", errs); fprintf(stderr, "work calls=%ld\n", tot);
    return 0;
}
