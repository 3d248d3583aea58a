/*
 * A C program that probes its own functions through ftprobe's C API and checks what its
 * handlers saw against its own calls (exit status 1 on any mismatch).
 *
 *   gcc -O2 -Wall -Wextra -Werror kprobe_self.c $(pkg-config --cflags --libs ftprobe)
 *   ./a.out N
 *
 * - add_site has an ftrace site (the patchable_function_entry attribute, the per-function
 *   form of -fpatchable-function-entry=5): a kprobe on it is served by ftrace, no trap.
 * - mul_plain has none: a kprobe on it is an int3 probe (pre and post handlers).
 * - sub_plain has none: a kretprobe (entry_handler and handler).
 * - traced_a and traced_b have sites: an ftrace_ops filtered to "traced_*" with "traced_b" in
 *   its notrace list sees traced_a only.
 * The handlers only use atomics: they run on the probe path (async-signal-safe).
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ftprobe.h>

#define SITE __attribute__((noipa, patchable_function_entry(5, 0)))
#define PLAIN __attribute__((noipa))

SITE long add_site(long a, long b) { return a + b; }
PLAIN long mul_plain(long a, long b) { return a * b; }
PLAIN long sub_plain(long a, long b) { return a - b; }
SITE long traced_a(long x) { return x + 1; }
SITE long traced_b(long x) { return x + 2; }

static uint64_t add_hits, add_sum_di, add_sum_si, add_bad_ip;
static uint64_t mul_pre, mul_post, mul_sum_di, mul_bad_ip;
static uint64_t ret_entries, ret_returns, ret_sum, ret_bad;
static uint64_t ops_a, ops_b, ops_other;

#define INC(v, n) __atomic_fetch_add(&(v), (n), __ATOMIC_RELAXED)
#define GET(v) __atomic_load_n(&(v), __ATOMIC_RELAXED)

static int add_pre(struct kprobe *p, struct pt_regs *regs) {
    INC(add_hits, 1);
    INC(add_sum_di, regs->di);
    INC(add_sum_si, regs->si);
    if (regs->ip != (uint64_t)(uintptr_t)p->addr + 1) /* as after an int3 */
        INC(add_bad_ip, 1);
    return 0;
}

static int mul_pre_h(struct kprobe *p, struct pt_regs *regs) {
    INC(mul_pre, 1);
    INC(mul_sum_di, regs->di);
    if (regs->ip != (uint64_t)(uintptr_t)p->addr + 1)
        INC(mul_bad_ip, 1);
    return 0;
}

static void mul_post_h(struct kprobe *p, struct pt_regs *regs, unsigned long flags) {
    (void)p;
    (void)regs;
    (void)flags;
    INC(mul_post, 1);
}

static int sub_entry(struct kretprobe_instance *ri, struct pt_regs *regs) {
    INC(ret_entries, 1);
    ri->data[0] = regs->di;
    ri->data[1] = regs->si;
    return 0;
}

static int sub_ret(struct kretprobe_instance *ri, struct pt_regs *regs) {
    INC(ret_returns, 1);
    INC(ret_sum, regs->ax);
    if (regs->ax != ri->data[0] - ri->data[1])
        INC(ret_bad, 1);
    return 0;
}

static void ops_func(unsigned long ip, unsigned long parent_ip, struct ftrace_ops *op,
                     struct pt_regs *regs) {
    (void)parent_ip;
    (void)op;
    (void)regs;
    /* The site is the first instruction, or the one after endbr64. */
    if (ip == (uintptr_t)traced_a || ip == (uintptr_t)traced_a + 4)
        INC(ops_a, 1);
    else if (ip == (uintptr_t)traced_b || ip == (uintptr_t)traced_b + 4)
        INC(ops_b, 1);
    else
        INC(ops_other, 1);
}

static struct kprobe kp_add = {.pre_handler = add_pre};
static struct kprobe kp_mul = {.symbol_name = "mul_plain", .pre_handler = mul_pre_h,
                               .post_handler = mul_post_h};
static struct kretprobe rp_sub = {.kp = {.symbol_name = "sub_plain"}, .handler = sub_ret,
                                  .entry_handler = sub_entry, .data_size = 16};
static struct ftrace_ops ops = {.func = ops_func};

static int failed;

static void check(const char *what, int r) {
    if (r != 0) {
        fprintf(stderr, "%s: %d (%s): %s\n", what, r, strerror(-r), ftprobe_last_error());
        exit(1);
    }
}

static void expect(const char *what, uint64_t got, uint64_t want) {
    if (got != want) {
        fprintf(stderr, "MISMATCH %s: %llu, expected %llu\n", what, (unsigned long long)got,
                (unsigned long long)want);
        failed = 1;
    }
}

static long call_all(long i) {
    return add_site(i, 2 * i) + mul_plain(i, 3) + sub_plain(10 * i, i) + traced_a(i) +
           traced_b(i);
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 1000;
    check("ftprobe_init", ftprobe_init());

    /* Errors: the kernel's errno, and the text. */
    struct kprobe bad = {.symbol_name = "no_such_function_here"};
    int r = register_kprobe(&bad);
    printf("register_kprobe(no_such_function_here) = %d (%s)\n", r, r == -ENOENT ? "-ENOENT" : "?");
    if (r != -ENOENT || strlen(ftprobe_last_error()) == 0)
        failed = 1;
    struct kprobe both = {.symbol_name = "add_site", .addr = (void *)add_site};
    r = register_kprobe(&both);
    printf("register_kprobe(symbol_name and addr) = %d (%s)\n", r, r == -EINVAL ? "-EINVAL" : "?");
    if (r != -EINVAL)
        failed = 1;

    kp_add.addr = (void *)add_site;
    check("register_kprobe(add_site)", register_kprobe(&kp_add));
    check("register_kprobe(mul_plain)", register_kprobe(&kp_mul));
    check("register_kretprobe(sub_plain)", register_kretprobe(&rp_sub));
    check("ftrace_set_filter", ftrace_set_filter(&ops, "traced_*", 8, 1));
    check("ftrace_set_notrace", ftrace_set_notrace(&ops, "traced_b", 8, 1));
    check("register_ftrace_function", register_ftrace_function(&ops));
    printf("add_site: %s, mul_plain: %s\n", (kp_add.flags & KPROBE_FLAG_FTRACE) ? "ftrace" : "int3",
           (kp_mul.flags & KPROBE_FLAG_FTRACE) ? "ftrace" : "int3");
    if (!(kp_add.flags & KPROBE_FLAG_FTRACE) || (kp_mul.flags & KPROBE_FLAG_FTRACE))
        failed = 1;

    long total = 0;
    for (long i = 1; i <= n; i++)
        total += call_all(i);
    expect("total", (uint64_t)total,
           (uint64_t)(3 * n * (n + 1) / 2 + 3 * n * (n + 1) / 2 + 9 * n * (n + 1) / 2 +
                      n * (n + 1) / 2 + n + n * (n + 1) / 2 + 2 * n));

    /* Disabled: no hits; enabled again: hits. */
    check("disable_kprobe", disable_kprobe(&kp_add));
    for (long i = 1; i <= n; i++)
        add_site(i, i);
    check("enable_kprobe", enable_kprobe(&kp_add));
    add_site(1, 1);

    check("unregister_kprobe(add_site)", unregister_kprobe(&kp_add));
    check("unregister_kprobe(mul_plain)", unregister_kprobe(&kp_mul));
    check("unregister_kretprobe", unregister_kretprobe(&rp_sub));
    check("unregister_ftrace_function", unregister_ftrace_function(&ops));
    call_all(1); /* after unregistering: nothing counts */

    /* The same struct registered again (unregister_kprobe put its addr back to NULL), and a
     * probe registered disabled: mul_plain counts once more, add_site does not. */
    check("register_kprobe(mul_plain) again", register_kprobe(&kp_mul));
    struct kprobe kp_off = {.symbol_name = "add_site", .pre_handler = add_pre,
                            .flags = KPROBE_FLAG_DISABLED};
    check("register_kprobe(add_site, disabled)", register_kprobe(&kp_off));
    if (!(kp_off.flags & KPROBE_FLAG_DISABLED))
        failed = 1;
    mul_plain(1000, 1);
    add_site(5, 5);
    check("unregister_kprobe(mul_plain) again", unregister_kprobe(&kp_mul));
    check("unregister_kprobe(add_site, disabled)", unregister_kprobe(&kp_off));

    uint64_t s1 = (uint64_t)(n * (n + 1) / 2);
    printf("kprobe add_site: hits=%llu sum_di=%llu sum_si=%llu nmissed=%lu\n",
           (unsigned long long)GET(add_hits), (unsigned long long)GET(add_sum_di),
           (unsigned long long)GET(add_sum_si), kp_add.nmissed);
    printf("kprobe mul_plain: pre=%llu post=%llu sum_di=%llu nmissed=%lu\n",
           (unsigned long long)GET(mul_pre), (unsigned long long)GET(mul_post),
           (unsigned long long)GET(mul_sum_di), kp_mul.nmissed);
    printf("kretprobe sub_plain: entries=%llu returns=%llu sum_ax=%llu nmissed=%d\n",
           (unsigned long long)GET(ret_entries), (unsigned long long)GET(ret_returns),
           (unsigned long long)GET(ret_sum), rp_sub.nmissed);
    printf("ftrace_ops: traced_a=%llu traced_b=%llu other=%llu\n", (unsigned long long)GET(ops_a),
           (unsigned long long)GET(ops_b), (unsigned long long)GET(ops_other));

    expect("add_site hits", GET(add_hits), (uint64_t)n + 1);
    expect("add_site sum_di", GET(add_sum_di), s1 + 1);
    expect("add_site sum_si", GET(add_sum_si), 2 * s1 + 1);
    expect("add_site ip", GET(add_bad_ip), 0);
    expect("mul_plain pre", GET(mul_pre), (uint64_t)n + 1);
    expect("mul_plain post", GET(mul_post), (uint64_t)n + 1);
    expect("mul_plain sum_di", GET(mul_sum_di), s1 + 1000);
    expect("mul_plain ip", GET(mul_bad_ip), 0);
    expect("sub_plain entries", GET(ret_entries), (uint64_t)n);
    expect("sub_plain returns", GET(ret_returns), (uint64_t)n);
    expect("sub_plain sum_ax", GET(ret_sum), 9 * s1);
    expect("sub_plain ax", GET(ret_bad), 0);
    expect("traced_a", GET(ops_a), (uint64_t)n);
    expect("traced_b", GET(ops_b), 0);
    expect("other", GET(ops_other), 0);
    expect("add_site nmissed", kp_add.nmissed, 0);
    expect("mul_plain nmissed", kp_mul.nmissed, 0);
    expect("sub_plain nmissed", (uint64_t)rp_sub.nmissed, 0);
    puts(failed ? "FAILED" : "ok");
    return failed;
}
