// plain longjmp (no signals) out of a function that has a return probe: every 100th call of
// leaf() longjmps out through mid(); the program counts mid()'s calls and returns itself
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
static jmp_buf jb; static long mid_calls, mid_returns, jumps, leaf_calls;
__attribute__((noinline)) long leaf(long x) { leaf_calls++; if (x % 100 == 99) longjmp(jb, 1); return x + 1; }
__attribute__((noinline)) long mid(long x) { mid_calls++; long r = leaf(x) * 2; __asm__ volatile(""); return r; }
int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 100000; volatile long i = 0; long acc = 0;
    if (setjmp(jb)) { jumps++; i++; }
    for (; i < n; i++) { acc += mid(i); mid_returns++; }
    printf("acc=%ld mid_calls=%ld mid_returns=%ld jumps=%ld leaf_calls=%ld\n", acc, mid_calls, mid_returns, jumps, leaf_calls);
    return 0;
}
