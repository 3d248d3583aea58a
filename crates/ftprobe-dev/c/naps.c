/* naps: calls that take known times, for `replay --min-duration` (sites by attribute only).
 * main calls outer() and then nap(10); outer() calls quick(), nap(50), nap(1), quick();
 * nap(ms) calls quick() and then sleeps ms milliseconds (nanosleep, at least that long);
 * quick() only increments a counter (well under a microsecond). Prints `quick=N` (5). */
#include <stdio.h>
#include <time.h>

#define SITE __attribute__((noinline, patchable_function_entry(5, 0)))

static volatile unsigned long quicks;

SITE void quick(void)
{
    quicks++;
}

SITE void nap(unsigned ms)
{
    quick();
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
    while (nanosleep(&ts, &ts) != 0) {
    }
}

SITE void outer(void)
{
    quick();
    nap(50);
    nap(1);
    quick();
}

int main(void)
{
    outer();
    nap(10);
    printf("quick=%lu\n", quicks);
    return 0;
}
