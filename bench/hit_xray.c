/* hit_xray.c: hit.c for LLVM XRay. Built with clang -fxray-instrument
 * -fxray-instruction-threshold=1; main installs a counting handler and patches the sleds
 * itself, so no XRAY_OPTIONS are needed. Prints the count on stderr when XRAY_HIT_VERBOSE is set. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <stdint.h>

/* xray_interface.h is C++ only; the two entry points used, with their C ABI. */
typedef enum { ENTRY = 0, EXIT = 1, TAIL = 2, LOG_ARGS_ENTRY = 3, CUSTOM_EVENT = 4 } XRayEntryType;
int __xray_set_handler(void (*entry)(int32_t, XRayEntryType));
int __xray_patch(void);

volatile long sink;
static volatile long hits;

__attribute__((xray_never_instrument)) static void count(int32_t fn, XRayEntryType t)
{
	(void)fn;
	if (t == ENTRY)
		hits++;
}

__attribute__((noinline)) long target(long x)
{
	sink += x;
	return x * 3 + 1;
}

__attribute__((xray_never_instrument)) int main(int argc, char **argv)
{
	long n = argc > 1 ? atol(argv[1]) : 1000;
	long acc = 0;
	if (getenv("XRAY_HIT_ON")) {
		__xray_set_handler(count);
		__xray_patch();
	}
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
	if (getenv("XRAY_HIT_VERBOSE"))
		fprintf(stderr, "xray hits: %ld\n", hits);
	return acc == 42;
}
