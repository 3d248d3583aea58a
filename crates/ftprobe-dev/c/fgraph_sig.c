/* Signal handlers that call hooked functions, at depth (fgraph, issue 11): a timer signal
 * (setitimer) interrupts a deep recursion of hooked calls; its handler, a hooked function,
 * recurses too and raises a second signal whose handler calls hooked functions; in some
 * rounds the handler runs on the signal stack (SA_ONSTACK), in others it leaves by
 * siglongjmp, cutting off the recursion and itself. The program keeps its own call tree and
 * prints it at the end: `E depth name` for every entry of a function with a site, in
 * order, `L name` for every call a siglongjmp cut off (deepest first). */

#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

/* Sites by attribute only. */
#define SITE __attribute__((noinline, patchable_function_entry(5, 0)))

/* The events, appended from handlers too (a slot is reserved before it is filled). */
static struct ev {
    char kind;
    int depth;
    const char *name;
} evs[1 << 14];
static int nev;
static const char *names[2048];
static volatile int depth;
static volatile sig_atomic_t fired;
static sigjmp_buf env;
static int jump;

static void ev(char kind, int d, const char *name)
{
    int i = __atomic_fetch_add(&nev, 1, __ATOMIC_SEQ_CST);
    evs[i] = (struct ev){kind, d, name};
}

#define ENTER() (ev('E', depth, __func__), names[depth] = __func__, depth++)
#define LEAVE() (depth--)

SITE int leaf(int x)
{
    ENTER();
    LEAVE();
    return x + 1;
}

SITE void on_usr1(int sig)
{
    ENTER();
    leaf(sig);
    LEAVE();
}

SITE int h_rec(int n)
{
    ENTER();
    int r = n == 0 ? (raise(SIGUSR1), leaf(n)) : h_rec(n - 1) + 1;
    LEAVE();
    return r;
}

SITE void on_alarm(int sig)
{
    ENTER();
    h_rec(3);
    fired = 1;
    if (jump)
        siglongjmp(env, 1);
    LEAVE();
    (void)sig;
}

SITE void spin(void)
{
    ENTER();
    struct itimerval it = {{0, 0}, {0, 2000}};
    setitimer(ITIMER_REAL, &it, NULL);
    while (!fired)
        ;
    leaf(0);
    LEAVE();
}

SITE int rec(int n)
{
    ENTER();
    int r = n == 0 ? (spin(), 0) : rec(n - 1) + 1;
    LEAVE();
    return r;
}

int main(int argc, char **argv)
{
    int scale = argc > 1 ? atoi(argv[1]) : 1;
    static char altstack[1 << 16];
    stack_t ss = {.ss_sp = altstack, .ss_size = sizeof altstack};
    sigaltstack(&ss, NULL);
    signal(SIGUSR1, on_usr1);
    static const struct {
        int depth, onstack, jump;
    } rounds[] = {{200, 0, 0}, {500, 1, 0}, {100, 0, 1}, {150, 1, 1}};
    long sum = 0;
    for (unsigned i = 0; i < sizeof rounds / sizeof rounds[0]; i++) {
        struct sigaction sa = {.sa_handler = on_alarm};
        sa.sa_flags = rounds[i].onstack ? SA_ONSTACK : 0;
        sigaction(SIGALRM, &sa, NULL);
        fired = 0;
        jump = rounds[i].jump;
        int d = depth;
        if (sigsetjmp(env, 1) == 0) {
            sum += rec(rounds[i].depth * scale);
        } else {
            while (depth > d)
                ev('L', -1, names[--depth]);
        }
    }
    printf("sum=%ld\n", sum);
    for (int i = 0; i < nev; i++) {
        if (evs[i].kind == 'E')
            printf("E %d %s\n", evs[i].depth, evs[i].name);
        else
            printf("L %s\n", evs[i].name);
    }
    return 0;
}
