// SIGALRM (setitimer) handler siglongjmps out of a probed hot loop; handler also inspects context
#define _GNU_SOURCE
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/time.h>
#include <ucontext.h>
#include <string.h>
static sigjmp_buf jb;
static volatile long inloop, jumps, hot_calls, ripbad;
extern char hot_begin[], hot_end[];
__attribute__((noinline)) long hot(long x) {
    hot_calls++;
    long r = x;
    for (int i = 0; i < 50; i++) r = r * 31 + i;
    return r;
}
static void on_alrm(int sig, siginfo_t *si, void *uc_) {
    ucontext_t *uc = uc_;
    unsigned long rip = uc->uc_mcontext.gregs[REG_RIP];
    // the interrupted rip must be in the program's text or libc, never a weird place: record if it's in hot() range?
    (void)rip;
    if (++jumps < 200) siglongjmp(jb, 1);
}
int main(void) {
    struct sigaction sa; memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_alrm; sa.sa_flags = SA_SIGINFO; sigemptyset(&sa.sa_mask);
    sigaction(SIGALRM, &sa, 0);
    struct itimerval it = {{0, 1000}, {0, 1000}};
    setitimer(ITIMER_REAL, &it, 0);
    volatile long acc = 0;
    sigsetjmp(jb, 1);
    while (jumps < 200) acc += hot(acc);
    it.it_value.tv_usec = 0; it.it_interval.tv_usec = 0; setitimer(ITIMER_REAL, &it, 0);
    printf("jumps=%ld\n", jumps);
    fprintf(stderr, "hot_calls=%ld\n", hot_calls);
    return 0;
}
