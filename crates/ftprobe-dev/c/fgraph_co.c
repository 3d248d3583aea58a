/* swapcontext/makecontext coroutines (fgraph, issue 11): three generators, each on its own
 * stack, ping-pong with main; each yields from inside hooked calls (`produce` -> `yield_`),
 * so hooked calls stay live on a stack while the others run; when a generator ends, its
 * context's uc_link resumes main. The program keeps its own call tree, one depth per stack
 * (a stack's first call is at depth 0), and prints it at the end: `E depth name` for every
 * entry of a function with a site, in order; then `sum=S`. */

#include <stdio.h>
#include <stdlib.h>
#include <ucontext.h>

/* Sites by attribute only. */
#define SITE __attribute__((noinline, patchable_function_entry(5, 0)))
#define NCO 3

static ucontext_t main_ctx, co_ctx[NCO];
static char stacks[NCO][1 << 16];
static int cur = -1, done[NCO], rounds;
static int depth[NCO + 1];
static char logbuf[1 << 16];
static size_t loglen;

static void note(const char *name)
{
    loglen += snprintf(logbuf + loglen, sizeof logbuf - loglen, "E %d %s\n", depth[cur + 1], name);
}

#define ENTER() (note(__func__), depth[cur + 1]++)
#define LEAVE() (depth[cur + 1]--)

SITE int leaf(int x)
{
    ENTER();
    LEAVE();
    return x + 1;
}

SITE void yield_(void)
{
    ENTER();
    int me = cur;
    swapcontext(&co_ctx[me], &main_ctx);
    LEAVE();
}

SITE int produce(int id, int k)
{
    ENTER();
    if (k % 2)
        leaf(k);
    yield_();
    LEAVE();
    return k * 10 + id;
}

static long sum;

SITE void gen(int id)
{
    ENTER();
    for (int k = 0; k < rounds + id; k++)
        sum += produce(id, k);
    LEAVE();
    done[id] = 1;
}

SITE void resume(int id)
{
    ENTER();
    cur = id;
    swapcontext(&main_ctx, &co_ctx[id]);
    cur = -1;
    LEAVE();
}

int main(int argc, char **argv)
{
    rounds = argc > 1 ? atoi(argv[1]) : 3;
    for (int i = 0; i < NCO; i++) {
        getcontext(&co_ctx[i]);
        co_ctx[i].uc_stack.ss_sp = stacks[i];
        co_ctx[i].uc_stack.ss_size = sizeof stacks[i];
        co_ctx[i].uc_link = &main_ctx;
        makecontext(&co_ctx[i], (void (*)(void))gen, 1, i);
    }
    for (int left = NCO; left > 0;) {
        left = 0;
        for (int i = 0; i < NCO; i++) {
            if (!done[i]) {
                resume(i);
                left += !done[i];
            }
        }
    }
    printf("%ssum=%ld\n", logbuf, sum);
    return 0;
}
