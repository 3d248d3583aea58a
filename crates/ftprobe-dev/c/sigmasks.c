/* sigmasks VARIANT [N]: a SIGUSR1 handler, on_usr1, runs N times (default 5) under a signal
 * mask that holds SIGTRAP, or after the program blocked SIGTRAP another way; it and main call
 * write (to /dev/null) a known number of times. Built with no site flags: a probe on on_usr1
 * is an int3 probe. VARIANT:
 *   fill     sigaction with sigfillset(sa_mask)
 *   trap     sigaction with only SIGTRAP in sa_mask
 *   jmp      SIGTRAP blocked (raw syscall) while sigsetjmp saves the mask, then unblocked;
 *            siglongjmp restores the saved mask
 *   swapctx  swapcontext to a context whose uc_sigmask holds SIGTRAP
 *   setctx   setcontext back to main's context, with SIGTRAP added to its uc_sigmask
 *   sigset   sigset(SIGUSR1, on_usr1), sigset(SIGTRAP, SIG_HOLD), sighold(SIGTRAP)
 *   signal   signal(SIGUSR1, on_usr1), sysv_signal(SIGTRAP, SIG_IGN), sigignore(SIGTRAP),
 *            sigblock(sigmask(SIGTRAP)); after the work, raise(SIGTRAP), which it ignores
 *   suspend  SIGUSR1 pending, then sigsuspend with every signal but SIGUSR1 blocked
 *   ppoll    the same with ppoll
 *   pselect  the same with pselect
 *   epoll    the same with epoll_pwait
 *   early    SIGUSR2, whose action libsigearly.so's constructor installed with every signal
 *            in its mask before the agent started; its handler calls on_usr1
 *   thread   a thread created with pthread_attr_setsigmask_np(every signal), which unblocks
 *            SIGUSR1 and sends it to itself
 *   raw      blocks SIGTRAP with a raw rt_sigprocmask syscall, then calls write: a trap that
 *            nobody can take (the kernel kills the program with SIGTRAP)
 *   selftrap the handler as in trap, then raise(SIGTRAP) with SIGTRAP's default action: the
 *            program kills itself
 * Each variant (but raw and selftrap) prints "VARIANT handled=H writes=W trap_in_sa_mask=T":
 * H runs of on_usr1, W calls of write (this line's own included), T whether the SIGUSR1 (early:
 * SIGUSR2) action that sigaction reads back has SIGTRAP in its mask. */
#define _GNU_SOURCE
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

static volatile sig_atomic_t handled, writes;
static int devnull, n = 5, usr = SIGUSR1;
extern void (*volatile sigearly_hook)(int); /* libsigearly.so */

static void out(int fd, const char *s, size_t len)
{
    writes++;
    if (write(fd, s, len) != (ssize_t)len)
        _exit(3);
}

__attribute__((noinline)) void on_usr1(int sig)
{
    (void)sig;
    handled++;
    out(devnull, "h", 1);
}

/* SIGUSR1 (or usr) to this thread, N times, one write each. */
static void signals(void)
{
    for (int i = 0; i < n; i++) {
        pthread_kill(pthread_self(), usr);
        out(devnull, "m", 1);
    }
}

static void install(int sig, void (*h)(int), int fill, int trap)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = h;
    sigemptyset(&sa.sa_mask);
    if (fill)
        sigfillset(&sa.sa_mask);
    if (trap)
        sigaddset(&sa.sa_mask, SIGTRAP);
    if (sigaction(sig, &sa, 0))
        _exit(4);
}

/* rt_sigprocmask as a raw system call: past any interposer. */
static void raw_mask(int how, int sig)
{
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, sig);
    syscall(SYS_rt_sigprocmask, how, &s, 0, 8);
}

/* SIGUSR1 pending N times, each taken while `wait` runs with every other signal blocked. */
static void pending_under(void (*wait)(const sigset_t *))
{
    sigset_t usr1, all_but;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    sigprocmask(SIG_BLOCK, &usr1, 0);
    sigfillset(&all_but);
    sigdelset(&all_but, SIGUSR1);
    for (int i = 0; i < n; i++) {
        pthread_kill(pthread_self(), SIGUSR1);
        wait(&all_but);
        out(devnull, "m", 1);
    }
}

static void wait_suspend(const sigset_t *m)
{
    sigsuspend(m);
}

static void wait_ppoll(const sigset_t *m)
{
    struct timespec ts = {1, 0};
    ppoll(0, 0, &ts, m);
}

static void wait_pselect(const sigset_t *m)
{
    struct timespec ts = {1, 0};
    pselect(0, 0, 0, 0, &ts, m);
}

static int epfd;
static void wait_epoll(const sigset_t *m)
{
    struct epoll_event ev;
    epoll_pwait(epfd, &ev, 1, 1000, m);
}

static ucontext_t main_uc, side_uc;
static char side_stack[256 << 10];
static void side(void)
{
    signals();
}
static void side_back(void)
{
    sigaddset(&main_uc.uc_sigmask, SIGTRAP);
    setcontext(&main_uc);
}

static void *thread_main(void *arg)
{
    (void)arg;
    sigset_t usr1;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    pthread_sigmask(SIG_UNBLOCK, &usr1, 0);
    signals();
    return 0;
}

int main(int argc, char **argv)
{
    const char *v = argc > 1 ? argv[1] : "fill";
    if (argc > 2)
        n = atoi(argv[2]);
    devnull = open("/dev/null", O_WRONLY);
    if (!strcmp(v, "fill") || !strcmp(v, "trap")) {
        install(SIGUSR1, on_usr1, !strcmp(v, "fill"), 1);
        signals();
    } else if (!strcmp(v, "jmp")) {
        static sigjmp_buf env;
        install(SIGUSR1, on_usr1, 0, 0);
        raw_mask(SIG_BLOCK, SIGTRAP);
        if (sigsetjmp(env, 1) == 0) {
            raw_mask(SIG_UNBLOCK, SIGTRAP);
            siglongjmp(env, 1);
        }
        signals();
    } else if (!strcmp(v, "swapctx") || !strcmp(v, "setctx")) {
        install(SIGUSR1, on_usr1, 0, 0);
        getcontext(&side_uc);
        side_uc.uc_stack.ss_sp = side_stack;
        side_uc.uc_stack.ss_size = sizeof side_stack;
        side_uc.uc_link = &main_uc;
        if (!strcmp(v, "swapctx")) {
            sigaddset(&side_uc.uc_sigmask, SIGTRAP);
            makecontext(&side_uc, side, 0);
            swapcontext(&main_uc, &side_uc);
        } else {
            makecontext(&side_uc, side_back, 0);
            swapcontext(&main_uc, &side_uc);
            signals();
        }
    } else if (!strcmp(v, "sigset")) {
        sigset(SIGUSR1, on_usr1);
        sigset(SIGTRAP, SIG_HOLD);
        sighold(SIGTRAP);
        signals();
    } else if (!strcmp(v, "signal")) {
        signal(SIGUSR1, on_usr1);
        sysv_signal(SIGTRAP, SIG_IGN);
        sigignore(SIGTRAP);
        sigblock(1 << (SIGTRAP - 1)); /* sigmask(SIGTRAP) */
        signals();
        raise(SIGTRAP); /* ignored */
    } else if (!strcmp(v, "suspend") || !strcmp(v, "ppoll") || !strcmp(v, "pselect") ||
               !strcmp(v, "epoll")) {
        install(SIGUSR1, on_usr1, 0, 0);
        epfd = epoll_create1(0);
        pending_under(!strcmp(v, "suspend") ? wait_suspend
                      : !strcmp(v, "ppoll") ? wait_ppoll
                      : !strcmp(v, "pselect") ? wait_pselect
                                              : wait_epoll);
    } else if (!strcmp(v, "thread")) {
        pthread_attr_t a;
        pthread_t t;
        sigset_t all;
        install(SIGUSR1, on_usr1, 0, 0);
        sigfillset(&all);
        pthread_attr_init(&a);
        pthread_attr_setsigmask_np(&a, &all);
        pthread_create(&t, &a, thread_main, 0);
        pthread_join(t, 0);
    } else if (!strcmp(v, "early")) {
        usr = SIGUSR2;
        sigearly_hook = on_usr1;
        signals();
    } else if (!strcmp(v, "selftrap")) {
        install(SIGUSR1, on_usr1, 0, 1);
        signals();
        raise(SIGTRAP);
    } else if (!strcmp(v, "raw")) {
        install(SIGUSR1, on_usr1, 0, 0);
        raw_mask(SIG_BLOCK, SIGTRAP);
        signals();
    } else {
        return 2;
    }
    /* The action as sigaction reads it back: SIGTRAP in its mask as installed? */
    struct sigaction now;
    sigaction(usr, 0, &now);
    char buf[128];
    writes++;
    int len = snprintf(buf, sizeof buf, "%s handled=%d writes=%d trap_in_sa_mask=%d\n", v,
                       (int)handled, (int)writes, sigismember(&now.sa_mask, SIGTRAP));
    return write(1, buf, len) == len ? 0 : 1;
}
