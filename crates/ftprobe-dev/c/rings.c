/* rings MODE N K: threads that call ring_work(), a traced function (patchable entries).
 *   together: N threads start together behind a barrier; thread t calls ring_work K times.
 *   oneafter: N threads one after another (each joined before the next starts, 2 ms
 *             apart); thread t calls ring_work K + t % 7 times.
 * Each thread prints "tid=<its tid> calls=<its calls>" as it ends (counted by ring_work);
 * main, after the last join, prints "total=<calls>", then (together) the process's resident
 * memory when every thread had made its calls and still held its ring, as the kernel counts
 * it: "VmRSS=<kB> RssShmem=<kB>" (the ring pages the agent touched in this process count in
 * both: they are mapped shared memory), and its peak, "VmHWM=<kB>". main itself calls no
 * traced function. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static __thread long my_calls;
static long total;
static long per_thread;
static pthread_barrier_t start, done, report;
static char mem[128];

/* VmRSS and RssShmem of this process now, from /proc/self/status. */
static void read_mem(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	long rss = -1, shmem = -1;
	while (f && fgets(line, sizeof line, f)) {
		if (strncmp(line, "VmRSS:", 6) == 0)
			rss = atol(line + 6);
		else if (strncmp(line, "RssShmem:", 9) == 0)
			shmem = atol(line + 9);
	}
	if (f)
		fclose(f);
	snprintf(mem, sizeof mem, "VmRSS=%ld RssShmem=%ld\n", rss, shmem);
}
static volatile long sink;

__attribute__((noipa)) long ring_work(long i)
{
	my_calls++;
	return i * 3 + 1;
}

static void run(long k)
{
	for (long i = 0; i < k; i++)
		sink += ring_work(i);
	printf("tid=%d calls=%ld\n", gettid(), my_calls);
	__atomic_fetch_add(&total, my_calls, __ATOMIC_RELAXED);
}

static void *together(void *arg)
{
	pthread_barrier_wait(&start);
	run(per_thread);
	/* Every thread has made its calls and still holds its ring: the first measures. */
	pthread_barrier_wait(&done);
	if (arg == NULL)
		read_mem();
	pthread_barrier_wait(&report);
	return NULL;
}

static void *oneafter(void *arg)
{
	run(per_thread + (long)arg % 7);
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc < 4) {
		fprintf(stderr, "usage: rings together|oneafter N K\n");
		return 2;
	}
	int n = atoi(argv[2]);
	per_thread = atol(argv[3]);
	pthread_t *tids = calloc(n, sizeof *tids);
	if (strcmp(argv[1], "together") == 0) {
		pthread_barrier_init(&start, NULL, n);
		pthread_barrier_init(&done, NULL, n);
		pthread_barrier_init(&report, NULL, n);
		for (long t = 0; t < n; t++)
			if (pthread_create(&tids[t], NULL, together, (void *)t) != 0)
				return 1;
		for (int t = 0; t < n; t++)
			pthread_join(tids[t], NULL);
	} else {
		for (long t = 0; t < n; t++) {
			if (pthread_create(&tids[t], NULL, oneafter, (void *)t) != 0)
				return 1;
			pthread_join(tids[t], NULL);
			struct timespec ms = {0, 2000000};
			nanosleep(&ms, NULL);
		}
	}
	printf("total=%ld\n", total);
	fputs(mem, stdout);
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	while (f && fgets(line, sizeof line, f))
		if (strncmp(line, "VmHWM:", 6) == 0)
			printf("VmHWM=%ld\n", atol(line + 6));
	fflush(stdout);
	return 0;
}
