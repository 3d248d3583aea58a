/* gaps BURST AFTER: a gap in the thread's ring at a known place, for the LOST marks (run
 * under `ftprobe trace`/`record` with a small --buffer-size-kb; sites by attribute only).
 *
 * The gap must not depend on when the CLI happens to read the ring, so the program stops
 * its reader: it stops its parent, the ftprobe CLI (SIGSTOP, then waits until
 * /proc/PPID/stat says `T`), calls gap_burst(BURST), which calls gap_leaf BURST times (the
 * ring, empty, fills and drops the rest: no traced call came before), resumes it (SIGCONT)
 * and waits until it has read the ring to its end (the ring's own tail reaches its head,
 * see wait_until_read), then calls gap_after AFTER times (they fit). Prints `calls=C` (its
 * traced calls: 1 + BURST + AFTER) and `burst=B after=A`. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
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

/* The state letter of process `pid` (after the `(comm)` of /proc/PID/stat). */
static char state(pid_t pid)
{
    char buf[1024];
    read_proc(pid, "stat", buf, sizeof buf);
    const char *p = strrchr(buf, ')');
    return p && p[1] == ' ' ? p[2] : '?';
}

/* Until this thread's ring was read to its end: the ring's tail (the reader's) reaches its
 * head (the published records). The rings are the agent's mapping of the memfd
 * `ftprobe-rings` in this process; the layout (crates/ftprobe/src/ring/mod.rs, version 7):
 * a header (u32 version at 8, u32 header_bytes at 12, u32 nr_rings at 16), then 128 bytes per ring
 * (u64 head at +0, u32 tid at +24, u64 tail at +64). `record` keeps what it read in memory
 * (a short thread's stream is written at its end), so its writes cannot tell. */
static void wait_until_read(void)
{
    unsigned long base = 0, off = 1;
    char line[512];
    FILE *f = fopen("/proc/self/maps", "r");
    while (f && fgets(line, sizeof line, f))
        if (strstr(line, "memfd:ftprobe-rings") && sscanf(line, "%lx-%*x %*s %lx", &base, &off) == 2 && off == 0)
            break;
    if (f)
        fclose(f);
    if (!base || off != 0 || *(volatile unsigned *)(base + 8) != 7) {
        fprintf(stderr, "gaps: no ftprobe rings of layout 7 in this process\n");
        exit(3);
    }
    unsigned nr = *(volatile unsigned *)(base + 16);
    unsigned long header = *(volatile unsigned *)(base + 12);
    unsigned tid = (unsigned)syscall(SYS_gettid);
    for (unsigned i = 0; i < nr; i++) {
        unsigned long d = base + header + 128UL * i;
        if (__atomic_load_n((unsigned *)(d + 24), __ATOMIC_ACQUIRE) != tid)
            continue;
        while (__atomic_load_n((unsigned long *)(d + 64), __ATOMIC_ACQUIRE) !=
               __atomic_load_n((unsigned long *)d, __ATOMIC_ACQUIRE))
            usleep(1000);
        return;
    }
    fprintf(stderr, "gaps: no ring of thread %u\n", tid);
    exit(3);
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

    if (kill(cli, SIGSTOP) != 0) {
        perror("kill SIGSTOP");
        return 2;
    }
    while (state(cli) != 'T')
        usleep(100);

    gap_burst(burst);

    kill(cli, SIGCONT);
    wait_until_read();

    for (int i = 0; i < after; i++)
        gap_after(i);
    printf("calls=%lu\nburst=%d after=%d\n", calls, burst, after);
    return 0;
}
