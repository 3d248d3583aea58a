/* indirect: calls and jumps through memory, for int3 probes on them (issue 14 item 3).
 *
 * No site flags. The functions with an indirect branch are written in assembly so that the
 * probed instruction is at a known offset (the test checks each by decoding the symbol):
 *
 *   callv+7      call *(%rax)             a virtual call: rax = the object's vtable pointer
 *   ops_call+4   call *0x18(%rdi)         a call through an ops table member
 *   gotcall+4    call *labs@GOTPCREL(%rip) a -fno-plt call site (libc's labs, through the GOT)
 *   jtab+10      jmp *(%rax,%rcx,8)       a jump table
 *   jtab_nt+10   notrack jmp *(%rax,%rcx,8)
 *   callsp+21    call *0x18(%rsp)         an rsp-based operand (a decoy at 0x10(%rsp), where
 *                                         an operand read after the push would land)
 *
 * `indirect N` calls each N times, counting its own calls, and prints the counts, the
 * results and how many times each virtual function ran. `indirect faults N` makes N calls of
 * callv through a NULL vtable pointer, N through a vtable in a PROT_NONE page, N through a
 * NULL vtable entry, N through a vtable in a PROT_EXEC page (a fault only where
 * protection keys make it execute-only), and N through a non-canonical vtable entry (#GP at
 * the call, nothing pushed), each fault caught by its SIGSEGV handler
 * (SA_SIGINFO) and left with siglongjmp; the handler records si_code, si_addr, the PC and,
 * for the NULL entry, the return address at the top of the stack, and the program prints
 * them relative to callv and to the pages.
 * Exits 3.
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

struct shape;
struct shape_vtbl {
    long (*area)(struct shape *);
    long (*perimeter)(struct shape *);
};
struct shape {
    const struct shape_vtbl *vptr;
    long w, h;
};

long callv(struct shape *s);
struct ops;
long ops_call(struct ops *ops, long x);
long gotcall(long x);
long jtab(long i);
long jtab_nt(long i);
long callsp(long (*f)(long), long x, long (*decoy)(long));

__asm__(
    "  .text\n"
    "  .globl callv\n  .type callv,@function\n"
    "callv:\n"
    "  push %rbp\n"             /* +0 */
    "  mov %rsp,%rbp\n"         /* +1 */
    "  mov (%rdi),%rax\n"       /* +4 */
    "  call *(%rax)\n"          /* +7 */
    "  pop %rbp\n"              /* +9 */
    "  ret\n"
    "  .size callv,.-callv\n"

    "  .globl ops_call\n  .type ops_call,@function\n"
    "ops_call:\n"
    "  push %rbp\n"             /* +0 */
    "  mov %rsp,%rbp\n"         /* +1 */
    "  call *0x18(%rdi)\n"      /* +4: ops->op(ops, x) */
    "  pop %rbp\n"
    "  ret\n"
    "  .size ops_call,.-ops_call\n"

    "  .globl gotcall\n  .type gotcall,@function\n"
    "gotcall:\n"
    "  push %rbp\n"
    "  mov %rsp,%rbp\n"
    "  call *labs@GOTPCREL(%rip)\n" /* +4 */
    "  pop %rbp\n"
    "  ret\n"
    "  .size gotcall,.-gotcall\n"

    "  .globl jtab\n  .type jtab,@function\n"
    "jtab:\n"
    "  lea jtab_table(%rip),%rax\n" /* +0, 7 bytes */
    "  mov %rdi,%rcx\n"             /* +7, 3 bytes */
    "  jmp *(%rax,%rcx,8)\n"        /* +10 */
    "1: mov $10,%eax\n  ret\n"
    "2: mov $20,%eax\n  ret\n"
    "3: mov $30,%eax\n  ret\n"
    "4: mov $40,%eax\n  ret\n"
    "  .size jtab,.-jtab\n"
    "  .section .data.rel.ro,\"aw\"\n  .balign 8\n"
    "jtab_table: .quad 1b, 2b, 3b, 4b\n"
    "  .text\n"

    "  .globl jtab_nt\n  .type jtab_nt,@function\n"
    "jtab_nt:\n"
    "  lea jtab_nt_table(%rip),%rax\n"
    "  mov %rdi,%rcx\n"
    "  notrack jmp *(%rax,%rcx,8)\n" /* +10 */
    "1: mov $1,%eax\n  ret\n"
    "2: mov $2,%eax\n  ret\n"
    "3: mov $3,%eax\n  ret\n"
    "  .size jtab_nt,.-jtab_nt\n"
    "  .section .data.rel.ro,\"aw\"\n  .balign 8\n"
    "jtab_nt_table: .quad 1b, 2b, 3b\n"
    "  .text\n"

    "  .globl callsp\n  .type callsp,@function\n"
    "callsp:\n"
    "  push %rbp\n"             /* +0 */
    "  mov %rsp,%rbp\n"         /* +1 */
    "  sub $0x20,%rsp\n"        /* +4 */
    "  mov %rdi,0x18(%rsp)\n"   /* +8 */
    "  mov %rdx,0x10(%rsp)\n"   /* +13: the decoy */
    "  mov %rsi,%rdi\n"         /* +18 */
    "  call *0x18(%rsp)\n"      /* +21 */
    "  leave\n"
    "  ret\n"
    "  .size callsp,.-callsp\n");

static long area_calls, perimeter_calls, op_calls, decoy_calls;

static long rect_area(struct shape *s) { area_calls++; return s->w * s->h; }
static long rect_perimeter(struct shape *s) { perimeter_calls++; return 2 * (s->w + s->h); }
static long square_area(struct shape *s) { area_calls++; return s->w * s->w + 1000; }
static const struct shape_vtbl rect_vtbl = {rect_area, rect_perimeter};
static const struct shape_vtbl square_vtbl = {square_area, rect_perimeter};
/* A second "class" whose slot 0 is the perimeter: the same call site, another callee. */
static const struct shape_vtbl perim_vtbl = {rect_perimeter, rect_area};

struct ops;
static long op_twice(struct ops *self, long x) { (void)self; op_calls++; return 2 * x; }
static long sp_plus(long x) { return x + 7; }
static long sp_decoy(long x) { decoy_calls++; return -x; }
struct ops {
    void *a, *b, *c;
    long (*op)(struct ops *self, long x);
};

static sigjmp_buf env;
static volatile uintptr_t seen_addr, seen_pc, seen_ret;
static volatile int seen_code;

static void on_segv(int sig, siginfo_t *si, void *ucv) {
    ucontext_t *uc = ucv;
    (void)sig;
    seen_addr = (uintptr_t)si->si_addr;
    seen_code = si->si_code;
    seen_pc = (uintptr_t)uc->uc_mcontext.gregs[REG_RIP];
    seen_ret = *(uintptr_t *)uc->uc_mcontext.gregs[REG_RSP];
    siglongjmp(env, 1);
}

static int faults(long n) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, NULL);
    long pg = sysconf(_SC_PAGESIZE);
    char *none = mmap(NULL, pg, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    /* A vtable in an execute-only page: the CPU reads it unless protection keys make
     * PROT_EXEC execute-only (x86 with PKU: SEGV_PKUERR); process_vm_readv never does. */
    char *xo = mmap(NULL, pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (none == MAP_FAILED || xo == MAP_FAILED)
        return 1;
    memcpy(xo + 16, &rect_vtbl, sizeof rect_vtbl);
    if (mprotect(xo, pg, PROT_EXEC) != 0)
        return 1;
    static const struct shape_vtbl null_entry = {0, 0};
    /* A target that is not canonical: #GP at the call itself, before the push. */
    static const struct shape_vtbl noncanon_entry = {
        (long (*)(struct shape *))0x8000000000000000ul, 0};
    struct shape noncanon = {&noncanon_entry, 1, 1};
    struct shape null_vptr = {0, 1, 1};
    struct shape none_vptr = {(const struct shape_vtbl *)(none + 8), 1, 1};
    struct shape bad_entry = {&null_entry, 1, 1};
    struct shape xo_vptr = {(const struct shape_vtbl *)(xo + 16), 2, 3};
    struct {
        const char *what;
        struct shape *s;
    } kinds[] = {{"null_vptr", &null_vptr},
                 {"prot_none", &none_vptr},
                 {"null_entry", &bad_entry},
                 {"exec_only", &xo_vptr},
                 {"noncanonical", &noncanon}};
    uintptr_t fn = (uintptr_t)callv;
    for (int k = 0; k < 5; k++) {
        long caught = 0, calls = 0;
        for (long i = 0; i < n; i++) {
            seen_addr = seen_pc = seen_ret = 1;
            if (sigsetjmp(env, 1) == 0) {
                calls++;
                long r = callv(kinds[k].s);
                printf("%s %ld: no fault, %ld\n", kinds[k].what, i, r);
            } else {
                caught++;
                /* Addresses relative to the pages and to callv: the same in every run. */
                const char *page = "";
                long addr = (long)seen_addr;
                if (seen_addr >= (uintptr_t)none && seen_addr < (uintptr_t)none + pg)
                    page = "page+", addr = (long)(seen_addr - (uintptr_t)none);
                if (seen_addr >= (uintptr_t)xo && seen_addr < (uintptr_t)xo + pg)
                    page = "xpage+", addr = (long)(seen_addr - (uintptr_t)xo);
                printf("%s %ld: si_code=%d si_addr=%s%#lx", kinds[k].what, i, seen_code, page,
                       addr);
                if (seen_pc == 0)
                    printf(" pc=0");
                else
                    printf(" pc=callv%+ld", (long)(seen_pc - fn));
                if (k == 2)
                    printf(" ret=callv%+ld", (long)(seen_ret - fn));
                if (k == 4)
                    printf(" pushed=%d", seen_ret == fn + 9);
                printf("\n");
            }
        }
        printf("%s calls=%ld caught=%ld\n", kinds[k].what, calls, caught);
    }
    printf("area_calls=%ld\n", area_calls);
    return 3;
}

int main(int argc, char **argv) {
    if (argc > 2 && strcmp(argv[1], "faults") == 0)
        return faults(atol(argv[2]));
    long n = argc > 1 ? atol(argv[1]) : 5;
    struct shape shapes[3] = {{&rect_vtbl, 3, 4}, {&square_vtbl, 5, 5}, {&perim_vtbl, 2, 3}};
    struct ops ops = {0, 0, 0, op_twice};
    long n_callv = 0, n_ops = 0, n_got = 0, n_jtab = 0, n_jtab_nt = 0, n_callsp = 0;
    long sum = 0;
    for (long i = 0; i < n; i++) {
        sum += callv(&shapes[i % 3]), n_callv++;
        sum += ops_call(&ops, i), n_ops++;
        sum += gotcall(-i * 3), n_got++;
        sum += jtab(i % 4), n_jtab++;
        sum += jtab_nt(i % 3), n_jtab_nt++;
        sum += callsp(sp_plus, i, sp_decoy), n_callsp++;
    }
    printf("callv=%ld ops_call=%ld gotcall=%ld jtab=%ld jtab_nt=%ld callsp=%ld\n", n_callv,
           n_ops, n_got, n_jtab, n_jtab_nt, n_callsp);
    printf("area_calls=%ld perimeter_calls=%ld op_calls=%ld decoy_calls=%ld sum=%ld\n",
           area_calls, perimeter_calls, op_calls, decoy_calls, sum);
    return 3;
}
