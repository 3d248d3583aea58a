/* A generator on its own stack (makecontext) and main switch with swapcontext N times
 * (argument, default 20000): main calls `resume`, which switches to the generator; the
 * generator calls `yield`, which switches back. Each `resume` returns once the generator
 * yielded; each `yield` returns when main resumes it again (the last one never does). No
 * site flags: return probes on both are int3 (or optimized) probes. Prints
 * `resumes=R yields=Y` (returns: R of `resume`, Y - 1 of `yield`). */

#include <stdio.h>
#include <stdlib.h>
#include <ucontext.h>

static ucontext_t main_ctx, gen_ctx;
static char gen_stack[1 << 16];
static volatile long resumes, yields;

__attribute__((noinline)) void yield(void)
{
    yields++;
    swapcontext(&gen_ctx, &main_ctx);
}

__attribute__((noinline)) void resume(void)
{
    resumes++;
    swapcontext(&main_ctx, &gen_ctx);
}

static void generator(void)
{
    for (;;)
        yield();
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 20000;
    getcontext(&gen_ctx);
    gen_ctx.uc_stack.ss_sp = gen_stack;
    gen_ctx.uc_stack.ss_size = sizeof gen_stack;
    gen_ctx.uc_link = &main_ctx;
    makecontext(&gen_ctx, generator, 0);
    for (long i = 0; i < n; i++)
        resume();
    printf("resumes=%ld yields=%ld\n", resumes, yields);
    return 0;
}
