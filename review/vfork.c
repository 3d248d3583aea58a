// vfork children call a probed function (and a libc one) before _exit; parent counts
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/wait.h>
static volatile long sink;
__attribute__((noinline)) long work(long x) { return x * 7 + 1; }
int main(void) {
    int ok = 0;
    for (int i = 0; i < 50; i++) {
        pid_t p = vfork();
        if (p == 0) { long s = 0; for (int k = 0; k < 10; k++) s += work(k) + strlen("abc"); _exit(s == 355 ? 0 : 1); }
        int st; waitpid(p, &st, 0); if (WIFEXITED(st) && WEXITSTATUS(st) == 0) ok++; else printf("child %d st=%#x\n", i, st);
        sink += work(i);
    }
    printf("ok=%d\n", ok);
    return 0;
}
