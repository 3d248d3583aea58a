/* probepath MODE [ARGS]: what a probe must not change in a program (issue 10). Built with
 * -fpatchable-function-entry=5: report, work, spin, stress_site, final_call have ftrace sites;
 * report_nosite (patchable_function_entry(0)) and get, stress_call, stress_load (assembly)
 * have none, so
 * probes there are int3 probes. Every mode prints what it saw and exits 0 (resethand: killed
 * by its second SIGTRAP).
 *
 *   errno          open() fails (ENOENT), then report("open", NULL) and
 *                  report_nosite("open", NULL) print the errno they see
 *   ign            ignores SIGTRAP; raise, kill from itself and kill from a child process
 *   resethand      SA_RESETHAND handler: the first raise runs it, the second kills
 *   mask           SA_SIGINFO handler with SIGUSR1 in sa_mask, raising SIGTRAP inside itself:
 *                  without SA_NODEFER the nested one waits until the handler returns
 *   slotfault N M  N times get(NULL) under sigsetjmp, whose SIGSEGV handler says whether the
 *                  faulting PC is inside get and siglongjmps out; then work() M times
 *   itimer R       R rounds of spin() until a 2 ms itimer's handler siglongjmps out of the
 *                  loop; then (after 0.3 s, for the tracer to drain its ring) final_call() 5
 *                  times
 *   dlopen LIB     a thread dlopens LIB (whose constructor sleeps 1 s); meanwhile the main
 *                  thread times one pthread_sigmask call
 *   stress SECS T  T threads (each with its own 2 ms timer whose handler siglongjmps out)
 *                  call stress_site, stress_call and stress_load for SECS seconds; prints,
 *                  per function, the calls completed (done), those a jump cut short (cut)
 *                  and, of those, the ones cut after the probe point (fired, from the
 *                  interrupted PC), of which in ftprobe's code (in_probe: a PC outside the
 *                  program's); the monotonic time the threads stopped (t_end); then
 *                  final_call() 5 times, and how many deliveries had a siginfo that
 *                  was not the timer's (bad_siginfo)
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#define NOSITE __attribute__((noinline, patchable_function_entry(0, 0)))

__attribute__((noinline)) void report(const char *what, const char *detail)
{
    int e = errno;
    printf("%s: %s errno=%d (%s)\n", what, detail ? detail : "-", e, strerror(e));
}

NOSITE void report_nosite(const char *what, const char *detail)
{
    int e = errno;
    printf("%s (no site): %s errno=%d (%s)\n", what, detail ? detail : "-", e, strerror(e));
}

__attribute__((noinline)) long work(long x)
{
    __asm__ volatile("");
    return x + 1;
}

__attribute__((noinline)) long spin(long x)
{
    for (int i = 0; i < 50; i++)
        __asm__ volatile("" : "+r"(x));
    return x + 1;
}

/* stress: each function counts its own completion with its last store (*done += 1) before
 * it returns, so a call is either completed (counted) or cut: then the interrupted PC says
 * whether its probe fired.
 * stress_site has an ftrace site at its entry (the function tracer and a kprobe event).
 * stress_call's first instruction is a call: an int3 probe on it is emulated (no slot), the
 * thread goes on in stress_body, so a PC at stress_call is "not fired" and any later one
 * "fired". stress_load's first instruction is a movups (not boosted): its slot runs with
 * signals blocked and traps back to the next instruction, so the same holds. */
__attribute__((noinline)) long stress_site(long x, volatile long *done)
{
    for (int i = 0; i < 50; i++)
        __asm__ volatile("" : "+r"(x));
    *done += 1;
    return x + 1;
}

long stress_call(long x, volatile long *done);
long stress_load(const char *s, volatile long *done);
__asm__(".text\n"
        " .globl stress_call\n .type stress_call,@function\n"
        "stress_call:\n call stress_body\n incq (%rsi)\n ret\n .size stress_call,.-stress_call\n"
        " .globl stress_body\n .type stress_body,@function\n"
        "stress_body:\n mov %rdi,%rax\n mov $50,%ecx\n"
        "1:\n dec %ecx\n jnz 1b\n inc %rax\n ret\n .size stress_body,.-stress_body\n"
        " .globl stress_load\n .type stress_load,@function\n"
        "stress_load:\n movups (%rdi),%xmm0\n movsbq (%rdi),%rax\n incq (%rsi)\n ret\n"
        " .size stress_load,.-stress_load\n");

__attribute__((noinline)) long final_call(long x)
{
    __asm__ volatile("");
    return x * 2;
}

/* long get(const long *p): one load, by movups (0f 10: an instruction the kprobes tables do
 * not boost, so an int3 probe on it steps through a slot that ends with a trap). */
long get(const long *p);
__asm__(".text\n .globl get\n .type get,@function\n"
        "get:\n movups (%rdi),%xmm0\n movq %xmm0,%rax\n ret\n .size get,.-get\n");

static volatile int traps, depth, maxdepth, usr1_blocked, code_tkill;

static void count_trap(int s)
{
    (void)s;
    traps++;
}

static void trap_info(int s, siginfo_t *si, void *uc)
{
    (void)s;
    (void)uc;
    depth++;
    if (depth > maxdepth)
        maxdepth = depth;
    sigset_t cur;
    pthread_sigmask(SIG_SETMASK, 0, &cur);
    usr1_blocked = sigismember(&cur, SIGUSR1);
    code_tkill = si->si_code == SI_TKILL;
    if (traps++ == 0)
        raise(SIGTRAP);
    depth--;
}

static sigjmp_buf jb;
static volatile int faults, inside, jumping;

static void on_segv(int s, siginfo_t *si, void *ucv)
{
    (void)s;
    (void)si;
    ucontext_t *uc = ucv;
    uintptr_t pc = uc->uc_mcontext.gregs[REG_RIP];
    if (pc >= (uintptr_t)get && pc < (uintptr_t)get + 16)
        inside++;
    faults++;
    siglongjmp(jb, 1);
}

static void on_alarm(int s)
{
    (void)s;
    if (jumping)
        siglongjmp(jb, 1);
}

static void *slow_dlopen(void *lib)
{
    if (!dlopen(lib, RTLD_NOW))
        fprintf(stderr, "dlopen: %s\n", dlerror());
    return 0;
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

/* stress: per thread, its own timer and jump buffer. */
static __thread sigjmp_buf tjb;
static __thread volatile int tjumping;
static volatile int stop;
struct counts {
    volatile long done[3], cut[3], fired[3], in_probe[3];
};
/* The call in flight (0 stress_site, 1 stress_call, 2 stress_load; -1 none), its counter's
 * value before the call, and this thread's counts. */
static __thread volatile int which = -1;
static __thread volatile long before;
static __thread struct counts *mine;
/* The probe point of each function: the ftrace site (after an endbr64 if there is one), the
 * int3 probes' first instruction. */
static uintptr_t probe_point[3];
/* stress_thread's code: a PC there with the call not completed is before the call. */
extern const char __start_stress_caller[], __stop_stress_caller[];
/* The program's code (a fired cut with a PC outside it was in ftprobe's code). */
extern const char __executable_start[], etext[];
static const char fetched[16] __attribute__((aligned(16))) = "fetched";

/* Deliveries whose siginfo is not the timer's (a signal ftprobe held must keep it). */
static long bad_siginfo;

static void on_thread_alarm(int s, siginfo_t *si, void *ucv)
{
    (void)s;
    if (si->si_code != SI_TIMER)
        __atomic_fetch_add(&bad_siginfo, 1, __ATOMIC_RELAXED);
    if (!tjumping)
        return;
    int k = which;
    if (k >= 0 && mine->done[k] == before) {
        uintptr_t pc = ((ucontext_t *)ucv)->uc_mcontext.gregs[REG_RIP];
        uintptr_t entry = k == 0 ? (uintptr_t)stress_site : k == 1 ? (uintptr_t)stress_call
                                                                   : (uintptr_t)stress_load;
        int before_call = pc >= (uintptr_t)__start_stress_caller &&
                          pc < (uintptr_t)__stop_stress_caller;
        int before_probe = pc >= entry && pc <= probe_point[k];
        mine->cut[k]++;
        if (!before_call && !before_probe) {
            mine->fired[k]++;
            if (pc < (uintptr_t)__executable_start || pc >= (uintptr_t)etext)
                mine->in_probe[k]++;
        }
    }
    /* siglongjmp unblocks SIGALRM before it jumps: a signal then must not count this call
     * again, nor jump. */
    which = -1;
    tjumping = 0;
    siglongjmp(tjb, 1);
}

__attribute__((section("stress_caller"), noinline)) static void *stress_thread(void *arg)
{
    struct counts *c = arg;
    mine = c;
    struct sigevent ev = {0};
    ev.sigev_notify = SIGEV_THREAD_ID;
    ev.sigev_signo = SIGALRM;
    ev._sigev_un._tid = gettid();
    timer_t t;
    if (timer_create(CLOCK_MONOTONIC, &ev, &t) != 0) {
        perror("timer_create");
        exit(2);
    }
    struct itimerspec its = {{0, 2000000}, {0, 2000000}};
    timer_settime(t, 0, &its, 0);
    volatile long i = 0;
    while (!stop) {
        if (sigsetjmp(tjb, 1)) {
            tjumping = 0;
            which = -1;
            continue;
        }
        tjumping = 1;
        for (; !stop; i++) {
            int k = i % 3;
            before = c->done[k];
            which = k;
            __asm__ volatile("" ::: "memory");
            if (k == 0)
                stress_site(i, &c->done[0]);
            else if (k == 1)
                stress_call(i, &c->done[1]);
            else
                stress_load(fetched, &c->done[2]);
            __asm__ volatile("" ::: "memory");
            which = -1;
        }
        tjumping = 0;
    }
    struct itimerspec off = {{0, 0}, {0, 0}};
    timer_settime(t, 0, &off, 0);
    timer_delete(t);
    return 0;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "errno";
    if (!strcmp(mode, "errno")) {
        int fd = open("/nonexistent/ftprobe-probepath", O_RDONLY);
        report("open", NULL);
        fd = open("/nonexistent/ftprobe-probepath", O_RDONLY);
        report_nosite("open", NULL);
        return fd == -1 ? 0 : 1;
    }
    if (!strcmp(mode, "ign")) {
        signal(SIGTRAP, SIG_IGN);
        work(1);
        raise(SIGTRAP);
        kill(getpid(), SIGTRAP);
        pid_t c = fork();
        if (c == 0) {
            kill(getppid(), SIGTRAP);
            _exit(0);
        }
        int st;
        waitpid(c, &st, 0);
        usleep(10000);
        work(2);
        printf("ignored SIGTRAP from raise, kill and another process: alive\n");
        return 0;
    }
    if (!strcmp(mode, "resethand")) {
        struct sigaction sa = {0}, old;
        sa.sa_handler = count_trap;
        sa.sa_flags = SA_RESETHAND;
        sigaction(SIGTRAP, &sa, 0);
        work(1);
        raise(SIGTRAP);
        sigaction(SIGTRAP, 0, &old);
        printf("first: traps=%d reset=%d\n", traps, old.sa_handler == SIG_DFL);
        fflush(stdout);
        work(2);
        raise(SIGTRAP);
        printf("second: traps=%d\n", traps);
        return 0;
    }
    if (!strcmp(mode, "mask")) {
        struct sigaction sa = {0};
        sa.sa_sigaction = trap_info;
        sa.sa_flags = SA_SIGINFO;
        sigemptyset(&sa.sa_mask);
        sigaddset(&sa.sa_mask, SIGUSR1);
        sigaction(SIGTRAP, &sa, 0);
        work(1);
        raise(SIGTRAP);
        printf("deferred: traps=%d maxdepth=%d usr1_blocked=%d si_code_tkill=%d\n", traps,
               maxdepth, usr1_blocked, code_tkill);
        traps = maxdepth = 0;
        sa.sa_flags = SA_SIGINFO | SA_NODEFER;
        sigaction(SIGTRAP, &sa, 0);
        raise(SIGTRAP);
        printf("nodefer: traps=%d maxdepth=%d\n", traps, maxdepth);
        sigset_t cur;
        pthread_sigmask(SIG_SETMASK, 0, &cur);
        printf("after: usr1_blocked=%d\n", sigismember(&cur, SIGUSR1));
        work(2);
        return 0;
    }
    if (!strcmp(mode, "slotfault")) {
        int n = argc > 2 ? atoi(argv[2]) : 3, m = argc > 3 ? atoi(argv[3]) : 4;
        struct sigaction sa = {0};
        sa.sa_sigaction = on_segv;
        sa.sa_flags = SA_SIGINFO;
        sigaction(SIGSEGV, &sa, 0);
        for (int i = 0; i < n; i++)
            if (!sigsetjmp(jb, 1))
                get(0);
        long s = 0;
        for (int i = 0; i < m; i++)
            s += work(i);
        long ok = 7;
        printf("faults=%d inside=%d work=%d get=%ld s=%ld\n", faults, inside, m, get(&ok), s);
        return 0;
    }
    if (!strcmp(mode, "itimer")) {
        int rounds = argc > 2 ? atoi(argv[2]) : 20;
        signal(SIGALRM, on_alarm);
        struct itimerval it = {{0, 2000}, {0, 2000}};
        setitimer(ITIMER_REAL, &it, 0);
        for (volatile int r = 0; r < rounds; r++) {
            if (!sigsetjmp(jb, 1)) {
                jumping = 1;
                for (long i = 0;; i++)
                    spin(i);
            }
            jumping = 0;
        }
        struct itimerval off = {{0, 0}, {0, 0}};
        setitimer(ITIMER_REAL, &off, 0);
        /* Time for the tracer to drain a ring the loop filled. */
        usleep(300000);
        long s = 0;
        for (int i = 0; i < 5; i++)
            s += final_call(i);
        printf("rounds=%d final_call=5 s=%ld\n", rounds, s);
        return 0;
    }
    if (!strcmp(mode, "dlopen")) {
        pthread_t t;
        pthread_create(&t, 0, slow_dlopen, argv[2]);
        usleep(200000);
        sigset_t set;
        sigemptyset(&set);
        sigaddset(&set, SIGUSR1);
        double t0 = now();
        pthread_sigmask(SIG_BLOCK, &set, 0);
        double ms = (now() - t0) * 1000;
        pthread_join(t, 0);
        printf("pthread_sigmask_ms=%.0f\n", ms);
        return 0;
    }
    if (!strcmp(mode, "stress")) {
        int secs = argc > 2 ? atoi(argv[2]) : 10, n = argc > 3 ? atoi(argv[3]) : 4;
        if (n > 16)
            n = 16;
        const unsigned char *site = (const unsigned char *)stress_site;
        static const unsigned char endbr64[4] = {0xf3, 0x0f, 0x1e, 0xfa};
        probe_point[0] = (uintptr_t)site + (memcmp(site, endbr64, 4) ? 0 : 4);
        probe_point[1] = (uintptr_t)stress_call;
        probe_point[2] = (uintptr_t)stress_load;
        struct sigaction sa = {0};
        sa.sa_sigaction = on_thread_alarm;
        sa.sa_flags = SA_SIGINFO;
        sigaction(SIGALRM, &sa, 0);
        pthread_t t[16];
        static struct counts c[16];
        for (int i = 0; i < n; i++)
            pthread_create(&t[i], 0, stress_thread, &c[i]);
        sleep(secs);
        stop = 1;
        double t_end = now();
        struct counts sum = {{0}, {0}, {0}, {0}};
        for (int i = 0; i < n; i++) {
            pthread_join(t[i], 0);
            for (int k = 0; k < 3; k++) {
                sum.done[k] += c[i].done[k];
                sum.cut[k] += c[i].cut[k];
                sum.fired[k] += c[i].fired[k];
                sum.in_probe[k] += c[i].in_probe[k];
            }
        }
        usleep(300000);
        long s = 0;
        for (int i = 0; i < 5; i++)
            s += final_call(i);
        static const char *names[3] = {"site", "call", "load"};
        for (int k = 0; k < 3; k++)
            printf("%s: done=%ld cut=%ld fired=%ld in_probe=%ld\n", names[k], sum.done[k],
                   sum.cut[k], sum.fired[k], sum.in_probe[k]);
        printf("t_end=%.6f final_call=5 s=%ld bad_siginfo=%ld\n", t_end, s, bad_siginfo);
        return 0;
    }
    fprintf(stderr, "unknown mode %s\n", mode);
    return 2;
}
