/* optunwind N: C++ (-O2, -rdynamic, no site flags). Two functions in assembly, with CFI,
 * call `callee(x)`, a C++ function that throws `Err{x}` when x % 3 == 0, prints a
 * backtrace() (each frame as backtrace_symbols names it, without the address in brackets)
 * when x is 1 or 4, and returns otherwise:
 *
 * - mid(f, x) (f(x), then returns x + 1): `push %rbx`, `mov %rdi,%rax`, `lea 1(%rsi),%rbx`,
 *   then at +8 `mov %rsi,%rdi` and at +11 `call *%rax`: a range at +8 ends with the call.
 * - mid_direct(x) (callee(x), then returns x + 1): `push %rbx`, then at +1 `mov %rdi,%rbx`
 *   and at +4 `call callee` (rel32): a range at +1 ends with the call.
 *
 * main calls mid(callee, i) and mid_direct(i) for i in 0..N, each in a try block that
 * catches Err, and prints each backtrace as it is taken ("bt mid x" / "bt mid_direct x",
 * then "  FRAME" lines), then "calls=C caught=K sum=S" (C: calls of each of the two, K:
 * exceptions caught, S: the sum of what the calls returned and the caught values). */
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <execinfo.h>

extern "C" {
long mid(void (*f)(long), long x);
long mid_direct(long x);
void callee(long x);
}

__asm__(".text\n"
        ".globl mid\n"
        ".type mid, @function\n"
        ".p2align 4\n"
        "mid:\n"
        "    .cfi_startproc\n"
        "    push %rbx\n"               /* +0 */
        "    .cfi_def_cfa_offset 16\n"
        "    .cfi_offset %rbx, -16\n"
        "    mov %rdi, %rax\n"          /* +1 */
        "    lea 1(%rsi), %rbx\n"       /* +4 */
        "    mov %rsi, %rdi\n"          /* +8: the probe */
        "    call *%rax\n"              /* +11 */
        "    mov %rbx, %rax\n"          /* +13 */
        "    pop %rbx\n"
        "    .cfi_def_cfa_offset 8\n"
        "    ret\n"
        "    .cfi_endproc\n"
        ".size mid, .-mid\n"
        ".globl mid_direct\n"
        ".type mid_direct, @function\n"
        ".p2align 4\n"
        "mid_direct:\n"
        "    .cfi_startproc\n"
        "    push %rbx\n"               /* +0 */
        "    .cfi_def_cfa_offset 16\n"
        "    .cfi_offset %rbx, -16\n"
        "    mov %rdi, %rbx\n"          /* +1: the probe */
        "    call callee\n"             /* +4 */
        "    lea 1(%rbx), %rax\n"       /* +9 */
        "    pop %rbx\n"
        "    .cfi_def_cfa_offset 8\n"
        "    ret\n"
        "    .cfi_endproc\n"
        ".size mid_direct, .-mid_direct\n");

struct Err {
    long v;
};

static const char *which = "";

extern "C" __attribute__((noinline)) void callee(long x)
{
    if (x % 3 == 0)
        throw Err{x};
    if (x == 1 || x == 4) {
        void *frames[32];
        int n = backtrace(frames, 32);
        char **names = backtrace_symbols(frames, n);
        std::printf("bt %s %ld\n", which, x);
        for (int i = 0; i < n; i++) {
            const char *s = names ? names[i] : "?";
            const char *br = std::strstr(s, " [");
            std::printf("  %.*s\n", br ? (int)(br - s) : (int)std::strlen(s), s);
        }
        std::free(names);
    }
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? std::atol(argv[1]) : 10;
    long calls = 0, caught = 0, sum = 0;
    for (long i = 0; i < n; i++) {
        which = "mid";
        try {
            sum += mid(callee, i);
        } catch (const Err &e) {
            caught++;
            sum += e.v;
        }
        which = "mid_direct";
        try {
            sum += mid_direct(i);
        } catch (const Err &e) {
            caught++;
            sum += e.v;
        }
        calls++;
    }
    std::printf("calls=%ld caught=%ld sum=%ld\n", calls, caught, sum);
    return 0;
}
