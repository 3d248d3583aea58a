// threads with sigaltstacks; SIGUSR1 handlers (SA_ONSTACK) call a probed function; own SIGTRAP handler; raise(SIGTRAP)
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
static long in_handler, traps, calls;
__attribute__((noinline)) long probed(const char *s, long n) { __atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED); return n + s[0]; }
static void on_usr1(int s) { char buf[8] = "sig"; probed(buf, 1); __atomic_add_fetch(&in_handler, 1, __ATOMIC_RELAXED); }
static void on_trap(int s) { __atomic_add_fetch(&traps, 1, __ATOMIC_RELAXED); }
static volatile int stop;
static void *thr(void *a) {
    stack_t ss = { .ss_sp = malloc(16384), .ss_size = 16384 }; sigaltstack(&ss, 0);
    long s = 0; while (!stop) s += probed("thread", 2);
    return (void *)s;
}
int main(void) {
    struct sigaction sa; memset(&sa, 0, sizeof sa); sa.sa_handler = on_usr1; sa.sa_flags = SA_ONSTACK | SA_RESTART; sigaction(SIGUSR1, &sa, 0);
    sa.sa_handler = on_trap; sa.sa_flags = 0; sigaction(SIGTRAP, &sa, 0);
    pthread_t t[3]; for (int i = 0; i < 3; i++) pthread_create(&t[i], 0, thr, 0);
    for (int k = 0; k < 300; k++) { for (int i = 0; i < 3; i++) pthread_kill(t[i], SIGUSR1); raise(SIGTRAP); usleep(200); }
    usleep(10000); stop = 1;
    for (int i = 0; i < 3; i++) pthread_join(t[i], 0);
    printf("in_handler=%ld traps=%ld\n", in_handler, traps); fprintf(stderr, "calls=%ld\n", calls);
    return 0;
}
