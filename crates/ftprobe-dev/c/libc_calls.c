/* libc_calls [N]: built with no site flags. Calls into libc functions whose work is done by
 * internal functions that Debian's stripped libc has no symbol for, N times each (default
 * N = 20): malloc of N blocks of 2000 + 16 i bytes, kept until the end (larger than any
 * tcache chunk and smaller than the mmap threshold: each call reaches _int_malloc), strlen (an indirect function) on a string the
 * compiler cannot see, strtol (____strtol_l_internal) and one qsort of N ints
 * (msort_with_tmp); and N calls of `bare`, a function in assembly with neither a symbol size
 * nor unwind info (its bounds are unknown). Prints "calls=N sum=<S>", S depending only on N. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *(*volatile alloc)(size_t) = malloc;
static size_t (*volatile length)(const char *) = strlen;
static long (*volatile to_long)(const char *, char **, int) = strtol;

/* long bare(long x): x + 1. No .size, no CFI: no FDE. */
__asm__(".text\n"
        ".globl bare\n"
        ".type bare, @function\n"
        "bare:\n"
        "    mov %rdi, %rax\n"
        "    add $1, %rax\n"
        "    ret\n");
long bare(long);
static long (*volatile bare_fn)(long) = bare;

static int cmp(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 20;
    if (n < 1 || n > 1000)
        return 2;
    void *blocks[1000];
    int nums[1000];
    char text[32];
    long sum = 0;
    for (int i = 0; i < n; i++) {
        blocks[i] = alloc(2000 + 16 * i);
        snprintf(text, sizeof text, "%d", (i * 7919) % 1000);
        sum += (long)length(text);
        nums[i] = (int)to_long(text, NULL, 10);
        sum += bare_fn(i);
    }
    qsort(nums, n, sizeof nums[0], cmp);
    for (int i = 0; i < n; i++) {
        sum += (long)nums[i] * i;
        free(blocks[i]);
    }
    printf("calls=%d sum=%ld\n", n, sum);
    return 0;
}
