// faults in a probed instruction: the handler checks si_addr and that RIP is touch()'s load
#define _GNU_SOURCE
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <ucontext.h>
static sigjmp_buf jb; static volatile long segv, badrip, badaddr;
__attribute__((noinline)) long touch(volatile long *p) { return *p + 1; }
static void on_segv(int s, siginfo_t *si, void *uc_) {
    ucontext_t *uc = uc_; unsigned long rip = uc->uc_mcontext.gregs[REG_RIP];
    segv++;
    if (rip != (unsigned long)touch) badrip++;
    if ((unsigned long)si->si_addr != (unsigned long)uc->uc_mcontext.gregs[REG_RDI]) badaddr++;
    siglongjmp(jb, 1);
}
int main(void) {
    struct sigaction sa; memset(&sa, 0, sizeof sa); sa.sa_sigaction = on_segv; sa.sa_flags = SA_SIGINFO;
    sigaction(SIGSEGV, &sa, 0);
    long s = 0, good = 42;
    for (int i = 0; i < 2000; i++) { if (!sigsetjmp(jb, 1)) s += touch(i & 1 ? &good : (long *)(long)(i * 8)); }
    printf("s=%ld segv=%ld badrip=%ld badaddr=%ld\n", s, segv, badrip, badaddr);
    return 0;
}
