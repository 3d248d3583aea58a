/* gaps BURST AFTER: a gap in the thread's ring at a known place, for the LOST marks (run
 * under `ftprobe trace`/`record` with a small --buffer-size-kb; sites by attribute only).
 *
 * The gap must not depend on when the CLI happens to read the ring, so the program stops
 * its reader: it waits until its parent (the ftprobe CLI) has written something (its first
 * poll after the agent armed: the trace's header, or a recording's copies of the objects),
 * stops it (SIGSTOP, then waits until /proc/PPID/stat says `T`), calls gap_burst(BURST),
 * which calls gap_leaf BURST times (the ring, empty, fills and drops the rest: no traced
 * call came before), resumes it (SIGCONT) and waits until it has written again (it read
 * the ring: nothing else makes it write meanwhile), then calls gap_after AFTER times (they
 * fit). Prints `calls=C` (its traced calls: 1 + BURST + AFTER) and `burst=B after=A`. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SITE __attribute__((noinline, patchable_function_entry(5, 0)))

static volatile unsigned long sink;
static unsigned long calls;

SITE void gap_leaf(int i)
{
    calls++;
    sink += (unsigned long)i;
}

SITE void gap_burst(int n)
{
    calls++;
    for (int i = 0; i < n; i++)
        gap_leaf(i);
}

SITE void gap_after(int i)
{
    calls++;
    sink += (unsigned long)i;
}

/* The whole of a small /proc file, NUL-terminated; "" when it cannot be read. */
static void read_proc(pid_t pid, const char *what, char *buf, size_t len)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/%s", (int)pid, what);
    buf[0] = 0;
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    size_t n = fread(buf, 1, len - 1, f);
    buf[n] = 0;
    fclose(f);
}

/* Bytes process `pid` has written (`wchar` of /proc/PID/io); exits when it cannot be read
 * (the wait for it would never end). */
static unsigned long long written(pid_t pid)
{
    char buf[1024];
    read_proc(pid, "io", buf, sizeof buf);
    const char *w = strstr(buf, "wchar: ");
    if (!w) {
        fprintf(stderr, "gaps: cannot read /proc/%d/io\n", (int)pid);
        kill(pid, SIGCONT);
        exit(3);
    }
    return strtoull(w + 7, NULL, 10);
}

/* The state letter of process `pid` (after the `(comm)` of /proc/PID/stat). */
static char state(pid_t pid)
{
    char buf[1024];
    read_proc(pid, "stat", buf, sizeof buf);
    const char *p = strrchr(buf, ')');
    return p && p[1] == ' ' ? p[2] : '?';
}

int main(int argc, char **argv)
{
    int burst = argc > 1 ? atoi(argv[1]) : 1000;
    int after = argc > 2 ? atoi(argv[2]) : 10;
    pid_t cli = getppid();
    char comm[64];
    read_proc(cli, "comm", comm, sizeof comm);
    if (strcmp(comm, "ftprobe\n") != 0) {
        /* Never stop anything but the ftprobe CLI (run by hand, untraced). */
        fprintf(stderr, "gaps: run me under ftprobe (my parent is %s)\n", comm);
        return 2;
    }

    while (written(cli) == 0)
        usleep(1000);
    if (kill(cli, SIGSTOP) != 0) {
        perror("kill SIGSTOP");
        return 2;
    }
    while (state(cli) != 'T')
        usleep(100);
    unsigned long long before = written(cli);

    gap_burst(burst);

    kill(cli, SIGCONT);
    while (written(cli) == before)
        usleep(1000);

    for (int i = 0; i < after; i++)
        gap_after(i);
    printf("calls=%lu\nburst=%d after=%d\n", calls, burst, after);
    return 0;
}
