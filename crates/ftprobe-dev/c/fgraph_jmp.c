/* longjmp, siglongjmp from a signal handler, _longjmp and (built with _FORTIFY_SOURCE)
 * __longjmp_chk over hooked frames (fgraph, issue 11). The program keeps its own call tree
 * and prints it at the end: `E depth name` for every entry of a function with a site, in
 * order, and `J n` for each jump, n the calls it cut off. */

#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int depth;
static char logbuf[1 << 16];
static size_t loglen;

__attribute__((no_instrument_function)) static void note(const char *fmt, int a, const char *s)
{
    loglen += snprintf(logbuf + loglen, sizeof logbuf - loglen, fmt, a, s);
}

#define ENTER() (note("E %d %s\n", depth, __func__), depth++)
#define LEAVE() (depth--)
#define SITE __attribute__((noinline))

static jmp_buf env;
static sigjmp_buf senv;

SITE void down(int n, int how)
{
    ENTER();
    if (n == 0) {
        if (how == 0)
            longjmp(env, 1);
        else
            _longjmp(env, 1);
    }
    down(n - 1, how);
    LEAVE();
}

SITE int leaf(int x)
{
    ENTER();
    LEAVE();
    return x + 1;
}

SITE void handler(int sig)
{
    ENTER();
    leaf(sig);
    siglongjmp(senv, 1);
}

SITE void spin(int n)
{
    ENTER();
    if (n == 0)
        raise(SIGUSR1);
    else
        spin(n - 1);
    LEAVE();
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 3;
    signal(SIGUSR1, handler);
    long sum = 0;
    for (int i = 0; i < n; i++) {
        for (int how = 0; how < 2; how++) {
            int d = depth;
            if (setjmp(env) == 0) {
                down(i + 1, how);
            } else {
                note("J %d%s\n", depth - d, "");
                depth = d;
            }
            sum += leaf(i);
        }
        int d = depth;
        if (sigsetjmp(senv, 1) == 0) {
            spin(i);
        } else {
            note("J %d%s\n", depth - d, "");
            depth = d;
        }
    }
    printf("sum=%ld\n%s", sum, logbuf);
    return 0;
}
