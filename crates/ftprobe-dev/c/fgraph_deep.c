/* Recursion deeper than the fgraph shadow stack (1024 calls), fork inside a hooked call, and
 * exit inside one (fgraph, issue 11). `main` has no site. The parent recurses N deep (a
 * `leaf` call every 100 levels), then `forker` forks: the child calls traced functions
 * under the inherited frames, prints its tree and calls exit(0) inside `child_exit`; the
 * parent waits for it, then calls exit(3) inside `finisher` after printing its own tree.
 * Trees: `T name`, then `E depth name` per traced entry in order. */

#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#define SITE __attribute__((noinline, patchable_function_entry(5, 0)))

static char logbuf[1 << 20];
static size_t loglen;
static int depth;

static void note(const char *name)
{
    loglen += snprintf(logbuf + loglen, sizeof logbuf - loglen, "E %d %s\n", depth, name);
}

#define ENTER() (note(__func__), depth++)
#define LEAVE() (depth--)

SITE int leaf(int x)
{
    ENTER();
    LEAVE();
    return x + 1;
}

SITE int rec(int n, int max)
{
    ENTER();
    int r = n % 100 == 0 ? leaf(n) : 0;
    if (n < max)
        r += rec(n + 1, max);
    LEAVE();
    return r;
}

SITE void child_exit(void)
{
    ENTER();
    printf("T child\n%s", logbuf);
    exit(0);
}

SITE void child_work(void)
{
    ENTER();
    leaf(1);
    LEAVE();
}

SITE int forker(void)
{
    ENTER();
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        loglen = 0;
        logbuf[0] = 0;
        child_work();
        child_exit();
    }
    int st = 0;
    waitpid(pid, &st, 0);
    leaf(2);
    LEAVE();
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

SITE void finisher(int r, int st)
{
    ENTER();
    printf("T parent\n%srec=%d child=%d\n", logbuf, r, st);
    exit(3);
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 1500;
    int r = rec(0, n);
    int st = forker();
    finisher(r, st);
}
