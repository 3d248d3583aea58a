// register/flags/xmm integrity: an asm loop carrying CF across instructions (adc chain),
// pushf/popf, xmm arithmetic, rip-relative loads, while a 100us timer signal clobbers
// registers in its handler (as any handler may). Result must match the untraced run.
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
static volatile long ticks;
__attribute__((used, visibility("hidden"))) const unsigned long K[4] = {0x9e3779b97f4a7c15UL, 0xbf58476d1ce4e5b9UL, 0x94d049bb133111ebUL, 3};
static void on_alrm(int s) { ticks++; double d = ticks * 1.5; __asm__ volatile("movq %0, %%xmm0; movq %0, %%xmm1" :: "r"(d) : "xmm0", "xmm1"); }
__attribute__((noinline)) unsigned long mix(unsigned long n) {
    unsigned long a = 1, b = 2, c = 3, x;
    __asm__ volatile(
        "1:\n\t"
        "movq K(%%rip), %[x]\n\t"
        "addq %[x], %[a]\n\t"
        "adcq K+8(%%rip), %[b]\n\t"
        "adcq $0, %[c]\n\t"
        "pushfq\n\t"
        "xorq %[b], %[a]\n\t"
        "popfq\n\t"
        "adcq %[a], %[c]\n\t"
        "movq %[c], %%xmm2\n\t"
        "paddq %%xmm2, %%xmm3\n\t"
        "movq %%xmm3, %[x]\n\t"
        "rorq $7, %[x]\n\t"
        "addq %[x], %[b]\n\t"
        "cmc\n\t"
        "adcq $1, %[a]\n\t"
        "decq %[n]\n\t"
        "jnz 1b\n\t"
        : [a] "+r"(a), [b] "+r"(b), [c] "+r"(c), [n] "+r"(n), [x] "=&r"(x) :: "xmm2", "xmm3", "cc", "memory");
    return a ^ b ^ c;
}
int main(int argc, char **argv) {
    signal(SIGALRM, on_alrm);
    struct itimerval it = {{0, 100}, {0, 100}}; setitimer(ITIMER_REAL, &it, 0);
    unsigned long r = 0; long n = argc > 1 ? atol(argv[1]) : 20000;
    __asm__ volatile("pxor %%xmm3, %%xmm3" ::: "xmm3");
    for (int i = 0; i < 50; i++) r += mix(n);
    it.it_value.tv_usec = 0; it.it_interval.tv_usec = 0; setitimer(ITIMER_REAL, &it, 0);
    printf("r=%lx\n", r); fprintf(stderr, "ticks=%ld\n", ticks);
    return 0;
}
