// noreturn N (-fpatchable-function-entry=5): main calls work(N), then ends with a call to
// finish(), a noreturn function that prints "noreturn=<work(N)>" and exits 0. The call to
// finish is main's last instruction, so finish's return address is one past main's end.
#include <stdio.h>
#include <stdlib.h>

__attribute__((noinline)) long work(long n)
{
    asm volatile("");
    return 3 * n + 1;
}

__attribute__((noinline, noreturn)) void finish(long v)
{
    printf("noreturn=%ld\n", v);
    exit(0);
}

int main(int argc, char **argv)
{
    finish(work(argc > 1 ? atol(argv[1]) : 1));
}
