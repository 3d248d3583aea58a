// SIGPROF handler inspects interrupted RIP: it must lie within hot() or main() (the loop makes no calls)
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <ucontext.h>
#include <unistd.h>
static volatile long samples, outside, inhot;
static volatile unsigned long first_out;
__attribute__((noinline)) long hot(long x) {
    long r = x;
    for (int i = 0; i < 50; i++) { r = r * 31 + i; __asm__ volatile("" ::: "memory"); }
    return r;
}
__attribute__((noinline)) void hot_end_marker(void) { __asm__ volatile(""); }
int main(int, char **);
static void on_prof(int sig, siginfo_t *si, void *uc_) {
    ucontext_t *uc = uc_;
    unsigned long rip = uc->uc_mcontext.gregs[REG_RIP];
    samples++;
    if (rip >= (unsigned long)hot && rip < (unsigned long)hot + 0x60) inhot++;
    else if (rip >= (unsigned long)main && rip < (unsigned long)main + 0x200) ;
    else { if (!outside) first_out = rip; outside++; }
}
int main(int argc, char **argv) {
    long iters = argc > 1 ? atol(argv[1]) : 20000000;
    struct sigaction sa; memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_prof; sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigaction(SIGPROF, &sa, 0);
    struct itimerval it = {{0, 200}, {0, 200}};
    setitimer(ITIMER_PROF, &it, 0);
    volatile long acc = 0;
    for (long i = 0; i < iters; i++) acc += hot(i);
    it.it_value.tv_usec = 0; it.it_interval.tv_usec = 0; setitimer(ITIMER_PROF, &it, 0);
    printf("outside=%ld\n", outside);
    if (outside) { char c[96]; snprintf(c, sizeof c, "grep r-xp /proc/%d/maps >&2", (int)getpid()); system(c); }
    fprintf(stderr, "samples=%ld inhot=%ld first_out=%#lx hot=%p main=%p\n", samples, inhot, first_out, (void*)hot, (void*)main);
    return outside != 0;
}
