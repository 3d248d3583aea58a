/* hit-rusage.c: bench/hit.c with the loop thread's CPU time split (getrusage RUSAGE_THREAD): HIT_TIME_FILE
 * gets "user_ns sys_ns minor_faults wall_ns" of the loop. For bench/fgraph-cost.sh. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>
volatile long sink;
__attribute__((noinline)) long target(long x) { sink += x; return x * 3 + 1; }
static long long ns(struct timeval t) { return t.tv_sec * 1000000000LL + t.tv_usec * 1000LL; }
int main(int argc, char **argv)
{
	long n = argc > 1 ? atol(argv[1]) : 1000;
	long acc = 0;
	struct rusage a, b;
	struct timespec t0, t1;
	getrusage(RUSAGE_THREAD, &a);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (long i = 0; i < n; i++)
		acc += target(i);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	getrusage(RUSAGE_THREAD, &b);
	const char *tf = getenv("HIT_TIME_FILE");
	FILE *f = tf ? fopen(tf, "w") : NULL;
	if (f) {
		fprintf(f, "%lld %lld %ld %lld\n", ns(b.ru_utime) - ns(a.ru_utime), ns(b.ru_stime) - ns(a.ru_stime),
			b.ru_minflt - a.ru_minflt,
			(t1.tv_sec - t0.tv_sec) * 1000000000LL + (t1.tv_nsec - t0.tv_nsec));
		fclose(f);
	}
	return acc == 42;
}
