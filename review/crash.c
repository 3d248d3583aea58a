#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
__attribute__((noinline)) int deref(int *p) { return *p + 1; }
__attribute__((noinline)) void doabort(void) { abort(); }
int main(int argc, char **argv) {
    int mode = argc > 1 ? atoi(argv[1]) : 0;
    int x = 5;
    printf("start %d\n", deref(&x)); fflush(stdout);
    if (mode == 0) return deref((int *)0x10);
    if (mode == 1) doabort();
    if (mode == 2) { __builtin_trap(); }
    if (mode == 3) { raise(SIGTERM); }
    if (mode == 4) { int *volatile q = 0; *q = 1; }
    return 3;
}
