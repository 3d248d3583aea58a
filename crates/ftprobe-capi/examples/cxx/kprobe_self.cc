// The C++ twin of examples/c/kprobe_self.c: the same probes on the same kind of functions,
// with the header included from C++ (its extern "C" guards), captureless lambdas as
// handlers and std::atomic counters (lock-free: async-signal-safe). Exit status 1 on any
// mismatch.
//
//   g++ -O2 -Wall -Wextra -Werror kprobe_self.cc $(pkg-config --cflags --libs ftprobe)
//   ./a.out N
//
// The probed functions are extern "C" so that the kprobe finds mul_plain by that name (a
// C++ function is found by its demangled name, e.g. "ns::f(long)", or its mangled one).
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <ftprobe.h>

#define SITE __attribute__((noipa, patchable_function_entry(5, 0)))
#define PLAIN __attribute__((noipa))

extern "C" {
SITE long add_site(long a, long b) { return a + b; }
PLAIN long mul_plain(long a, long b) { return a * b; }
PLAIN long sub_plain(long a, long b) { return a - b; }
SITE long traced_a(long x) { return x + 1; }
SITE long traced_b(long x) { return x + 2; }
}

namespace {

static_assert(std::atomic<uint64_t>::is_always_lock_free, "handlers need lock-free atomics");

std::atomic<uint64_t> add_hits, add_sum_di, add_sum_si, add_bad_ip;
std::atomic<uint64_t> mul_pre, mul_post, mul_sum_di, mul_bad_ip;
std::atomic<uint64_t> ret_entries, ret_returns, ret_sum, ret_bad;
std::atomic<uint64_t> ops_a, ops_b, ops_other;

constexpr auto relaxed = std::memory_order_relaxed;

bool at(unsigned long ip, long (*f)(long)) {
    auto a = reinterpret_cast<uintptr_t>(f);
    return ip == a || ip == a + 4;  // the site, or the one after endbr64
}

kprobe kp_add{};
kprobe kp_mul{};
kretprobe rp_sub{};
ftrace_ops ops{};
bool failed = false;

void check(const char *what, int r) {
    if (r != 0) {
        std::fprintf(stderr, "%s: %d (%s): %s\n", what, r, std::strerror(-r), ftprobe_last_error());
        std::exit(1);
    }
}

void expect(const char *what, uint64_t got, uint64_t want) {
    if (got != want) {
        std::fprintf(stderr, "MISMATCH %s: %llu, expected %llu\n", what,
                     static_cast<unsigned long long>(got), static_cast<unsigned long long>(want));
        failed = true;
    }
}

long call_all(long i) {
    return add_site(i, 2 * i) + mul_plain(i, 3) + sub_plain(10 * i, i) + traced_a(i) +
           traced_b(i);
}

unsigned long long get(const std::atomic<uint64_t> &v) { return v.load(relaxed); }

}  // namespace

int main(int argc, char **argv) {
    long n = argc > 1 ? std::atol(argv[1]) : 1000;
    check("ftprobe_init", ftprobe_init());

    kprobe bad{};
    bad.symbol_name = "no_such_function_here";
    int r = register_kprobe(&bad);
    std::printf("register_kprobe(no_such_function_here) = %d (%s)\n", r, r == -ENOENT ? "-ENOENT" : "?");
    if (r != -ENOENT || std::strlen(ftprobe_last_error()) == 0) failed = true;
    kprobe both{};
    both.symbol_name = "add_site";
    both.addr = reinterpret_cast<void *>(add_site);
    r = register_kprobe(&both);
    std::printf("register_kprobe(symbol_name and addr) = %d (%s)\n", r, r == -EINVAL ? "-EINVAL" : "?");
    if (r != -EINVAL) failed = true;

    kp_add.addr = reinterpret_cast<void *>(add_site);
    kp_add.pre_handler = [](kprobe *p, pt_regs *regs) -> int {
        add_hits.fetch_add(1, relaxed);
        add_sum_di.fetch_add(regs->di, relaxed);
        add_sum_si.fetch_add(regs->si, relaxed);
        if (regs->ip != reinterpret_cast<uintptr_t>(p->addr) + 1) add_bad_ip.fetch_add(1, relaxed);
        return 0;
    };
    kp_mul.symbol_name = "mul_plain";
    kp_mul.pre_handler = [](kprobe *p, pt_regs *regs) -> int {
        mul_pre.fetch_add(1, relaxed);
        mul_sum_di.fetch_add(regs->di, relaxed);
        if (regs->ip != reinterpret_cast<uintptr_t>(p->addr) + 1) mul_bad_ip.fetch_add(1, relaxed);
        return 0;
    };
    kp_mul.post_handler = [](kprobe *, pt_regs *, unsigned long) { mul_post.fetch_add(1, relaxed); };
    rp_sub.kp.symbol_name = "sub_plain";
    rp_sub.data_size = 16;
    rp_sub.entry_handler = [](kretprobe_instance *ri, pt_regs *regs) -> int {
        ret_entries.fetch_add(1, relaxed);
        ri->data[0] = regs->di;
        ri->data[1] = regs->si;
        return 0;
    };
    rp_sub.handler = [](kretprobe_instance *ri, pt_regs *regs) -> int {
        ret_returns.fetch_add(1, relaxed);
        ret_sum.fetch_add(regs->ax, relaxed);
        if (regs->ax != ri->data[0] - ri->data[1]) ret_bad.fetch_add(1, relaxed);
        return 0;
    };
    ops.func = [](unsigned long ip, unsigned long, ftrace_ops *, pt_regs *) {
        if (at(ip, traced_a))
            ops_a.fetch_add(1, relaxed);
        else if (at(ip, traced_b))
            ops_b.fetch_add(1, relaxed);
        else
            ops_other.fetch_add(1, relaxed);
    };

    check("register_kprobe(add_site)", register_kprobe(&kp_add));
    check("register_kprobe(mul_plain)", register_kprobe(&kp_mul));
    check("register_kretprobe(sub_plain)", register_kretprobe(&rp_sub));
    check("ftrace_set_filter", ftrace_set_filter(&ops, "traced_*", 8, 1));
    check("ftrace_set_notrace", ftrace_set_notrace(&ops, "traced_b", 8, 1));
    check("register_ftrace_function", register_ftrace_function(&ops));
    std::printf("add_site: %s, mul_plain: %s\n", (kp_add.flags & KPROBE_FLAG_FTRACE) ? "ftrace" : "int3",
                (kp_mul.flags & KPROBE_FLAG_FTRACE) ? "ftrace" : "int3");
    if (!(kp_add.flags & KPROBE_FLAG_FTRACE) || (kp_mul.flags & KPROBE_FLAG_FTRACE)) failed = true;

    long total = 0;
    for (long i = 1; i <= n; i++) total += call_all(i);
    expect("total", static_cast<uint64_t>(total),
           static_cast<uint64_t>(3 * n * (n + 1) / 2 + 3 * n * (n + 1) / 2 + 9 * n * (n + 1) / 2 +
                                 n * (n + 1) / 2 + n + n * (n + 1) / 2 + 2 * n));

    check("disable_kprobe", disable_kprobe(&kp_add));
    for (long i = 1; i <= n; i++) add_site(i, i);
    check("enable_kprobe", enable_kprobe(&kp_add));
    add_site(1, 1);

    check("unregister_kprobe(add_site)", unregister_kprobe(&kp_add));
    check("unregister_kprobe(mul_plain)", unregister_kprobe(&kp_mul));
    check("unregister_kretprobe", unregister_kretprobe(&rp_sub));
    check("unregister_ftrace_function", unregister_ftrace_function(&ops));
    call_all(1);

    // The same struct registered again (unregister_kprobe put its addr back to NULL), and a
    // probe registered disabled: mul_plain counts once more, add_site does not.
    check("register_kprobe(mul_plain) again", register_kprobe(&kp_mul));
    kprobe kp_off{};
    kp_off.symbol_name = "add_site";
    kp_off.pre_handler = kp_add.pre_handler;
    kp_off.flags = KPROBE_FLAG_DISABLED;
    check("register_kprobe(add_site, disabled)", register_kprobe(&kp_off));
    if (!(kp_off.flags & KPROBE_FLAG_DISABLED)) failed = true;
    mul_plain(1000, 1);
    add_site(5, 5);
    check("unregister_kprobe(mul_plain) again", unregister_kprobe(&kp_mul));
    check("unregister_kprobe(add_site, disabled)", unregister_kprobe(&kp_off));

    uint64_t s1 = static_cast<uint64_t>(n * (n + 1) / 2);
    std::printf("kprobe add_site: hits=%llu sum_di=%llu sum_si=%llu nmissed=%lu\n", get(add_hits),
                get(add_sum_di), get(add_sum_si), kp_add.nmissed);
    std::printf("kprobe mul_plain: pre=%llu post=%llu sum_di=%llu nmissed=%lu\n", get(mul_pre),
                get(mul_post), get(mul_sum_di), kp_mul.nmissed);
    std::printf("kretprobe sub_plain: entries=%llu returns=%llu sum_ax=%llu nmissed=%d\n",
                get(ret_entries), get(ret_returns), get(ret_sum), rp_sub.nmissed);
    std::printf("ftrace_ops: traced_a=%llu traced_b=%llu other=%llu\n", get(ops_a), get(ops_b),
                get(ops_other));

    expect("add_site hits", get(add_hits), static_cast<uint64_t>(n) + 1);
    expect("add_site sum_di", get(add_sum_di), s1 + 1);
    expect("add_site sum_si", get(add_sum_si), 2 * s1 + 1);
    expect("add_site ip", get(add_bad_ip), 0);
    expect("mul_plain pre", get(mul_pre), static_cast<uint64_t>(n) + 1);
    expect("mul_plain post", get(mul_post), static_cast<uint64_t>(n) + 1);
    expect("mul_plain sum_di", get(mul_sum_di), s1 + 1000);
    expect("mul_plain ip", get(mul_bad_ip), 0);
    expect("sub_plain entries", get(ret_entries), static_cast<uint64_t>(n));
    expect("sub_plain returns", get(ret_returns), static_cast<uint64_t>(n));
    expect("sub_plain sum_ax", get(ret_sum), 9 * s1);
    expect("sub_plain ax", get(ret_bad), 0);
    expect("traced_a", get(ops_a), static_cast<uint64_t>(n));
    expect("traced_b", get(ops_b), 0);
    expect("other", get(ops_other), 0);
    expect("add_site nmissed", kp_add.nmissed, 0);
    expect("mul_plain nmissed", kp_mul.nmissed, 0);
    expect("sub_plain nmissed", static_cast<uint64_t>(rp_sub.nmissed), 0);
    std::puts(failed ? "FAILED" : "ok");
    return failed ? 1 : 0;
}
