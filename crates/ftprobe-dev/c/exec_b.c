/* exec_b [N [fork]]: the exec'd image of --follow-exec's tests (issue 13, item 5). Calls
 * eb_alpha() N times (default 4) and eb_beta() 2N times, prints its own counts
 * (`exec_b eb_alpha=N eb_beta=2N`) and every environment entry that starts with FTPROBE_ or
 * LD_PRELOAD (`exec_b env ENTRY`), exits 3. Built -no-pie, as exec_a: their functions'
 * addresses overlap (eb_pad covers exec_a's). With `fork`, a forked child makes the calls and
 * prints, and this process exits with its status. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

static volatile int sink;

/* Never called: 4 KiB of code before eb_alpha and eb_beta, so that exec_b's text covers
 * the addresses of exec_a's functions (a record of exec_a named from exec_b's symbols would
 * say eb_pad). */
__attribute__((used, noinline)) void eb_pad(void) { __asm__ volatile(".fill 4096, 1, 0x90"); }

__attribute__((noinline)) void eb_alpha(int x) { sink += x * 7; }
__attribute__((noinline)) void eb_beta(int x) { sink ^= x; }

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 4;
    if (argc > 2 && !strcmp(argv[2], "fork")) {
        /* The calls are the forked child's; this process waits and exits with its status. */
        pid_t p = fork();
        if (p > 0) {
            int st = 0;
            waitpid(p, &st, 0);
            return WEXITSTATUS(st);
        }
    }
    int alpha = 0, beta = 0;
    for (int i = 0; i < n; i++) {
        eb_alpha(i);
        alpha++;
        eb_beta(i);
        eb_beta(i + 1);
        beta += 2;
    }
    printf("exec_b eb_alpha=%d eb_beta=%d\n", alpha, beta);
    for (char **e = environ; *e; e++)
        if (!strncmp(*e, "FTPROBE_", 8) || !strncmp(*e, "LD_PRELOAD", 10))
            printf("exec_b env %s\n", *e);
    return 3;
}
