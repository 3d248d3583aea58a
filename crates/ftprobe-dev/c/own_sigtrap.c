/* own_sigtrap MODE: a program with its own ideas about SIGTRAP, and no ftrace sites (so a
 * probe on work() is an int3 probe). After work(1) it: 0 installs a handler with signal(),
 * 1 with sigaction(), 2 ignores SIGTRAP, 3 blocks SIGTRAP in the main thread, 4 blocks every
 * signal and calls work() from a new thread. Then it calls work() 3 times, raises SIGTRAP in
 * modes 0 and 1 (its handler calls work(100)), prints "mode=M s=S traps=T", exits 5. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

static volatile int traps;
__attribute__((noinline)) int work(int x)
{
    __asm__ volatile("");
    return x + 1;
}
static void handler(int s)
{
    (void)s;
    traps++;
    work(100);
}
static void *thread(void *arg)
{
    (void)arg;
    for (int i = 0; i < 3; i++)
        work(i);
    return 0;
}

int main(int argc, char **argv)
{
    int mode = argc > 1 ? atoi(argv[1]) : 0;
    long s = work(1);
    sigset_t all;
    pthread_t t;
    struct sigaction sa = {0};
    switch (mode) {
    case 0:
        signal(SIGTRAP, handler);
        break;
    case 1:
        sa.sa_handler = handler;
        sigaction(SIGTRAP, &sa, 0);
        break;
    case 2:
        signal(SIGTRAP, SIG_IGN);
        break;
    case 3:
        sigemptyset(&all);
        sigaddset(&all, SIGTRAP);
        sigprocmask(SIG_BLOCK, &all, 0);
        break;
    case 4:
        sigfillset(&all);
        pthread_sigmask(SIG_BLOCK, &all, 0);
        pthread_create(&t, 0, thread, 0);
        pthread_join(t, 0);
        break;
    }
    if (mode != 4)
        for (int i = 0; i < 3; i++)
            s += work(i);
    else
        s += 6;
    if (mode <= 1)
        raise(SIGTRAP);
    printf("mode=%d s=%ld traps=%d\n", mode, s, traps);
    return 5;
}
