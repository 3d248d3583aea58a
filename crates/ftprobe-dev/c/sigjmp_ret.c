/* A timer signal's handler leaves by siglongjmp while the thread may be inside a return
 * hook (review 14, F1): `hot` is called in a tight loop, so a good part of the time goes to
 * its return through ftprobe when it has a return probe; SIGALRM comes every 500 us and its
 * handler `on_alrm` jumps back to the loop's start, JUMPS times (the last one returns). No
 * site flags: probes on `hot` and `on_alrm` are int3 (or optimized) probes. Prints
 * `hot_calls=C returned=R jumps=J handler_calls=H`: C calls of `hot`, R of them seen back
 * in the loop (a jump can cut off a call before or after its return: R <= returns <= C,
 * C - R <= J). */

#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

static sigjmp_buf env;
static volatile long hot_calls, returned, jumps, handler_calls;
static long max_jumps = 200;

__attribute__((noinline)) long hot(long x)
{
    hot_calls++;
    long r = x;
    for (int i = 0; i < 40; i++)
        r = r * 33 + i;
    return r;
}

__attribute__((noinline)) static void on_alrm(int sig)
{
    (void)sig;
    handler_calls++;
    if (++jumps < max_jumps)
        siglongjmp(env, 1);
}

int main(int argc, char **argv)
{
    if (argc > 1)
        max_jumps = atol(argv[1]);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alrm;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval it = {{0, 500}, {0, 500}};
    setitimer(ITIMER_REAL, &it, NULL);
    volatile long acc = 0;
    sigsetjmp(env, 1);
    while (jumps < max_jumps) {
        acc += hot(acc);
        returned++;
    }
    memset(&it, 0, sizeof it);
    setitimer(ITIMER_REAL, &it, NULL);
    printf("hot_calls=%ld returned=%ld jumps=%ld handler_calls=%ld\n", hot_calls, returned,
           jumps, handler_calls);
    return 0;
}
