/* libc_mallocs [N]: counts its own calls of the C library's malloc and free. It first installs
 * a SIGTRAP handler with sigaction and a SIGUSR1 handler with signal (as programs with their
 * own crash or debug handlers do), then calls malloc(100 + i) N times (default 7) and frees
 * every block but the last. Only write(2) prints (stdio would allocate its buffer):
 *   mallocs=M frees=F */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void *(*volatile alloc)(size_t) = malloc;
static void (*volatile release)(void *) = free;
static long mallocs, frees;

static void on_signal(int sig)
{
    (void)sig;
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 7;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGTRAP, &sa, 0);
    signal(SIGUSR1, on_signal);
    void *last = 0;
    for (long i = 0; i < n; i++) {
        void *p = alloc(100 + i);
        mallocs++;
        if (last) {
            release(last);
            frees++;
        }
        last = p;
    }
    char buf[64];
    int len = snprintf(buf, sizeof buf, "mallocs=%ld frees=%ld\n", mallocs, frees);
    return write(1, buf, len) == len ? 0 : 1;
}
