/* A stack switched by hand (fgraph, issue 11): inline asm moves rsp to a buffer, calls a
 * traced function there (which recurses and calls more traced functions), then moves rsp
 * back; no API tells anyone. Mode `below`: the buffer is static data, below the thread's
 * stack. Mode `above`: a thread runs on the lower half of a mapping and switches to its upper
 * half, above its own stack (so the switched calls look like their callers' callers). The
 * program prints `E depth name` per traced entry in order (its own nesting), then `sum=S`. */

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define SITE __attribute__((noinline, patchable_function_entry(5, 0)))

static char logbuf[1 << 16];
static size_t loglen;
static int depth;
static char low_stack[1 << 16] __attribute__((aligned(64)));
static char *switch_top;

static void note(const char *name)
{
    loglen += snprintf(logbuf + loglen, sizeof logbuf - loglen, "E %d %s\n", depth, name);
}

#define ENTER() (note(__func__), depth++)
#define LEAVE() (depth--)

/* fn(arg) with rsp at `top` (16-byte aligned); back on this stack after. */
static long call_on_stack(char *top, long (*fn)(long), long arg)
{
    long ret;
    register long a asm("rdi") = arg;
    asm volatile("mov %%rsp, %%rbx\n\t"
                 "mov %[top], %%rsp\n\t"
                 "call *%[fn]\n\t"
                 "mov %%rbx, %%rsp\n\t"
                 : "=a"(ret), "+r"(a)
                 : [top] "r"(top), [fn] "r"(fn)
                 : "rbx", "rcx", "rdx", "rsi", "r8", "r9", "r10", "r11", "memory", "cc", "xmm0",
                   "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9",
                   "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15");
    return ret;
}

SITE long leaf(long x)
{
    ENTER();
    LEAVE();
    return x + 1;
}

SITE long on_other(long n)
{
    ENTER();
    long r = n == 0 ? leaf(7) : on_other(n - 1) + leaf(n);
    LEAVE();
    return r;
}

SITE long switcher(long n)
{
    ENTER();
    long r = call_on_stack(switch_top, on_other, n);
    r += leaf(r);
    LEAVE();
    return r;
}

SITE void *thread_fn(void *arg)
{
    ENTER();
    long s = 0;
    for (int i = 0; i < 3; i++)
        s += switcher(i + 1);
    *(long *)arg = s;
    LEAVE();
    return NULL;
}

int main(int argc, char **argv)
{
    int above = argc > 1 && strcmp(argv[1], "above") == 0;
    long sum = 0;
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    if (above) {
        size_t half = 1 << 20;
        char *m = mmap(NULL, 2 * half, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED)
            return 2;
        pthread_attr_setstack(&attr, m, half);
        switch_top = m + 2 * half - 64;
    } else {
        switch_top = low_stack + sizeof low_stack - 64;
    }
    pthread_create(&t, &attr, thread_fn, &sum);
    pthread_join(t, NULL);
    printf("%ssum=%ld\n", logbuf, sum);
    return 0;
}
