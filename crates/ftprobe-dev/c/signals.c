/* signals MODE [ARGS]: how the program's own signal handlers see the program (issue 10),
 * traced or not. `mark` has no patchable entry (an int3 probe there installs ftprobe's SIGTRAP
 * handler); `hot_loop` (assembly) is a loop whose `add` at hot_loop+2 an int3 probe runs from
 * a boosted XOL slot.
 *
 *   altstack      a sigaltstack; SIGTRAP (raise, and an int3 of the program's own) and SIGSEGV
 *                 handlers with and without SA_ONSTACK, from the main stack and from a handler
 *                 already on the signal stack: each line says whether the handler's local
 *                 variable is on the signal stack and whether sigaltstack says SS_ONSTACK; a
 *                 handler's change of rax and xmm0 in its ucontext takes effect
 *   pcs N         a 1 ms ITIMER_REAL whose SA_SIGINFO handler looks up the interrupted PC in
 *                 the executable segments of every loaded object (dl_iterate_phdr: the
 *                 program, libc, the vdso, ...) while the main thread runs hot_loop until N
 *                 ticks came (however long the machine takes to deliver them; 120 s at most);
 *                 prints how many ticks interrupted a PC outside all of them
 *   regs N        as pcs, until N ticks interrupted hot_sp_loop (an optprobe's detour, entry and exit, around
 *                 hot_sp_loop+16): every tick that interrupted it checks what the program
 *                 must see there: the PC at an instruction boundary, the stack pointer the
 *                 function saved, rdi and rax in range, the flags the instruction before
 *                 the PC left (ZF/CF/SF/OF); prints the ticks in it and the bad ones
 *   actions       installs handlers (sigaction with and without SA_SIGINFO, SA_RESETHAND,
 *                 signal, sigset) for SIGUSR1, SIGUSR2, SIGALRM and prints what sigaction
 *                 reads back before and after each is delivered
 */
#define _GNU_SOURCE
#include <link.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#define NOSITE __attribute__((noinline, patchable_function_entry(0, 0)))
#ifndef SS_AUTODISARM
#define SS_AUTODISARM (1U << 31) /* linux/signal.h */
#endif

NOSITE long mark(long x)
{
    __asm__ volatile("" : "+r"(x));
    return x + 1;
}

/* long hot_loop(long n): counts rax up to n (n >= 1). */
long hot_loop(long n);
__asm__(".text\n .globl hot_loop\n .type hot_loop,@function\n"
        "hot_loop:\n xor %eax,%eax\n"
        "1: add $1,%rax\n cmp %rdi,%rax\n jne 1b\n ret\n .size hot_loop,.-hot_loop\n");

/* long hot_sp_loop(long n): saves rsp and n, then counts rax up to n (n >= 1).
 * Boundaries: +0 mov, +7 mov, +14 xor, +16 add, +20 cmp, +23 jne, +25 ret. */
long hot_sp_loop(long n);
extern const char hot_sp_loop_end[];
volatile uintptr_t hot_sp, hot_n;
__asm__(".text\n .globl hot_sp_loop\n .type hot_sp_loop,@function\n"
        "hot_sp_loop:\n mov %rsp,hot_sp(%rip)\n mov %rdi,hot_n(%rip)\n xor %eax,%eax\n"
        "1: add $1,%rax\n cmp %rdi,%rax\n jne 1b\n ret\n"
        " .globl hot_sp_loop_end\nhot_sp_loop_end:\n .size hot_sp_loop,.-hot_sp_loop\n");

/* ---- altstack ---------------------------------------------------------------------------- */

#define ALT_SIZE (256 * 1024)
static char *alt;
static volatile int seen_alt, seen_onstack, seen_disabled, runs;

static void where(void)
{
    volatile char local = 0;
    stack_t ss;
    sigaltstack(NULL, &ss);
    seen_alt = (char *)&local >= alt && (char *)&local < alt + ALT_SIZE;
    seen_onstack = (ss.ss_flags & SS_ONSTACK) != 0;
    seen_disabled = (ss.ss_flags & SS_DISABLE) != 0;
    runs++;
}

static void on_plain(int s)
{
    (void)s;
    where();
}

static void on_info(int s, siginfo_t *si, void *ucv)
{
    (void)s;
    (void)si;
    ucontext_t *uc = ucv;
    where();
    uc->uc_mcontext.gregs[REG_RAX] = 42;
    uc->uc_mcontext.fpregs->_xmm[0].element[0] = 4242;
}

static sigjmp_buf jb;
static void on_segv(int s)
{
    (void)s;
    where();
    siglongjmp(jb, 1);
}

static void install(int sig, int onstack, int info)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sigemptyset(&sa.sa_mask);
    if (info) {
        sa.sa_sigaction = on_info;
        sa.sa_flags = SA_SIGINFO;
    } else {
        sa.sa_handler = sig == SIGSEGV ? on_segv : on_plain;
    }
    if (onstack)
        sa.sa_flags |= SA_ONSTACK;
    sigaction(sig, &sa, 0);
}

static void line(const char *what)
{
    printf("%s: ran=%d on_alt=%d ss_onstack=%d\n", what, runs, seen_alt, seen_onstack);
    runs = seen_alt = seen_onstack = 0;
}

/* An int3 of the program's own; rax and xmm0 as the handler left them in its ucontext. */
static void own_int3(long *rax, long *xmm0)
{
    long a, x;
    __asm__ volatile("xor %%eax,%%eax\n pxor %%xmm0,%%xmm0\n int3\n movq %%xmm0,%1\n"
                     : "=a"(a), "=r"(x)
                     :
                     : "xmm0", "memory");
    *rax = a;
    *xmm0 = x;
}

static volatile int nested_onstack;
static void on_usr1(int s)
{
    (void)s;
    install(SIGTRAP, nested_onstack, 0);
    raise(SIGTRAP);
}

static int altstack_mode(void)
{
    mark(1);
    alt = malloc(ALT_SIZE);
    stack_t ss = {.ss_sp = alt, .ss_size = ALT_SIZE, .ss_flags = 0};
    if (sigaltstack(&ss, 0) != 0) {
        perror("sigaltstack");
        return 2;
    }
    install(SIGTRAP, 1, 0);
    raise(SIGTRAP);
    line("raise, SA_ONSTACK");
    install(SIGTRAP, 0, 0);
    raise(SIGTRAP);
    line("raise, no SA_ONSTACK");
    long rax, xmm0;
    install(SIGTRAP, 1, 1);
    own_int3(&rax, &xmm0);
    line("int3, SA_ONSTACK");
    printf("  rax=%ld xmm0=%ld\n", rax, xmm0);
    install(SIGTRAP, 0, 1);
    own_int3(&rax, &xmm0);
    line("int3, no SA_ONSTACK");
    printf("  rax=%ld xmm0=%ld\n", rax, xmm0);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sa.sa_flags = SA_ONSTACK;
    sigaction(SIGUSR1, &sa, 0);
    nested_onstack = 0;
    raise(SIGUSR1);
    line("raise from a handler on the signal stack, no SA_ONSTACK");
    nested_onstack = 1;
    raise(SIGUSR1);
    line("raise from a handler on the signal stack, SA_ONSTACK");
    for (int onstack = 1; onstack >= 0; onstack--) {
        install(SIGSEGV, onstack, 0);
        if (!sigsetjmp(jb, 1))
            *(volatile long *)(uintptr_t)mark(-1) = 1;
        line(onstack ? "SIGSEGV, SA_ONSTACK" : "SIGSEGV, no SA_ONSTACK");
    }
    /* SS_AUTODISARM: the kernel disarms the signal stack while a handler runs on it. */
    ss.ss_flags = SS_AUTODISARM;
    if (sigaltstack(&ss, 0) == 0) {
        for (int onstack = 1; onstack >= 0; onstack--) {
            install(SIGTRAP, onstack, 0);
            raise(SIGTRAP);
            printf("autodisarm, %s: ran=%d on_alt=%d ss_disabled=%d\n",
                   onstack ? "SA_ONSTACK" : "no SA_ONSTACK", runs, seen_alt, seen_disabled);
            runs = 0;
        }
        stack_t now;
        sigaltstack(0, &now);
        printf("autodisarm after: armed=%d\n", now.ss_sp == alt && !(now.ss_flags & SS_DISABLE));
    }
    printf("mark=%ld\n", mark(0));
    return 0;
}

/* ---- pcs --------------------------------------------------------------------------------- */

static struct range {
    uintptr_t lo, hi;
} ranges[256];
static int nranges;

static int add_object(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    (void)data;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *p = &info->dlpi_phdr[i];
        if (p->p_type == PT_LOAD && (p->p_flags & PF_X) && nranges < 256) {
            ranges[nranges].lo = info->dlpi_addr + p->p_vaddr;
            ranges[nranges].hi = info->dlpi_addr + p->p_vaddr + p->p_memsz;
            nranges++;
        }
    }
    return 0;
}

static volatile long ticks, outside;
static volatile uintptr_t first_outside;

static void on_tick(int s, siginfo_t *si, void *ucv)
{
    (void)s;
    (void)si;
    uintptr_t pc = ((ucontext_t *)ucv)->uc_mcontext.gregs[REG_RIP];
    ticks++;
    for (int i = 0; i < nranges; i++)
        if (pc >= ranges[i].lo && pc < ranges[i].hi)
            return;
    if (!outside++)
        first_outside = pc;
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

/* Runs loop(1000) under a 1 ms ITIMER_REAL whose SA_SIGINFO handler is `tick` until *count
 * reaches `target` (a count of ticks, not a time: a loaded machine delivers fewer a second;
 * 120 s at most); returns whether every call counted to 1000. */
static int under_timer(long target, volatile long *count, void (*tick)(int, siginfo_t *, void *),
                       long (*loop)(long))
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = tick;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigaction(SIGALRM, &sa, 0);
    struct itimerval it = {{0, 1000}, {0, 1000}};
    setitimer(ITIMER_REAL, &it, 0);
    double end = now() + 120;
    long sum = 0;
    while (*count < target && now() < end)
        sum += loop(1000);
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, 0);
    return sum % 1000 == 0;
}

static int pcs_mode(long target)
{
    dl_iterate_phdr(add_object, 0);
    int ok = under_timer(target, &ticks, on_tick, hot_loop);
    printf("ticks=%ld outside=%ld first_outside=%#lx sum_ok=%d\n", ticks, outside,
           (unsigned long)first_outside, ok);
    return 0;
}

/* ---- regs -------------------------------------------------------------------------------- */

static volatile long in_loop, bad_pc, bad_sp, bad_args, bad_flags;

static void on_tick_regs(int s, siginfo_t *si, void *ucv)
{
    (void)s;
    (void)si;
    greg_t *g = ((ucontext_t *)ucv)->uc_mcontext.gregs;
    uintptr_t pc = g[REG_RIP], lo = (uintptr_t)hot_sp_loop;
    ticks++;
    if (pc < lo || pc >= (uintptr_t)hot_sp_loop_end)
        return;
    in_loop++;
    uintptr_t off = pc - lo, rax = g[REG_RAX], rdi = g[REG_RDI], fl = g[REG_EFL];
    if (off != 0 && off != 7 && off != 14 && off != 16 && off != 20 && off != 23 && off != 25)
        bad_pc++;
    if (off >= 7 && (uintptr_t)g[REG_RSP] != hot_sp)
        bad_sp++;
    if (off >= 14 && (rdi != hot_n || (off >= 16 && rax > rdi)))
        bad_args++;
    int cf = fl & 1, zf = (fl >> 6) & 1, sf = (fl >> 7) & 1, of = (fl >> 11) & 1;
    if (off == 20 && (cf || zf || sf || of))
        bad_flags++; /* after add $1 to 0..n-1 */
    if (off == 23 && (zf != (rax == rdi) || cf != (rax < rdi) || sf != cf || of))
        bad_flags++; /* after cmp %rdi,%rax */
}

static int regs_mode(long target)
{
    int ok = under_timer(target, &in_loop, on_tick_regs, hot_sp_loop);
    printf("ticks=%ld in_loop=%ld bad_pc=%ld bad_sp=%ld bad_args=%ld bad_flags=%ld sum_ok=%d\n",
           ticks, in_loop, bad_pc, bad_sp, bad_args, bad_flags, ok);
    return 0;
}

/* ---- actions ----------------------------------------------------------------------------- */

static volatile int got[65];
static void count_sig(int s)
{
    got[s]++;
}
static void count_info(int s, siginfo_t *si, void *uc)
{
    (void)si;
    (void)uc;
    got[s]++;
}

static void readback(const char *what, int sig)
{
    struct sigaction o;
    sigaction(sig, 0, &o);
    const char *h = o.sa_handler == SIG_DFL                   ? "DFL"
                    : o.sa_handler == SIG_IGN                 ? "IGN"
                    : o.sa_handler == count_sig               ? "count_sig"
                    : (void *)o.sa_sigaction == (void *)count_info ? "count_info"
                                                              : "other";
    printf("%s: %s flags=%#x usr2_in_mask=%d got=%d\n", what, h, (unsigned)o.sa_flags,
           sigismember(&o.sa_mask, SIGUSR2), got[sig]);
}

static int actions_mode(void)
{
    mark(1);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = count_sig;
    sa.sa_flags = SA_RESETHAND | SA_RESTART;
    sigaddset(&sa.sa_mask, SIGUSR2);
    sigaction(SIGUSR1, &sa, 0);
    readback("usr1 resethand", SIGUSR1);
    raise(SIGUSR1);
    readback("usr1 after delivery", SIGUSR1);
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = count_info;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    struct sigaction prev;
    sigaction(SIGUSR1, &sa, &prev);
    printf("prev was %s\n", prev.sa_handler == SIG_DFL ? "DFL" : "other");
    raise(SIGUSR1);
    readback("usr1 siginfo", SIGUSR1);
    void (*p)(int) = signal(SIGUSR2, count_sig);
    printf("signal usr2 prev %s\n", p == SIG_DFL ? "DFL" : "other");
    p = signal(SIGUSR2, SIG_IGN);
    printf("signal usr2 prev %s\n", p == count_sig ? "count_sig" : "other");
    raise(SIGUSR2);
    p = signal(SIGUSR2, count_sig);
    printf("signal usr2 prev %s\n", p == SIG_IGN ? "IGN" : "other");
    raise(SIGUSR2);
    readback("usr2 signal", SIGUSR2);
    p = sigset(SIGALRM, count_sig);
    raise(SIGALRM);
    readback("alrm sigset", SIGALRM);
    p = sigset(SIGALRM, SIG_DFL);
    printf("sigset alrm prev %s\n", p == count_sig ? "count_sig" : "other");
    return 0;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "altstack";
    if (!strcmp(mode, "altstack"))
        return altstack_mode();
    if (!strcmp(mode, "actions"))
        return actions_mode();
    if (!strcmp(mode, "pcs"))
        return pcs_mode(argc > 2 ? atol(argv[2]) : 1000);
    if (!strcmp(mode, "regs"))
        return regs_mode(argc > 2 ? atol(argv[2]) : 1000);
    fprintf(stderr, "unknown mode %s\n", mode);
    return 2;
}
