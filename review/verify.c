// long-running: 3 threads call work() (same as mt_loop's) and check each result against a table
// computed before the threads start; prints mismatches at the end (SECS seconds)
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <signal.h>
static volatile int term;
static void on_term(int s) { (void)s; term = 1; }
static long table[4096]; static volatile int stop; static long bad, calls[3];
__attribute__((noinline)) long work(long x, const char *s) {
    long r = 0;
    for (int i = 0; i < (int)(x & 7); i++) r += s[i % 4] * i;
    if (x & 1) r ^= 0x55; else r += 3;
    switch (x % 5) { case 0: r += 1; break; case 1: r *= 3; break; case 2: r -= 7; break; case 3: r <<= 1; break; default: r >>= 1; }
    return r;
}
static void *thr(void *a) {
    long id = (long)a; sigset_t m; sigemptyset(&m); sigaddset(&m, SIGTERM); pthread_sigmask(SIG_BLOCK, &m, 0);
    while (!stop) for (long i = 0; i < 4096; i++) { if (work(i, "abcd") != table[i]) __atomic_add_fetch(&bad, 1, __ATOMIC_RELAXED); calls[id]++; }
    return 0;
}
int main(int argc, char **argv) {
    signal(SIGTERM, on_term);
    for (long i = 0; i < 4096; i++) table[i] = work(i, "abcd");
    pthread_t t[3]; for (long i = 0; i < 3; i++) pthread_create(&t[i], 0, thr, (void *)i);
    for (int s = argc > 1 ? atoi(argv[1]) : 10; s > 0 && !bad && !term; s--) sleep(1); stop = 1;
    for (int i = 0; i < 3; i++) pthread_join(t[i], 0);
    printf("bad=%ld\n", bad); fprintf(stderr, "calls=%ld\n", calls[0] + calls[1] + calls[2]);
    return bad != 0;
}
