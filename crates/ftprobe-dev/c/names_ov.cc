/* Names that readers must keep apart (tests/review_names.rs). C++ overloads: f(int) is called
 * 3 times, f(double) once. A call chain for the filters: main calls top once, top calls mid
 * 4 times, mid calls leaf twice. Two C functions named `helper`, static in names_st_a.c and
 * names_st_b.c, called once (a) and twice (b) through st_a() and st_b(). Prints
 * `names f=<sum> chain=<sum> st=<sum>`. */

#include <cstdio>

extern "C" int st_a(int);
extern "C" int st_b(int);

__attribute__((noinline)) int f(int x)
{
    asm volatile("");
    return x + 1;
}

__attribute__((noinline)) int f(double x)
{
    asm volatile("");
    return (int)(x * 2);
}

__attribute__((noinline)) long leaf(long x)
{
    asm volatile("");
    return x + 1;
}

__attribute__((noinline)) long mid(long x)
{
    return leaf(x) + leaf(x * 2);
}

__attribute__((noinline)) long top(long n)
{
    long s = 0;
    for (long i = 0; i < n; i++)
        s += mid(i);
    return s;
}

int main()
{
    int fs = f(1) + f(2) + f(3) + f(1.5);
    long chain = top(4);
    int st = st_a(1) + st_b(1) + st_b(2);
    printf("names f=%d chain=%ld st=%d\n", fs, chain, st);
    return 0;
}
