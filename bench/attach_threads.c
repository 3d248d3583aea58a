/* attach_threads.c: the target of bench/attach.sh. N threads (argv[1], the main thread
 * among them) each call work() in a loop, sleeping 1 ms after each call (so 64 threads on
 * 2 CPUs are mostly blocked in nanosleep, as a server's are: ~64 000 calls/s in all);
 * prints "ready" once every thread has started, then runs until killed. Built with
 * -pg -mfentry -mnop-mcount: work() has an ftrace site (a NOP5). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static volatile long sink;
static pthread_barrier_t started;

__attribute__((noinline)) void work(long x)
{
	sink += x;
}

static void *loop(void *arg)
{
	struct timespec nap = { 0, 1000000 };
	long i = 0;
	if (arg)
		pthread_barrier_wait(&started);
	for (;;) {
		work(i++);
		nanosleep(&nap, NULL);
	}
	return NULL;
}

int main(int argc, char **argv)
{
	int n = argc > 1 ? atoi(argv[1]) : 1;
	if (n < 1)
		n = 1;
	pthread_barrier_init(&started, NULL, (unsigned)n);
	for (int i = 1; i < n; i++) {
		pthread_t t;
		if (pthread_create(&t, NULL, loop, &started) != 0) {
			perror("pthread_create");
			return 1;
		}
	}
	if (n > 1)
		pthread_barrier_wait(&started);
	printf("ready\n");
	fflush(stdout);
	loop(NULL);
	return 0;
}
