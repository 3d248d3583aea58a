/* hit.c: calls target(long) N times (N = argv[1]); the function every row of peers.sh probes.
 * Built several ways by peers.sh (fentry NOP5 site, plain, -pg for uftrace). */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

volatile long sink;
/* For the string fetch arg rows: 32 characters (33 bytes with the NUL). */
char hit_str[] = "0123456789abcdef0123456789abcdef";

__attribute__((noinline)) long target(long x)
{
	sink += x;
	return x * 3 + 1;
}

int main(int argc, char **argv)
{
	long n = argc > 1 ? atol(argv[1]) : 1000;
	long acc = 0;
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (long i = 0; i < n; i++)
		acc += target(i);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	/* The loop alone, for peers.sh's in-program column: the cost the traced program sees. */
	const char *tf = getenv("HIT_TIME_FILE");
	FILE *f = tf ? fopen(tf, "w") : NULL;
	if (f) {
		fprintf(f, "%lld\n", (t1.tv_sec - t0.tv_sec) * 1000000000LL + (t1.tv_nsec - t0.tv_nsec));
		fclose(f);
	}
	return acc == 42; /* keeps the loop; exits 0 */
}
