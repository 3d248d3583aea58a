/* own_malloc [N]: a program with its own allocator, as uftrace's s-malloc-* tests have. It
 * defines malloc, calloc, realloc, free (and the aligned ones) over a static arena: a bump
 * allocator whose blocks are 8 bytes past a 16-byte boundary (legal for small sizes, and what
 * broke code that trusts malloc for 16-byte alignment). Every call is counted and its caller
 * (__builtin_return_address(0)) looked up with dladdr: a call from libftprobe_agent.so counts
 * in agent_calls; calls before main in before_main. A call after main printed its counts is
 * reported on stderr ("own_malloc: malloc after main from ..."), since nobody would count it.
 *
 * main calls work(i) N times (default 10): malloc, calloc, realloc, strdup (libc calls malloc)
 * and three frees; then prints, with write(2) only (stdio would allocate its buffer):
 *   mallocs=M callocs=C reallocs=R frees=F aligned=A before_main=B agent_calls=X sum=S */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ARENA (256u << 20)
static _Alignas(4096) unsigned char arena[ARENA];
static size_t used;
static long mallocs, callocs, reallocs, frees, aligned, before_main, agent_calls;
/* 0 before main, 1 in main, 2 after main printed. */
static int phase;

static void say(const char *s)
{
    ssize_t r = write(2, s, strlen(s));
    (void)r;
}

/* Who called: the agent? Before main? After main? */
static void note_caller(const char *what, void *ra)
{
    Dl_info info;
    if (phase == 0)
        before_main++;
    if (dladdr(ra, &info) && info.dli_fname && strstr(info.dli_fname, "libftprobe_agent"))
        agent_calls++;
    if (phase == 2) {
        char buf[256];
        snprintf(buf, sizeof buf, "own_malloc: %s after main from %p (%s)\n", what, ra,
                 info.dli_fname ? info.dli_fname : "?");
        say(buf);
    }
}

/* A block: its size in the 8 bytes before it; the block itself is 8 mod 16, or aligned to
 * `align` when that is more than 8. */
static void *bump(size_t size, size_t align)
{
    size_t hdr = __atomic_load_n(&used, __ATOMIC_RELAXED), start, end;
    do {
        start = hdr + 8;
        if (align <= 8)
            start = (start | 15) - 7; /* 8 mod 16 */
        else
            start = (start + align - 1) & ~(align - 1);
        end = start + size;
        if (size > ARENA || end > ARENA) {
            errno = ENOMEM;
            return 0;
        }
    } while (!__atomic_compare_exchange_n(&used, &hdr, end, 1, __ATOMIC_RELAXED,
                                          __ATOMIC_RELAXED));
    memcpy(arena + start - 8, &size, 8);
    return arena + start;
}

static size_t size_of(void *p)
{
    size_t n;
    memcpy(&n, (unsigned char *)p - 8, 8);
    return n;
}

__attribute__((noinline)) void *malloc(size_t n)
{
    __atomic_fetch_add(&mallocs, 1, __ATOMIC_RELAXED);
    note_caller("malloc", __builtin_return_address(0));
    return bump(n, 8);
}

__attribute__((noinline)) void *calloc(size_t k, size_t n)
{
    __atomic_fetch_add(&callocs, 1, __ATOMIC_RELAXED);
    note_caller("calloc", __builtin_return_address(0));
    if (n && k > SIZE_MAX / n) {
        errno = ENOMEM;
        return 0;
    }
    return bump(k * n, 8); /* the arena is never reused: still zero */
}

__attribute__((noinline)) void *realloc(void *p, size_t n)
{
    __atomic_fetch_add(&reallocs, 1, __ATOMIC_RELAXED);
    note_caller("realloc", __builtin_return_address(0));
    void *q = bump(n, 8);
    if (q && p) {
        size_t old = size_of(p);
        memcpy(q, p, old < n ? old : n);
    }
    return q;
}

__attribute__((noinline)) void free(void *p)
{
    __atomic_fetch_add(&frees, 1, __ATOMIC_RELAXED);
    note_caller("free", __builtin_return_address(0));
    (void)p;
}

static void *aligned_alloc_counted(size_t align, size_t n, void *ra)
{
    __atomic_fetch_add(&aligned, 1, __ATOMIC_RELAXED);
    note_caller("aligned allocation", ra);
    return bump(n, align);
}

void *memalign(size_t align, size_t n)
{
    return aligned_alloc_counted(align, n, __builtin_return_address(0));
}

void *aligned_alloc(size_t align, size_t n)
{
    return aligned_alloc_counted(align, n, __builtin_return_address(0));
}

int posix_memalign(void **out, size_t align, size_t n)
{
    void *p = aligned_alloc_counted(align, n, __builtin_return_address(0));
    if (!p)
        return ENOMEM;
    *out = p;
    return 0;
}

size_t malloc_usable_size(void *p)
{
    return p ? size_of(p) : 0;
}

/* Called through volatile pointers: real calls, never inlined into work or left out. */
static void *(*volatile m)(size_t) = malloc;
static void *(*volatile c)(size_t, size_t) = calloc;
static void *(*volatile r)(void *, size_t) = realloc;
static void (*volatile f)(void *) = free;

__attribute__((noinline)) long work(long i)
{
    char *a = m(16 + i);
    long *b = c(2, 8 * i + 8);
    a = r(a, 100 + i);
    char *s = strdup("own malloc");
    memset(a, 'x', 100 + i);
    b[2 * i] = i;
    long v = a[i] + b[2 * i] + (long)strlen(s);
    f(s);
    f(b);
    f(a);
    return v;
}

int main(int argc, char **argv)
{
    phase = 1;
    long n = argc > 1 ? atol(argv[1]) : 10, sum = 0;
    for (long i = 0; i < n; i++)
        sum += work(i);
    char buf[256];
    phase = 2;
    int len = snprintf(buf, sizeof buf,
                       "mallocs=%ld callocs=%ld reallocs=%ld frees=%ld aligned=%ld "
                       "before_main=%ld agent_calls=%ld sum=%ld\n",
                       mallocs, callocs, reallocs, frees, aligned, before_main, agent_calls, sum);
    return write(1, buf, len) == len ? 0 : 1;
}
