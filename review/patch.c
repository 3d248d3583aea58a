#include <stdio.h>
#include <stdlib.h>
#include <pthread.h>
static long cnt;
__attribute__((noinline)) long pf(long a, long b) { cnt++; return a * b + (a >> 2); }
__attribute__((noinline)) long pg2(const char *s) { long n = 0; while (*s) n += *s++; return n; }
static void *thr(void *a) { long s = 0; for (long i = 0; i < 200000; i++) s += pf(i, 3) + pg2("hello"); return (void *)s; }
int main(void) {
    pthread_t t[3]; for (int i = 0; i < 3; i++) pthread_create(&t[i], 0, thr, 0);
    long s = 0; void *r; for (int i = 0; i < 3; i++) { pthread_join(t[i], &r); s += (long)r; }
    printf("s=%ld\n", s); fprintf(stderr, "pf calls=%ld (racy)\n", cnt);
    return 0;
}
