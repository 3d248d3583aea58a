/* optlibc N [FUNC OFF...]: built with no site flags; single-threaded. Calls libc's malloc,
 * memcpy, memmove and strlen through the addresses dlsym gives for them in libc (for the
 * indirect functions memcpy, memmove and strlen: the implementation this CPU uses), N rounds
 * of a fixed sequence of sizes, alignments and string lengths (the same calls in every run),
 * and prints "optlibc rounds=N sum=<S>" (S depending only on N). main first calls
 * optlibc_begin(), which does nothing: a probe on it marks where the program's own calls
 * start.
 *
 * With FUNC (malloc, memcpy or strlen) and offsets (hex, 0x...): after the work, the first
 * byte of the code at FUNC+OFF for each offset, read in the process itself, is printed to
 * stderr as "code FUNC+0xOFF XX" (XX two hex digits), in the order given. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Called first in main: events before it are the loader's and the agent's (its own calls of
 * libc's functions while it arms the probes), not the program's. */
__attribute__((noinline)) void optlibc_begin(void)
{
    __asm__ volatile("");
}

static unsigned char src[65536 + 4096];
static unsigned char dst[65536 + 4096];
static char strs[4200];

int main(int argc, char **argv)
{
    optlibc_begin();
    int n = argc > 1 ? atoi(argv[1]) : 10;
    void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    if (libc == NULL) {
        fprintf(stderr, "optlibc: %s\n", dlerror());
        return 2;
    }
    void *(*alloc)(size_t) = (void *(*)(size_t))dlsym(libc, "malloc");
    void (*release)(void *) = (void (*)(void *))dlsym(libc, "free");
    void *(*copy)(void *, const void *, size_t) =
        (void *(*)(void *, const void *, size_t))dlsym(libc, "memcpy");
    void *(*move)(void *, const void *, size_t) =
        (void *(*)(void *, const void *, size_t))dlsym(libc, "memmove");
    size_t (*length)(const char *) = (size_t(*)(const char *))dlsym(libc, "strlen");
    if (!alloc || !release || !copy || !move || !length)
        return 2;

    static const size_t sizes[] = {0,   1,   2,    3,    4,    7,    8,     15,    16,    17,
                                   31,  32,  33,   63,   64,   65,   127,   128,   129,   255,
                                   256, 257, 511,  512,  513,  1000, 2047,  2048,  2049,  4095,
                                   4097, 8192, 16385, 65536};
    enum { NSIZES = sizeof sizes / sizeof sizes[0] };
    static const size_t allocs[] = {1, 24, 25, 100, 1000, 1040, 5000, 70000, 200000};
    enum { NALLOCS = sizeof allocs / sizeof allocs[0] };

    for (size_t i = 0; i < sizeof src; i++)
        src[i] = (unsigned char)(i * 131 + 7);
    for (size_t i = 0; i < sizeof strs - 1; i++)
        strs[i] = (char)('a' + i % 26);

    unsigned long sum = 0;
    void *keep[NALLOCS];
    for (int r = 0; r < n; r++) {
        for (int k = 0; k < NALLOCS; k++) {
            keep[k] = alloc(allocs[k] + (size_t)r);
            if (keep[k] == NULL)
                return 3;
            ((unsigned char *)keep[k])[0] = (unsigned char)k;
        }
        for (int k = 0; k < NSIZES; k++) {
            size_t len = sizes[k];
            size_t so = (size_t)(r * 7 + k) % 64, d = (size_t)(r * 3 + k * 5) % 64;
            copy(dst + d, src + so, len);
            sum += len ? dst[d + len - 1] + dst[d] : 1;
            /* Overlapping both ways: memmove's forward and backward paths. */
            move(dst + d + 1 + (size_t)k % 40, dst + d, len);
            move(dst + d, dst + d + 3 + (size_t)r % 50, len);
            sum += len ? dst[d + len / 2] : 2;
        }
        for (int k = 0; k < 60; k++) {
            /* Strings of every length up to ~4 KiB, ending at every alignment. */
            size_t start = (size_t)(r * 13 + k * 7) % 64;
            size_t len = (size_t)k * k + (size_t)(r % 5);
            char saved = strs[start + len];
            strs[start + len] = 0;
            sum += length(strs + start);
            strs[start + len] = saved;
        }
        for (int k = 0; k < NALLOCS; k++) {
            sum += ((unsigned char *)keep[k])[0];
            release(keep[k]);
        }
    }
    printf("optlibc rounds=%d sum=%lu\n", n, sum);
    fflush(stdout);

    if (argc > 2) {
        const char *func = argv[2];
        void *f = dlsym(libc, func);
        if (f == NULL)
            return 4;
        for (int i = 3; i < argc; i++) {
            unsigned long off = strtoul(argv[i], NULL, 16);
            const unsigned char *p = (const unsigned char *)f + off;
            fprintf(stderr, "code %s+0x%lx %02x\n", func, off, *p);
        }
    }
    return 0;
}
