/* More functions for Rust test executables, in the two site flavours whose rules differ:
 * compiled once with -fpatchable-function-entry=5 -fcf-protection=full (endbr64 first, site at
 * +4) into fx_cet_*, and once with -pg (mcount after the prologue, found by decoding) into
 * fx_pg_*. FX(name) pastes the prefix. */

#ifndef FX
#error "define FX"
#endif

__attribute__((noinline)) long FX(add)(long a, long b)
{
    asm volatile("");
    return a + b;
}

__attribute__((noinline)) long FX(mul)(long a, long b)
{
    asm volatile("");
    return a * b;
}
