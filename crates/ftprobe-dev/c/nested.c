/* nested [N]: foo(N, 3) calls its GCC nested function foo_internal N times (default N = 5);
 * foo_internal counts its own calls in foo's frame (through the static chain, %r10), so gcc
 * saves %r10 around the __fentry__ call: `push %r10; call __fentry__; pop %r10` (with
 * -mfentry), the site at +2. Prints "calls=<N>" (foo_internal's own count), then
 * "sum=<3 N (N - 1) / 2>". foo_internal is only called directly (its address is never
 * taken), so no trampoline on the stack and no executable stack. */
#include <stdio.h>
#include <stdlib.h>

int foo(int n, int k)
{
    int calls = 0;
    int __attribute__((noinline)) foo_internal(int x)
    {
        calls++;
        return x * k;
    }
    int sum = 0;
    for (int i = 0; i < n; i++)
        sum += foo_internal(i);
    printf("calls=%d\n", calls);
    return sum;
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 5;
    printf("sum=%d\n", foo(n, 3));
    return 0;
}
