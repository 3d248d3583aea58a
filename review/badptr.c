#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <setjmp.h>
static sigjmp_buf jb; static volatile int segv;
static void on_segv(int s) { segv++; siglongjmp(jb, 1); }
__attribute__((noinline)) long take(const char *p, long n) { return n + (p ? 1 : 0); }
__attribute__((noinline)) long touch(volatile int *p) { return *p; }
int main(void) {
    long s = 0; char ok[] = "hello";
    const char *ptrs[] = { ok, 0, (char *)1, (char *)-1, (char *)0xffff800000000000UL, (char *)0x7fffffffffffUL, ok + 3, (char *)main };
    for (int r = 0; r < 1000; r++) for (int i = 0; i < 8; i++) s += take(ptrs[i], i);
    signal(SIGSEGV, on_segv);
    for (int i = 0; i < 100; i++) { if (!sigsetjmp(jb, 1)) s += touch((int *)(long)(i * 8)); }
    printf("s=%ld segv=%d\n", s, segv);
    return 0;
}
