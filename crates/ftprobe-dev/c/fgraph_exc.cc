// C++ exceptions through hooked frames (fgraph, issue 11): thrown and caught higher up,
// rethrown, a destructor that calls a traced function from a landing pad, a catch that
// returns without another traced call, and backtrace() under hooked frames. The program
// keeps its own call tree (the T object in each traced function) and prints it at the end:
// `E depth name` for every entry in order, `U name` for every call an exception cut off.

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <execinfo.h>
#include <stdexcept>
#include <string>

#define NOTRACE __attribute__((no_instrument_function, always_inline))

static int g_depth;
static std::string g_log;

struct T {
    const char *name;
    int uncaught;
    NOTRACE explicit T(const char *n) : name(n), uncaught(std::uncaught_exceptions())
    {
        char b[64];
        snprintf(b, sizeof b, "E %d %s\n", g_depth, n);
        g_log += b;
        g_depth++;
    }
    NOTRACE ~T()
    {
        g_depth--;
        if (std::uncaught_exceptions() > uncaught) {
            g_log += "U ";
            g_log += name;
            g_log += "\n";
        }
    }
};

#define TRACED extern "C" __attribute__((noinline))

TRACED void cleanup(int n)
{
    T t(__func__);
    asm volatile("" ::"r"(n));
}

struct Guard {
    int n;
    NOTRACE ~Guard() { cleanup(n); }
};

TRACED int thrower(int n)
{
    T t(__func__);
    if (n % 3 == 0)
        throw std::runtime_error("three");
    return n;
}

TRACED int middle(int n)
{
    T t(__func__);
    Guard g{ n };
    return thrower(n) + 1;
}

TRACED int after(int n)
{
    T t(__func__);
    return -n;
}

TRACED int catcher(int n)
{
    T t(__func__);
    try {
        return middle(n);
    } catch (const std::exception &) {
        return after(n);
    }
}

TRACED void note(int n)
{
    T t(__func__);
    asm volatile("" ::"r"(n));
}

TRACED int rethrower(int n)
{
    T t(__func__);
    try {
        return middle(n);
    } catch (...) {
        note(n);
        throw;
    }
}

TRACED int outer(int n)
{
    T t(__func__);
    try {
        return rethrower(n);
    } catch (...) {
        return 100;
    }
}

TRACED int quiet(int n)
{
    T t(__func__);
    try {
        middle(n);
    } catch (...) {
    }
    return 7;
}

// backtrace() from under hooked frames: the names of the frames up to main.
TRACED void bt(void)
{
    T t(__func__);
    void *pcs[64];
    int n = backtrace(pcs, 64);
    std::string names = "bt:";
    for (int i = 0; i < n; i++) {
        Dl_info info;
        const char *s = dladdr(pcs[i], &info) && info.dli_sname ? info.dli_sname : "?";
        if (!strcmp(s, "bt") || !strcmp(s, "bt_mid") || !strcmp(s, "bt_top") ||
            !strcmp(s, "main")) {
            names += " ";
            names += s;
        }
    }
    printf("%s (%s)\n", names.c_str(), n > 4 ? "deep" : "short");
}

TRACED void bt_mid(void)
{
    T t(__func__);
    bt();
    asm volatile("");
}

TRACED void bt_top(void)
{
    T t(__func__);
    bt_mid();
    asm volatile("");
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 6;
    long sum = 0;
    for (int i = 0; i < n; i++)
        sum += catcher(i) + outer(i) + quiet(i);
    bt_top();
    printf("sum=%ld\n", sum);
    fputs(g_log.c_str(), stdout);
    return 0;
}
