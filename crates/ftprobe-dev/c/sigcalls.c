/* sigcalls N US: main calls work(i) for i in 0..N (work calls body); a SIGALRM handler, every
 * US microseconds (setitimer), calls body() and work() too, so it often interrupts a tracer
 * that is writing. Prints "work=<calls> body=<calls>", counted by the functions themselves.
 * Built with -fpatchable-function-entry=5. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/time.h>

/* Counted with one instruction each, which a signal cannot split (x++ on a volatile is a
 * load, an add and a store: the handler's increments would be lost in between). */
static long work_calls, body_calls;
static volatile long sink;

__attribute__((noipa)) long body(long i)
{
	__atomic_fetch_add(&body_calls, 1, __ATOMIC_RELAXED);
	long r = i * 3;
	r ^= i >> 2;
	return r + 7;
}

__attribute__((noipa)) long work(long i)
{
	__atomic_fetch_add(&work_calls, 1, __ATOMIC_RELAXED);
	return body(i) + 1;
}

static void on_alarm(int sig)
{
	(void)sig;
	sink += body(-1) + work(-2);
}

int main(int argc, char **argv)
{
	long n = argc > 1 ? atol(argv[1]) : 100000;
	long us = argc > 2 ? atol(argv[2]) : 200;
	struct sigaction sa = {0};
	sa.sa_handler = on_alarm;
	sa.sa_flags = SA_RESTART;
	sigaction(SIGALRM, &sa, NULL);
	struct itimerval it = {{0, us}, {0, us}};
	setitimer(ITIMER_REAL, &it, NULL);
	for (long i = 0; i < n; i++)
		sink += work(i);
	struct itimerval off = {{0, 0}, {0, 0}};
	setitimer(ITIMER_REAL, &off, NULL);
	printf("work=%ld body=%ld\n", __atomic_load_n(&work_calls, __ATOMIC_RELAXED),
	       __atomic_load_n(&body_calls, __ATOMIC_RELAXED));
	return 0;
}
