/* nofault MODE [N]: bad pointers for fetch args that read memory (ftprobe's fault-safe
 * reads), and a program's own faults next to them.
 *
 * `take(t, s, p)` is the probed function: it never reads through its arguments (the program
 * itself never faults there), so a probe with `+0(%di)`, `+8(%di):string`, `+0(%si):string`,
 * `+0(%dx)` reads whatever they point to.
 *
 * MODE
 *   bad       calls take 8 times (see `bad` below for each call's pointers), prints
 *             `bad calls=8`, exits 0.
 *   handler   a SIGSEGV handler (SA_SIGINFO) that recovers by siglongjmp; N times (default
 *             5): take(NULL, a PROT_NONE page, the page + 8), then a load of the page + 64 *
 *             i at the instruction `fx_fault_insn`. The handler checks each fault's si_addr
 *             and PC; prints `handler faults=F good=G`, exits 0.
 *   altstack  as handler, but the handler runs on a sigaltstack (SA_ONSTACK), checks that it
 *             does, and recovers by mprotect(PROT_READ) and returning (the load is retried);
 *             the page is made PROT_NONE again before the next one; prints `altstack
 *             faults=F good=G onstack=O`.
 *   overflow  take with bad pointers 3 times, then a recursion that overflows the stack; a
 *             SIGSEGV handler on a sigaltstack (SA_ONSTACK) catches it and siglongjmps out;
 *             prints `overflow caught=1 onstack=1`.
 *   blocked   take with bad pointers while SIGSEGV and SIGBUS are blocked, where a fault
 *             would kill: 3 times with them blocked by pthread_sigmask, 3 times in a thread
 *             started with every signal blocked, 3 times in a SIGUSR1 handler whose sa_mask
 *             is full; prints `blocked calls=9`.
 *   die       sets RLIMIT_CORE to N bytes (at most its hard limit; 0: no core file), calls
 *             take with bad pointers 3 times, prints `die before`, then loads from address 16
 *             with no handler: dies of SIGSEGV (with a core file in the current directory, cut
 *             at N bytes, if the system writes them there).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <ucontext.h>
#include <unistd.h>

struct rec {
    uint64_t id;
    const char *name;
};

static volatile long sink;

__attribute__((noinline)) long take(const struct rec *t, const char *s, const uint64_t *p)
{
    /* Uses the pointers' values only. */
    sink += (long)(uintptr_t)t ^ (long)(uintptr_t)s ^ (long)(uintptr_t)p;
    return 1;
}

static long page;

static char *map(size_t len, int prot)
{
    char *m = mmap(NULL, len, prot, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
        perror("mmap");
        exit(2);
    }
    return m;
}

/* Two pages whose second is unmapped (hole = 1) or PROT_NONE (hole = 0); the last 32 bytes
 * of the first: an id, a pointer to "in-page", 16 'Z' (no NUL). Returns the first page's
 * end. */
static char *edge(int hole)
{
    char *m = map(2 * page, PROT_READ | PROT_WRITE);
    char *end = m + page;
    if (hole ? munmap(end, page) : mprotect(end, page, PROT_NONE)) {
        perror("edge");
        exit(2);
    }
    uint64_t id = 0x0102030405060708ull;
    static const char *in_page = "in-page";
    memcpy(end - 32, &id, 8);
    memcpy(end - 24, &in_page, 8);
    memset(end - 16, 'Z', 16);
    return end;
}

static void bad(void)
{
    long calls = 0;
    static struct rec good = {0x1122334455667788ull, "good-name"};
    static const uint64_t v = 42;
    char *unmapped = map(page, PROT_READ);
    munmap(unmapped, page);
    char *none = map(page, PROT_NONE);
    char *a = edge(1), *b = edge(0);
    /* 0: good pointers. */
    calls += take(&good, "good string", &v);
    /* 1: NULL. */
    calls += take(NULL, NULL, NULL);
    /* 2: an unmapped page. */
    calls += take((void *)unmapped, unmapped, (void *)unmapped);
    /* 3: a PROT_NONE page. */
    calls += take((void *)none, none, (void *)none);
    /* 4, 5: at the end of a mapping followed by a hole, then by a PROT_NONE page: the id and
     * name are in the page, the string runs into the next one, the word straddles it. */
    calls += take((void *)(a - 32), a - 16, (void *)(a - 4));
    calls += take((void *)(b - 32), b - 16, (void *)(b - 4));
    /* 6: 'Z' * 8 as an id, and as a pointer (non-canonical: #GP, not #PF). */
    calls += take((void *)(b - 16), b - 16, (void *)(b - 8));
    /* 7: a file mapping past its file's end (SIGBUS). */
    FILE *f = tmpfile();
    char *bus = mmap(NULL, page, PROT_READ, MAP_SHARED, fileno(f), 0);
    if (bus == MAP_FAILED) {
        perror("mmap file");
        exit(2);
    }
    calls += take((void *)bus, bus, (void *)bus);
    printf("bad calls=%ld\n", calls);
}

/* The faulting load of handler/altstack: its address is known to the handler. */
extern const char fx_fault_insn[];
__attribute__((noinline)) static long load_at(const volatile long *p)
{
    long v;
    __asm__ volatile("fx_fault_insn: movq (%1), %0" : "=r"(v) : "r"(p) : "memory");
    return v;
}

static sigjmp_buf env;
static char *target_page;
static volatile char *expected_addr;
static volatile int faults, good, onstack;
static char *alt_lo, *alt_hi;
static int recover_by_mprotect;

static void on_segv(int sig, siginfo_t *si, void *ctx)
{
    ucontext_t *uc = ctx;
    char here;
    (void)sig;
    faults++;
    if (si->si_addr == (void *)expected_addr &&
        uc->uc_mcontext.gregs[REG_RIP] == (greg_t)(uintptr_t)fx_fault_insn)
        good++;
    if (&here >= alt_lo && &here < alt_hi)
        onstack++;
    if (recover_by_mprotect) {
        mprotect(target_page, page, PROT_READ);
        return;
    }
    siglongjmp(env, 1);
}

static void on_altstack(void)
{
    size_t len = 256 * 1024;
    alt_lo = map(len, PROT_READ | PROT_WRITE);
    alt_hi = alt_lo + len;
    stack_t ss = {.ss_sp = alt_lo, .ss_size = len, .ss_flags = 0};
    if (sigaltstack(&ss, NULL)) {
        perror("sigaltstack");
        exit(2);
    }
}

static void own_faults(const char *mode, int n, int alt)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO | (alt ? SA_ONSTACK : 0);
    sigemptyset(&sa.sa_mask);
    if (alt)
        on_altstack();
    recover_by_mprotect = alt;
    sigaction(SIGSEGV, &sa, NULL);
    target_page = map(page, PROT_NONE);
    for (int i = 0; i < n; i++) {
        take(NULL, target_page, (void *)(target_page + 8));
        expected_addr = target_page + 64 * (i % 64);
        if (alt) {
            sink += load_at((volatile long *)expected_addr);
            mprotect(target_page, page, PROT_NONE);
        } else if (sigsetjmp(env, 1) == 0) {
            sink += load_at((volatile long *)expected_addr);
        }
    }
    if (alt)
        printf("%s faults=%d good=%d onstack=%d\n", mode, faults, good, onstack);
    else
        printf("%s faults=%d good=%d\n", mode, faults, good);
}

__attribute__((noinline)) static long deep(long n)
{
    volatile char pad[1024];
    pad[0] = (char)n;
    return deep(n + 1) + pad[0];
}

static void on_overflow(int sig, siginfo_t *si, void *ctx)
{
    char here;
    (void)sig, (void)si, (void)ctx;
    faults++;
    if (&here >= alt_lo && &here < alt_hi)
        onstack++;
    siglongjmp(env, 1);
}

static void overflow(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_overflow;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    on_altstack();
    sigaction(SIGSEGV, &sa, NULL);
    for (int i = 0; i < 3; i++)
        take(NULL, (void *)16, (void *)16);
    if (sigsetjmp(env, 1) == 0)
        sink += deep(0);
    printf("overflow caught=%d onstack=%d\n", faults, onstack);
}

static long blocked_calls;

static void three_bad(void)
{
    for (int i = 0; i < 3; i++)
        blocked_calls += take(NULL, (void *)16, (void *)16);
}

static void *blocked_thread(void *arg)
{
    (void)arg;
    three_bad();
    return NULL;
}

static void on_usr1(int sig)
{
    (void)sig;
    three_bad();
}

static void blocked(void)
{
    sigset_t s, all, old;
    sigemptyset(&s);
    sigaddset(&s, SIGSEGV);
    sigaddset(&s, SIGBUS);
    pthread_sigmask(SIG_BLOCK, &s, &old);
    three_bad();
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    /* A thread that starts with every signal blocked (inherited: its first hit asks). */
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    pthread_t t;
    pthread_create(&t, NULL, blocked_thread, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_join(t, NULL);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sigfillset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, NULL);
    raise(SIGUSR1);
    printf("blocked calls=%ld\n", blocked_calls);
}

static void die(long core)
{
    struct rlimit r;
    getrlimit(RLIMIT_CORE, &r);
    r.rlim_cur = r.rlim_max == RLIM_INFINITY || (rlim_t)core < r.rlim_max ? (rlim_t)core : r.rlim_max;
    setrlimit(RLIMIT_CORE, &r);
    for (int i = 0; i < 3; i++)
        take(NULL, (void *)16, (void *)16);
    printf("die before\n");
    fflush(stdout);
    sink += *(volatile long *)16;
    printf("die after\n");
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "bad";
    int n = argc > 2 ? atoi(argv[2]) : 5;
    page = sysconf(_SC_PAGESIZE);
    if (!strcmp(mode, "bad"))
        bad();
    else if (!strcmp(mode, "handler"))
        own_faults(mode, n, 0);
    else if (!strcmp(mode, "altstack"))
        own_faults(mode, n, 1);
    else if (!strcmp(mode, "overflow"))
        overflow();
    else if (!strcmp(mode, "blocked"))
        blocked();
    else if (!strcmp(mode, "die"))
        die(argc > 2 ? atol(argv[2]) : 0);
    else {
        fprintf(stderr, "unknown mode %s\n", mode);
        return 2;
    }
    return 0;
}
