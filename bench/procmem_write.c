/* The cost of one write to /proc/self/mem (how ftprobe writes code without making it
 * writable: arch::x86_64::code_write), against the page it lands on: 300 000 one-byte and
 * four-byte pwrites to an r-x anonymous mapping, and one 4 KiB write per page over 1 024
 * pages. Build: cc -O2 bench/procmem_write.c -o /tmp/procmem_write. Prints ns per write.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

int main(void)
{
	size_t len = 1 << 22;
	unsigned char *p = mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return 1;
	memset(p, 0x90, len);
	mprotect(p, len, PROT_READ | PROT_EXEC);
	int fd = open("/proc/self/mem", O_RDWR | O_CLOEXEC);
	if (fd < 0) {
		perror("/proc/self/mem");
		return 1;
	}
	int n = 300000;
	double t = now();
	for (int i = 0; i < n; i++) {
		unsigned char b = 0xcc;
		if (pwrite(fd, &b, 1, (off_t)(p + (i * 13) % len)) != 1) {
			perror("pwrite");
			return 1;
		}
	}
	printf("pwrite 1 byte:  %.0f ns each\n", (now() - t) / n * 1e9);
	t = now();
	for (int i = 0; i < n; i++) {
		unsigned char b[4] = {1, 2, 3, 4};
		if (pwrite(fd, b, 4, (off_t)(p + (i * 13) % len)) != 4)
			return 1;
	}
	printf("pwrite 4 bytes: %.0f ns each\n", (now() - t) / n * 1e9);
	static unsigned char page[4096];
	int pages = (int)(len / 4096);
	t = now();
	for (int r = 0; r < 10; r++)
		for (int i = 0; i < pages; i++)
			if (pwrite(fd, page, 4096, (off_t)(p + (size_t)i * 4096)) != 4096)
				return 1;
	printf("pwrite 4 KiB:   %.0f ns each (a page)\n", (now() - t) / (10.0 * pages) * 1e9);
	return 0;
}
