// multithreaded: each thread calls work() N times; program prints its own count
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static long counts[8];
static long sinks[8];
__attribute__((noinline)) long work(long x, const char *s) {
    long r = 0;
    for (int i = 0; i < (int)(x & 7); i++) r += s[i % 4] * i;
    if (x & 1) r ^= 0x55; else r += 3;
    switch (x % 5) { case 0: r += 1; break; case 1: r *= 3; break; case 2: r -= 7; break; case 3: r <<= 1; break; default: r >>= 1; }
    return r;
}
static void *thr(void *a) {
    long id = (long)a; long n = atol(getenv("N") ? getenv("N") : "100000");
    for (long i = 0; i < n; i++) { sinks[id] += work(i, "abcd"); counts[id]++; }
    return 0;
}
int main(int argc, char **argv) {
    int nt = argc > 1 ? atoi(argv[1]) : 4;
    pthread_t t[8];
    for (long i = 0; i < nt; i++) pthread_create(&t[i], 0, thr, (void *)i);
    long tot = 0, sink = 0;
    for (int i = 0; i < nt; i++) { pthread_join(t[i], 0); tot += counts[i]; sink += sinks[i]; }
    printf("calls=%ld sink=%ld\n", tot, sink);
    return 0;
}
