/* optrefuse MODE N: built with no site flags (-O2). Functions whose probes an optimizer must
 * leave as int3 probes, each beside one whose probe it may optimize, with their own counts
 * of how often the probed instruction ran. The functions are in assembly (exact layout,
 * `.size` given) but ref_switch, a C `switch` with a jump table.
 *
 * - `jumpin N`: ref_jumpin(i) and ref_plain(i) for i in 0..N. Both run `add $1,%eax` at +5
 *   once a call (the probe), then `sub $1,%rcx` at +11 (ref_plain) or +8 (ref_jumpin) i + 1
 *   times by a `jns` back to it; ref_jumpin's `jns` targets +8, inside the 7 bytes a `jmp`
 *   at +5 would replace (+5 add, +8 sub); ref_plain's +11, after them (+5 add, +8 add
 *   $0,%edx). Prints "jumpin=J plain=P" (the counts of +5 the functions returned: N each).
 * - `foreign N`: ref_body(i) (`mov %rdi,%rax` at +0, the probe; `add $3,%rax` at +3) and
 *   ref_entry2(i) (a separate function before it that jumps to ref_body+3) for i in 0..N.
 *   Prints "body=B entry2=E sum=S" (B: calls of ref_body, the times +0 ran).
 * - `table N`: ref_table(i) (asm: `and $3,%edi` at +0, `lea`, `jmp *(%rcx,%rdi,8)`; case 1
 *   at +19, `mov $11,%eax`) and ref_switch(i) (C, 12 dense cases) for i in 0..N. Prints
 *   "table=T case1=C switch=S" (calls of ref_table, times it took case 1, calls of
 *   ref_switch) and the sum of what they returned.
 * Modes `table` and `callmid` also call ref_plain(1) once a round and print "plain=P" (P its
 * count of +5), for a probe that is optimized in the same run.
 * - `callmid N`: a thread calls ref_callmid(block, 0) (`call *%rax` at +7 followed by
 *   `add $1,%rax` at +9: a call that is not the last instruction of a range at +7) and
 *   blocks in `block` until a line arrives on stdin, after "blocked" (flushed) is printed;
 *   then main joins it and calls ref_callmid(inc, i) N times. Prints "callmid=C thread=R
 *   sum=S" (C: the calls made after the thread returned, R: what the thread's call returned,
 *   1; S: the sum of the later calls' results). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

__asm__(".text\n"
        /* long ref_jumpin(long n): returns 1. */
        ".globl ref_jumpin\n"
        ".type ref_jumpin, @function\n"
        ".p2align 4\n"
        "ref_jumpin:\n"
        "    xor %eax, %eax\n"        /* +0: 31 c0 */
        "    mov %rdi, %rcx\n"        /* +2: 48 89 f9 */
        "    add $1, %eax\n"          /* +5: 83 c0 01 (the probe) */
        "1:  sub $1, %rcx\n"          /* +8: 48 83 e9 01 */
        "    jns 1b\n"                /* +12: 79 fa, to +8 */
        "    ret\n"                   /* +14 */
        ".size ref_jumpin, .-ref_jumpin\n"
        /* long ref_plain(long n): returns 1. */
        ".globl ref_plain\n"
        ".type ref_plain, @function\n"
        ".p2align 4\n"
        "ref_plain:\n"
        "    xor %eax, %eax\n"        /* +0 */
        "    mov %rdi, %rcx\n"        /* +2 */
        "    add $1, %eax\n"          /* +5: the probe */
        "    add $0, %edx\n"          /* +8: 83 c2 00 */
        "1:  sub $1, %rcx\n"          /* +11 */
        "    jns 1b\n"                /* +15, to +11 */
        "    ret\n"
        ".size ref_plain, .-ref_plain\n"
        /* long ref_table(long k): 10 + k % 4, through a jump table. */
        ".globl ref_table\n"
        ".type ref_table, @function\n"
        ".p2align 4\n"
        "ref_table:\n"
        "    and $3, %edi\n"          /* +0: 83 e7 03 (a probe) */
        "    lea 2f(%rip), %rcx\n"    /* +3: 48 8d 0d rel32 */
        "    jmp *(%rcx,%rdi,8)\n"    /* +10: ff 24 f9 */
        "10: mov $10, %eax\n"         /* +13... see below */
        "    ret\n"
        "11: mov $11, %eax\n"
        "    ret\n"
        "12: mov $12, %eax\n"
        "    ret\n"
        "13: mov $13, %eax\n"
        "    ret\n"
        ".size ref_table, .-ref_table\n"
        ".section .data.rel.ro,\"aw\"\n"
        ".p2align 3\n"
        "2:  .quad 10b, 11b, 12b, 13b\n"
        ".text\n"
        /* long ref_entry2(long x): 2x + 3, by a jump into ref_body past its first
         * instruction (as glibc's __mempcpy_avx_unaligned_erms jumps to
         * __memmove_avx_unaligned_erms+3). */
        ".globl ref_entry2\n"
        ".type ref_entry2, @function\n"
        ".p2align 4\n"
        "ref_entry2:\n"
        "    lea (%rdi,%rdi), %rdi\n"
        "    jmp .Lref_body_add\n"
        ".size ref_entry2, .-ref_entry2\n"
        /* long ref_body(long x): x + 3. */
        ".globl ref_body\n"
        ".type ref_body, @function\n"
        ".p2align 4\n"
        "ref_body:\n"
        "    mov %rdi, %rax\n"        /* +0: 48 89 f8 (the probe) */
        ".Lref_body_add:\n"
        "    add $3, %rax\n"          /* +3: 48 83 c0 03 */
        "    ret\n"
        ".size ref_body, .-ref_body\n"
        /* long ref_callmid(long (*f)(long), long x): f(x) + 1. */
        ".globl ref_callmid\n"
        ".type ref_callmid, @function\n"
        ".p2align 4\n"
        "ref_callmid:\n"
        "    .cfi_startproc\n"
        "    push %rbx\n"             /* +0 */
        "    .cfi_def_cfa_offset 16\n"
        "    .cfi_offset %rbx, -16\n"
        "    mov %rdi, %rax\n"        /* +1 */
        "    mov %rsi, %rdi\n"        /* +4 */
        "    call *%rax\n"            /* +7: ff d0 (the probe) */
        "    add $1, %rax\n"          /* +9: 48 83 c0 01 */
        "    pop %rbx\n"              /* +13 */
        "    .cfi_def_cfa_offset 8\n"
        "    ret\n"
        "    .cfi_endproc\n"
        ".size ref_callmid, .-ref_callmid\n");

long ref_jumpin(long n);
long ref_plain(long n);
long ref_table(long k);
long ref_callmid(long (*f)(long), long x);
long ref_entry2(long x);
long ref_body(long x);

/* Dense cases: a jump table at -O2. */
__attribute__((noinline)) long ref_switch(int x)
{
    switch (x % 12) {
    case 0: return 5;
    case 1: return x * 3;
    case 2: return x ^ 0x55;
    case 3: return x - 7;
    case 4: return x << 2;
    case 5: return x / 3;
    case 6: return 99;
    case 7: return x + 1000;
    case 8: return x & 0xf0;
    case 9: return -x;
    case 10: return x | 0x100;
    case 11: return x * x;
    }
    return 0;
}

static long (*volatile switch_fn)(int) = ref_switch;

static long inc(long x) { return x; }

static long block(long x)
{
    char line[16];
    printf("blocked\n");
    fflush(stdout);
    if (read(0, line, sizeof line) <= 0)
        return -100;
    return x;
}

static void *thread_main(void *arg)
{
    *(long *)arg = ref_callmid(block, 0);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 3)
        return 2;
    long n = atol(argv[2]);
    if (strcmp(argv[1], "jumpin") == 0) {
        long j = 0, p = 0;
        for (long i = 0; i < n; i++) {
            j += ref_jumpin(i);
            p += ref_plain(i);
        }
        printf("jumpin=%ld plain=%ld\n", j, p);
    } else if (strcmp(argv[1], "foreign") == 0) {
        long b = 0, e = 0, sum = 0;
        for (long i = 0; i < n; i++) {
            sum += ref_body(i);
            b++;
            sum += ref_entry2(i);
            e++;
        }
        printf("body=%ld entry2=%ld sum=%ld\n", b, e, sum);
    } else if (strcmp(argv[1], "table") == 0) {
        long t = 0, c1 = 0, s = 0, sum = 0, p = 0;
        for (long i = 0; i < n; i++) {
            p += ref_plain(1);
            long v = ref_table(i);
            t++;
            c1 += v == 11;
            sum += v + switch_fn((int)i);
            s++;
        }
        printf("table=%ld case1=%ld switch=%ld sum=%ld plain=%ld\n", t, c1, s, sum, p);
    } else if (strcmp(argv[1], "callmid") == 0) {
        pthread_t th;
        long r = 0, c = 0, sum = 0, p = 0;
        if (pthread_create(&th, NULL, thread_main, &r) != 0)
            return 3;
        pthread_join(th, NULL);
        for (long i = 0; i < n; i++) {
            sum += ref_callmid(inc, i);
            c++;
            p += ref_plain(1);
        }
        printf("callmid=%ld thread=%ld sum=%ld plain=%ld\n", c, r, sum, p);
    } else {
        return 2;
    }
    return 0;
}
