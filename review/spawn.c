#include <stdio.h>
#include <stdlib.h>
#include <spawn.h>
#include <sys/wait.h>
extern char **environ;
int main(void) {
    int ok = 0;
    for (int i = 0; i < 20; i++) {
        pid_t p; char *argv[] = {"/bin/true", 0};
        if (posix_spawn(&p, "/bin/true", 0, 0, argv, environ) == 0) { int st; waitpid(p, &st, 0); if (WIFEXITED(st) && WEXITSTATUS(st) == 0) ok++; else printf("child %d status %#x\n", i, st); }
        if (system("exit 3") == 3 << 8) ok++;
        FILE *f = popen("echo hi", "r"); char b[8]; if (f && fgets(b, 8, f)) ok++; if (f) pclose(f);
    }
    printf("ok=%d\n", ok);
    return 0;
}
