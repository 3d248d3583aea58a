/* sigstack [SIZE]: a SIGUSR1 handler on a sigaltstack calls hf(); the stack is painted first,
 * and the program prints how many bytes of it the handler (and whatever traced it) used:
 * "used N". With SIZE, the alternate stack is SIZE bytes with an inaccessible page below it
 * (SIZE a multiple of 4096): a probe path that needs more overflows it and the program dies
 * of SIGSEGV. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

__attribute__((noinline)) void hf(long x) { __asm__ volatile("" ::"r"(x)); }

static void handler(int s) { hf(s); }

int main(int argc, char **argv)
{
    size_t size = argc > 1 ? strtoul(argv[1], 0, 0) : 65536;
    size_t page = 4096;
    char *map = mmap(0, size + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED || mprotect(map, page, PROT_NONE)) {
        perror("mmap");
        return 2;
    }
    char *stk = map + page;
    memset(stk, 0xAA, size);
    stack_t ss = {.ss_sp = stk, .ss_size = size, .ss_flags = 0};
    if (sigaltstack(&ss, 0)) {
        perror("sigaltstack");
        return 2;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = handler;
    sa.sa_flags = SA_ONSTACK;
    sigaction(SIGUSR1, &sa, 0);
    raise(SIGUSR1);
    raise(SIGUSR1);
    size_t i = 0;
    while (i < size && (unsigned char)stk[i] == 0xAA)
        i++;
    printf("used %zu\n", size - i);
    return 0;
}
