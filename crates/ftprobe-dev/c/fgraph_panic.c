/* The hooked half of the Rust panic fixture (rust/fgraph_panic.rs, fgraph, issue 11): C
 * functions with sites (by attribute) that call back into Rust, whose callbacks panic
 * through them or call C again. Compiled with -fexceptions so the C frames have unwind
 * tables; the Rust program links it as a static library. Keeps the call tree of its hooked
 * functions: `E depth name` per entry, `U name` per call a panic cut off (reported by the
 * Rust side through fx_cut_to after each catch). */

#include <stdio.h>

#define SITE __attribute__((noinline, patchable_function_entry(5, 0)))

typedef int (*cb_t)(int);

static char logbuf[1 << 16];
static unsigned long loglen;
static const char *names[64];
static int depth;

static void line(const char *k, int d, const char *name)
{
    if (d >= 0)
        loglen += snprintf(logbuf + loglen, sizeof logbuf - loglen, "%s %d %s\n", k, d, name);
    else
        loglen += snprintf(logbuf + loglen, sizeof logbuf - loglen, "%s %s\n", k, name);
}

#define ENTER() (line("E", depth, __func__), names[depth++] = __func__)
#define LEAVE() (depth--)

int fx_depth(void)
{
    return depth;
}

/* The calls above depth d were cut off (deepest first). */
void fx_cut_to(int d)
{
    while (depth > d)
        line("U", -1, names[--depth]);
}

const char *fx_log(void)
{
    return logbuf;
}

SITE int fx_leaf(int x)
{
    ENTER();
    LEAVE();
    return x + 1;
}

SITE int fx_inner(int n, cb_t cb)
{
    ENTER();
    int r = cb(n) + fx_leaf(n);
    LEAVE();
    return r;
}

SITE int fx_mid(int n, cb_t cb)
{
    ENTER();
    int r = cb(n) * 2;
    LEAVE();
    return r;
}

SITE int fx_outer(int n, cb_t cb)
{
    ENTER();
    int r = fx_mid(n, cb) + 1;
    LEAVE();
    return r;
}
