/* fetchargs: memory fetch args, strings, symbols and arrays of kprobe events.
 *
 * main calls take(t, s, arr) four times, with:
 *   call 0 (heap):  t = heap thing {id 100, neg -5, fn helper, in -> heap inner {7, -123456789},
 *                   name "heap-thing", vals {10, 20, 30, 40}}, s = heap "heap string 0",
 *                   arr = heap {1, 2, 3, 4}
 *   call 1 (stack): t = stack thing {id 101, neg -6, fn helper, in -> stack inner {8, -2},
 *                   name "stack-thing", vals {-1, -2, -3, -4}}, s = stack "stack string 1",
 *                   arr = stack {5, 6, 7, 8}
 *   call 2:         t = NULL, s = heap string of LONG_LEN 'x' then NUL, arr = NULL
 *   call 3:         t = (void *)WILD (below mmap_min_addr: never mapped), s = gname,
 *                   arr = the heap array of call 0
 * take() only passes its arguments to an empty asm: it never dereferences them.
 * Prints "gvar=0x... gname=0x... gwords=0x..." (their addresses; the program is not PIE, so
 * they are the link-time addresses), then "calls=4", and exits 0. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LONG_LEN 5000
#define WILD 0xdead

struct inner {
    long a; /* +0 */
    long b; /* +8 */
};

struct thing {
    unsigned int id;     /* +0 */
    int neg;             /* +4 */
    long (*fn)(long);    /* +8 */
    struct inner *in;    /* +16 */
    char name[16];       /* +24 */
    long vals[4];        /* +40 */
};

long gvar[2] = {0x1122334455667788L, 42};
char gname[] = "global-name";
const char *gwords[3] = {"alpha", "beta", 0};

__attribute__((noinline)) long helper(long x) { return 2 * x + 1; }

static int calls;

__attribute__((noinline)) void take(struct thing *t, const char *s, long *arr)
{
    __asm__ volatile("" ::"r"(t), "r"(s), "r"(arr) : "memory");
    calls++;
}

int main(void)
{
    printf("gvar=%p gname=%p gwords=%p\n", (void *)gvar, (void *)gname, (void *)gwords);
    fflush(stdout);

    struct thing *ht = calloc(1, sizeof *ht);
    struct inner *hin = malloc(sizeof *hin);
    char *hs = strdup("heap string 0");
    long *harr = malloc(4 * sizeof *harr);
    hin->a = 7;
    hin->b = -123456789;
    *ht = (struct thing){.id = 100, .neg = -5, .fn = helper, .in = hin,
                         .vals = {10, 20, 30, 40}};
    strcpy(ht->name, "heap-thing");
    for (int i = 0; i < 4; i++)
        harr[i] = i + 1;
    take(ht, hs, harr);

    struct inner sin = {8, -2};
    struct thing st = {.id = 101, .neg = -6, .fn = helper, .in = &sin,
                       .vals = {-1, -2, -3, -4}};
    char ss[32];
    long sarr[4] = {5, 6, 7, 8};
    strcpy(st.name, "stack-thing");
    strcpy(ss, "stack string 1");
    take(&st, ss, sarr);

    char *big = malloc(LONG_LEN + 1);
    memset(big, 'x', LONG_LEN);
    big[LONG_LEN] = 0;
    take(0, big, 0);

    take((struct thing *)WILD, gname, harr);

    printf("calls=%d\n", calls);
    free(big);
    free(harr);
    free(hs);
    free(hin);
    free(ht);
    return 0;
}
