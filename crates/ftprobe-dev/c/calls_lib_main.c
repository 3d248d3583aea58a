/* calls_lib [N]: like calls, but work/caller live in libfxwork-<flavour>.so.
 * Built without any site flags. */
#include <stdio.h>
#include <stdlib.h>

long caller(long n);

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 10;
    printf("sum=%ld\n", caller(n));
    return 0;
}
