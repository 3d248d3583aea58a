// threads with PTHREAD_CANCEL_ASYNCHRONOUS in a loop over a probed function, cancelled at random;
// then the main thread calls the function a known number of times
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>
static volatile long calls;
__attribute__((noinline)) long hot(long x) { calls++; long r = x; for (int i = 0; i < 50; i++) r = r * 31 + i; return r; }
static void *thr(void *a) {
    pthread_setcanceltype(PTHREAD_CANCEL_ASYNCHRONOUS, 0);
    volatile long s = 0; for (;;) s += hot(s);
    return 0;
}
int main(void) {
    for (int k = 0; k < 20; k++) { pthread_t t; pthread_create(&t, 0, thr, 0); usleep(2000); pthread_cancel(t); pthread_join(t, 0); }
    long before = calls; volatile long s = 0;
    for (int i = 0; i < 100000; i++) s += hot(i);
    printf("main calls=%ld\n", calls - before);
    return 0;
}
