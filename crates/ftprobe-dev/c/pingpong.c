/* pingpong ROUNDS BURST: two threads take turns ROUNDS times each (default 20000), handing
 * the turn over through pipes: the thread "ping" calls ping() BURST times (default 1) on its
 * turn, "pong" calls pong() BURST times on its turn, so their events alternate every few
 * microseconds (sites by attribute only). Prints `ping=N pong=N` (the calls). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define SITE __attribute__((noinline, patchable_function_entry(5, 0)))

static long rounds, burst;
static int to_ping[2], to_pong[2];
static volatile long pings, pongs;

SITE void ping(void)
{
    pings++;
}

SITE void pong(void)
{
    pongs++;
}

static void *pong_thread(void *arg)
{
    (void)arg;
    char c;
    for (long i = 0; i < rounds; i++) {
        if (read(to_pong[0], &c, 1) != 1)
            break;
        for (long k = 0; k < burst; k++)
            pong();
        if (write(to_ping[1], &c, 1) != 1)
            break;
    }
    return NULL;
}

int main(int argc, char **argv)
{
    rounds = argc > 1 ? atol(argv[1]) : 20000;
    burst = argc > 2 ? atol(argv[2]) : 1;
    if (pipe(to_ping) != 0 || pipe(to_pong) != 0)
        return 2;
    pthread_setname_np(pthread_self(), "ping");
    pthread_t t;
    pthread_create(&t, NULL, pong_thread, NULL);
    pthread_setname_np(t, "pong");
    char c = 'x';
    for (long i = 0; i < rounds; i++) {
        for (long k = 0; k < burst; k++)
            ping();
        if (write(to_pong[1], &c, 1) != 1 || read(to_ping[0], &c, 1) != 1)
            break;
    }
    pthread_join(t, NULL);
    printf("ping=%ld pong=%ld\n", pings, pongs);
    return 0;
}
