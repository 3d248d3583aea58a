/* libfxsites.a: functions with -fpatchable-function-entry=5 sites, linked into Rust test
 * executables through ftprobe_dev::fxsites. */

__attribute__((noinline)) long fx_add(long a, long b)
{
    asm volatile("");
    return a + b;
}

__attribute__((noinline)) long fx_mul(long a, long b)
{
    asm volatile("");
    return a * b;
}

/* x + 1 */
__attribute__((noinline)) long fx_leaf(long x)
{
    asm volatile("");
    return x + 1;
}

/* Calls fx_leaf twice: fx_leaf(x) + fx_leaf(x + 1) = 2x + 3. */
__attribute__((noinline)) long fx_twice(long x)
{
    long a = fx_leaf(x);
    long b = fx_leaf(x + 1);
    return a + b;
}

/* For ip-redirect tests. */
__attribute__((noinline)) long fx_ret_42(void)
{
    asm volatile("");
    return 42;
}
