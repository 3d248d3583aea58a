/* execs MODE: calls work() twice, tries to exec a file that does not exist (execv: fails
 * with ENOENT, and keeps going), calls work() once more, then replaces itself with
 * `sh -c 'exit 7'` through the exec function MODE names (execve, execv, execvp, execvpe,
 * execl, execle, execlp, fexecve, execveat). The new image runs untraced and exits 7. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

extern char **environ;

__attribute__((noinline)) int work(int x)
{
    return x * 3 + 1;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "execv";
    char *args[] = {"sh", "-c", "exit 7", NULL};
    int sum = work(1) + work(2);
    execv("/nonexistent/ftprobe-no-such-program", args);
    sum += work(3);
    fprintf(stderr, "execs sum=%d\n", sum);
    if (!strcmp(mode, "execve"))
        execve("/bin/sh", args, environ);
    else if (!strcmp(mode, "execv"))
        execv("/bin/sh", args);
    else if (!strcmp(mode, "execvp"))
        execvp("sh", args);
    else if (!strcmp(mode, "execvpe"))
        execvpe("sh", args, environ);
    else if (!strcmp(mode, "execl"))
        execl("/bin/sh", "sh", "-c", "exit 7", (char *)NULL);
    else if (!strcmp(mode, "execle"))
        execle("/bin/sh", "sh", "-c", "exit 7", (char *)NULL, environ);
    else if (!strcmp(mode, "execlp"))
        execlp("sh", "sh", "-c", "exit 7", (char *)NULL);
    else if (!strcmp(mode, "fexecve")) {
        int fd = open("/bin/sh", O_RDONLY);
        fexecve(fd, args, environ);
    } else if (!strcmp(mode, "execveat"))
        execveat(AT_FDCWD, "/bin/sh", args, environ, 0);
    perror(mode);
    return 1;
}
