/* bench/dlopen.c LIB N: dlopen LIB, print how long the dlopen took (us, the least of N), dlclose; and
 * call work() (a patchable entry: the function ftprobe traces, so the agent is armed). */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e6 + t.tv_nsec / 1e3; }
__attribute__((noinline, patchable_function_entry(5, 0))) int work(int x) { return x * 3; }
int main(int argc, char **argv) {
    int n = argc > 2 ? atoi(argv[2]) : 1;
    double best = 1e18;
    for (int i = 0; i < n; i++) {
        double t0 = now();
        void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
        double t1 = now();
        if (!h) { fprintf(stderr, "%s\n", dlerror()); return 1; }
        work(i);
        dlclose(h);
        if (t1 - t0 < best) best = t1 - t0;
    }
    printf("dlopen_us_min=%.0f\n", best);
    return 0;
}
