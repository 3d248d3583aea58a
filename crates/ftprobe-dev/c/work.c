/* work/caller/leaf_unused: the functions every fixture traces.
 * Included by calls.c and threads.c, compiled alone into libfxwork-<flavour>.so. */

/* Called n times by caller(n), with arguments (i, i + 1). The empty asm keeps gcc from
 * treating it as pure and folding calls away. */
__attribute__((noinline)) long work(long a, long b)
{
    asm volatile("");
    return a * 3 + b;
}

/* Called once by main: returns the sum of work(i, i + 1) for i in 0..n, i.e. 2n^2 - n. */
__attribute__((noinline)) long caller(long n)
{
    long sum = 0;
    for (long i = 0; i < n; i++)
        sum += work(i, i + 1);
    return sum;
}

/* Never called: a site that must never fire. */
__attribute__((noinline)) int leaf_unused(int x)
{
    asm volatile("");
    return x + 1;
}
