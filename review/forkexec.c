#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <sys/wait.h>
#include <string.h>
__attribute__((noinline)) long work(long x) { return x * 3 + 1; }
int main(int argc, char **argv) {
    long s = 0;
    if (argc > 1 && !strcmp(argv[1], "child")) { for (int i = 0; i < 50; i++) s += work(i); printf("exec'd child s=%ld\n", s); return 7; }
    for (int i = 0; i < 100; i++) s += work(i);
    fflush(stdout);
    pid_t p = fork();
    if (p == 0) { for (int i = 0; i < 30; i++) s += work(i); printf("forked child s=%ld\n", s); fflush(stdout); execl(argv[0], argv[0], "child", (char *)0); _exit(99); }
    int st; waitpid(p, &st, 0);
    printf("parent s=%ld child status=%d\n", s, WEXITSTATUS(st));
    int r = system("echo from-system");
    printf("system=%d\n", r);
    return 0;
}
