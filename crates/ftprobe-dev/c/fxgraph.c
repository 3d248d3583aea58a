/* Functions for the fgraph (return hooks) tests, linked into Rust test executables through
 * libfxsites.a. Compiled with -O2 -fipa-ra and WITHOUT a global site flag: each function
 * that gets a site says so with SITE (gcc turns IPA register allocation off for callers
 * when every function may be patched, but keeps it when only the callee has the attribute),
 * so callers here keep values in caller-saved registers across calls they know do not
 * clobber them: a return trampoline that clobbers any register breaks their results. */

#include <immintrin.h>
#include <stdint.h>
#include <sys/types.h>
#include <unistd.h>

#define SITE __attribute__((noinline, patchable_function_entry(5, 0)))
#define HIDDEN __attribute__((visibility("hidden")))

/* Nesting: top(n) calls mid n times, mid calls leaf twice. */
SITE long fxg_leaf(long x)
{
    asm volatile("");
    return x + 1;
}

SITE long fxg_mid(long x)
{
    return fxg_leaf(x) + fxg_leaf(x * 2);
}

SITE long fxg_top(long n)
{
    long s = 0;
    for (long i = 0; i < n; i++)
        s += fxg_mid(i);
    return s;
}

/* Recursion: depth n, sum of 1..n. */
SITE long fxg_recurse(long n)
{
    if (n <= 0)
        return 0;
    long r = fxg_recurse(n - 1);
    asm volatile("" : "+r"(r));
    return r + n;
}

/* Two return words (rax, rdx). */
struct fxg_pair {
    long a, b;
};

SITE struct fxg_pair fxg_pair(long x)
{
    asm volatile("");
    struct fxg_pair p = { x * 3, x * 5 };
    return p;
}

/* A tail call: fxg_tail jumps to fxg_leaf with its own return slot. */
SITE long fxg_tail(long x)
{
    return fxg_leaf(x * 2);
}

/* IPA-RA callers. fxg_ipa_leaf only touches rdi and rax; fxg_ipa_int keeps eight integers
 * live in caller-saved registers (rcx, rdx, rsi, rdi, r8-r11) across it, fxg_ipa_float
 * eight doubles in xmm registers. The test compares with the values computed untraced. */
HIDDEN SITE long fxg_ipa_leaf(long x)
{
    asm volatile("");
    return x + 1;
}

HIDDEN SITE double fxg_ipa_fleaf(double x)
{
    asm volatile("");
    return x;
}

long fxg_ipa_int(long a, long b, long c, long d, long e, long f)
{
    long s = 0;
    for (int i = 0; i < 3; i++) {
        long r = fxg_ipa_leaf(a);
        s += r * b + c * d + e * f + a * c + b * e + d * f;
        a += b;
        b += c;
        c += d;
        d += e;
        e += f;
        f += a;
    }
    return s + a + b + c + d + e + f;
}

double fxg_ipa_float(double a, double b, double c, double d, double e, double f, double g,
                     double h)
{
    double s = 0;
    for (int i = 0; i < 3; i++) {
        double r = fxg_ipa_fleaf(a);
        s += r * b + c * d + e * f + g * h;
        a += b;
        b += c;
        c += d;
        d += e;
        e += f;
        f += g;
        g += h;
        h += a;
    }
    return s + a + b + c + d + e + f + g + h;
}

/* A leaf whose body touches no register (a `ret` after its site), and a harness that
 * loads a pattern into every general register but rsp and into xmm0-15 (and, where the
 * CPU has AVX, the upper halves of ymm0-15), calls it, and stores them all: out[0..15]
 * the GPRs (rax rbx rcx rdx rsi rdi rbp r8..r15), out[16..47] xmm0-15 (two words each),
 * out[48..79] the upper halves of ymm0-15. */
HIDDEN SITE void fxg_nop(void)
{
    asm volatile("");
}

#define GPR_PAT(i) (0x1111111111111111ull * (i) + 0x0102030405060708ull)

void fxg_regs_harness(uint64_t *out, int avx);
asm(".text\n"
    ".globl fxg_regs_harness\n"
    ".type fxg_regs_harness,@function\n"
    "fxg_regs_harness:\n"
    "  push %rbp\n"
    "  mov %rsp, %rbp\n"
    "  push %rbx\n"
    "  push %r12\n"
    "  push %r13\n"
    "  push %r14\n"
    "  push %r15\n"
    "  push %rdi\n" /* out, at -48(%rbp) */
    "  push %rsi\n" /* avx, at -56(%rbp) */
    "  sub $8, %rsp\n"
    /* xmm i = bytes (0x20 + i) repeated; ymm upper halves = bytes (0x60 + i) */
    "  mov $0x2020202020202020, %rax\n"
    "  mov $0x0101010101010101, %rcx\n"
    "  cmpl $0, -56(%rbp)\n"
    "  je 1f\n"
    "  mov $0x6060606060606060, %rdx\n"
    ".irp i,0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15\n"
    "  sub $32, %rsp\n"
    "  mov %rax, (%rsp)\n"
    "  mov %rax, 8(%rsp)\n"
    "  mov %rdx, 16(%rsp)\n"
    "  mov %rdx, 24(%rsp)\n"
    "  vmovdqu (%rsp), %ymm\\i\n"
    "  add $32, %rsp\n"
    "  add %rcx, %rax\n"
    "  add %rcx, %rdx\n"
    ".endr\n"
    "  jmp 2f\n"
    "1:\n"
    ".irp i,0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15\n"
    "  movq %rax, %xmm\\i\n"
    "  pinsrq $1, %rax, %xmm\\i\n"
    "  add %rcx, %rax\n"
    ".endr\n"
    "2:\n"
    "  mov $0x0102030405060708, %rax\n"
    "  mov $0x1213141516171819, %rbx\n"
    "  mov $0x232425262728292a, %rcx\n"
    "  mov $0x3435363738393a3b, %rdx\n"
    "  mov $0x45464748494a4b4c, %rsi\n"
    "  mov $0x565758595a5b5c5d, %rdi\n"
    "  mov $0x7778797a7b7c7d7e, %r8\n"
    "  mov $0x88898a8b8c8d8e8f, %r9\n"
    "  mov $0x999a9b9c9d9e9fa0, %r10\n"
    "  mov $0xaaabacadaeafb0b1, %r11\n"
    "  mov $0xbbbcbdbebfc0c1c2, %r12\n"
    "  mov $0xcccdcecfd0d1d2d3, %r13\n"
    "  mov $0xdddedfe0e1e2e3e4, %r14\n"
    "  mov $0xeeeff0f1f2f3f4f5, %r15\n"
    "  push %rbp\n"
    "  mov $0x6768696a6b6c6d6e, %rbp\n"
    "  sub $8, %rsp\n"
    "  call fxg_nop\n"
    "  add $8, %rsp\n"
    "  xchg %rbp, (%rsp)\n" /* the harness's rbp back; the pattern's on the stack */
    "  push %rax\n"
    "  mov -48(%rbp), %rax\n"
    "  pop 0(%rax)\n"
    "  mov %rbx, 8(%rax)\n"
    "  mov %rcx, 16(%rax)\n"
    "  mov %rdx, 24(%rax)\n"
    "  mov %rsi, 32(%rax)\n"
    "  mov %rdi, 40(%rax)\n"
    "  pop 48(%rax)\n"
    "  mov %r8, 56(%rax)\n"
    "  mov %r9, 64(%rax)\n"
    "  mov %r10, 72(%rax)\n"
    "  mov %r11, 80(%rax)\n"
    "  mov %r12, 88(%rax)\n"
    "  mov %r13, 96(%rax)\n"
    "  mov %r14, 104(%rax)\n"
    "  mov %r15, 112(%rax)\n"
    "  cmpl $0, -56(%rbp)\n"
    "  je 3f\n"
    ".irp i,0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15\n"
    "  vmovdqu %ymm\\i, -96(%rbp)\n"
    "  mov -96(%rbp), %rcx\n"
    "  mov %rcx, 128+16*\\i(%rax)\n"
    "  mov -88(%rbp), %rcx\n"
    "  mov %rcx, 136+16*\\i(%rax)\n"
    "  mov -80(%rbp), %rcx\n"
    "  mov %rcx, 384+16*\\i(%rax)\n"
    "  mov -72(%rbp), %rcx\n"
    "  mov %rcx, 392+16*\\i(%rax)\n"
    ".endr\n"
    "  vzeroupper\n"
    "  jmp 4f\n"
    "3:\n"
    ".irp i,0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15\n"
    "  movq %xmm\\i, 128+16*\\i(%rax)\n"
    "  pextrq $1, %xmm\\i, 136+16*\\i(%rax)\n"
    ".endr\n"
    "4:\n"
    "  lea -40(%rbp), %rsp\n"
    "  pop %r15\n"
    "  pop %r14\n"
    "  pop %r13\n"
    "  pop %r12\n"
    "  pop %rbx\n"
    "  pop %rbp\n"
    "  ret\n"
    ".size fxg_regs_harness, .-fxg_regs_harness\n");

/* __m256 returned in ymm0 by a hooked function, and one kept live across a hooked call
 * (IPA-RA: fxg_nop clobbers nothing). 1 when every lane is right. */
HIDDEN SITE __attribute__((target("avx2"))) __m256 fxg_m256_twice(__m256 a)
{
    asm volatile("");
    return _mm256_add_ps(a, a);
}

__attribute__((target("avx2"), noinline)) int fxg_m256_check(void)
{
    __m256 a = _mm256_setr_ps(1, 2, 3, 4, 5, 6, 7, 8);
    __m256 kept = _mm256_setr_ps(10, 20, 30, 40, 50, 60, 70, 80);
    asm volatile("" : "+x"(kept));
    __m256 r = fxg_m256_twice(a);
    fxg_nop();
    asm volatile("" : "+x"(kept));
    float rv[8], kv[8];
    _mm256_storeu_ps(rv, r);
    _mm256_storeu_ps(kv, kept);
    for (int i = 0; i < 8; i++)
        if (rv[i] != 2.0f * (i + 1) || kv[i] != 10.0f * (i + 1))
            return 0;
    return 1;
}

/* fork inside a hooked function: both processes return through the trampoline. */
SITE long fxg_fork(void)
{
    pid_t p = fork();
    asm volatile("");
    return p == 0 ? -7 : (long)p;
}

/* Calls cb with its own return-address slot while it runs (-fno-omit-frame-pointer:
 * the slot is 8(%rbp)). */
SITE long fxg_with_slot(long (*cb)(void **slot))
{
    long r = cb((void **)__builtin_frame_address(0) + 1);
    asm volatile("" : "+r"(r));
    return r;
}
