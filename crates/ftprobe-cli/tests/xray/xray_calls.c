/* Counts its own calls and checks its own return addresses: built with clang
   -fxray-instrument -fxray-instruction-threshold=1 by crates/ftprobe-cli/tests/xray.rs. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <stdio.h>
#include <stdlib.h>

static long n_leaf, n_pair, n_fib, n_tailer, n_where;

/* The symbol holding `addr`, or "?" (the trampoline of a hijacked return is in no symbol of
   the program). */
static const char *sym(void *addr) {
    Dl_info info;
    return dladdr(addr, &info) && info.dli_sname ? info.dli_sname : "?";
}

__attribute__((noinline)) long leaf(long x) {
    n_leaf++;
    __asm__ volatile("" ::: "memory");
    return x + 1;
}

__attribute__((noinline)) long pair(long x) {
    n_pair++;
    return leaf(x) * leaf(x + 1);
}

__attribute__((noinline)) long fib(long n) {
    n_fib++;
    if (n < 2)
        return n;
    long a = fib(n - 1), b = fib(n - 2);
    __asm__ volatile("" : "+r"(a), "+r"(b)); /* two real calls, no accumulator loop */
    return a + b;
}

/* A tail call: its XRay exit is a tail sled. */
__attribute__((noinline)) long tailer(long x) {
    n_tailer++;
    return leaf(x * 2);
}

/* Prints who it returns to, and the backtrace() of the call by symbol. */
__attribute__((noinline)) void where(void) {
    n_where++;
    printf("where returns into %s\n", sym(__builtin_return_address(0)));
    void *frames[32];
    int n = backtrace(frames, 32);
    for (int i = 0; i < n; i++) {
        const char *s = sym(frames[i]);
        printf("  bt %s\n", s);
        if (s[0] == 'm' && s[1] == 'a' && s[2] == 'i' && s[3] == 'n' && !s[4])
            break;
    }
}

__attribute__((noinline)) long outer(long n) {
    long s = 0;
    for (long i = 0; i < n; i++)
        s += pair(i) + tailer(i);
    where();
    return s;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 3;
    long s = outer(n) + fib(n + 2);
    printf("sum=%ld\n", s);
    printf("leaf=%ld pair=%ld fib=%ld tailer=%ld where=%ld\n", n_leaf, n_pair, n_fib,
           n_tailer, n_where);
    return (int)(s % 7) + 3;
}
