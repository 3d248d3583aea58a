/* calls [N]: calls caller(N) once from main, which calls work N times (default N = 10);
 * prints "sum=<2N^2 - N>". */
#include <stdio.h>
#include <stdlib.h>

#include "work.c"

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 10;
    printf("sum=%ld\n", caller(n));
    return 0;
}
