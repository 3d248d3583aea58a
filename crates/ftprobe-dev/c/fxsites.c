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

/* Returns the rbp it was called with (its site runs first: a SAVE_REGS callback that changes
 * regs.rbp changes what it returns). */
__attribute__((noinline)) long fx_rbp_callee(void)
{
    long r;
    asm volatile("mov %%rbp, %0" : "=r"(r));
    return r;
}

/* Calls fx_rbp_callee with its own rbp saved around the call (the callee may return with
 * another rbp), and returns what the callee returned. */
__attribute__((noinline)) long fx_rbp_caller(void)
{
    long r;
    asm volatile("push %%rbp\n\t"
                 "sub $8, %%rsp\n\t"
                 "call fx_rbp_callee\n\t"
                 "add $8, %%rsp\n\t"
                 "pop %%rbp"
                 : "=a"(r)
                 :
                 : "rdi", "rsi", "rdx", "rcx", "r8", "r9", "r10", "r11", "memory", "cc");
    return r;
}
