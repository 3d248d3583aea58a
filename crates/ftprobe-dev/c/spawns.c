/* spawns: no site flags. Starts children the three ways glibc starts them with a
 * vfork-like clone whose child resets signal handlers before exec: system(), popen(),
 * posix_spawn(). Prints "system=<exit status> popen=<line> spawn=<exit status>". */
#include <spawn.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>

extern char **environ;

int main(void)
{
	int sys = system("exit 3");
	char line[64] = "";
	FILE *p = popen("echo from-popen", "r");
	if (p) {
		if (!fgets(line, sizeof line, p))
			line[0] = 0;
		line[strcspn(line, "\n")] = 0;
		pclose(p);
	}
	pid_t pid;
	char *argv[] = {"sh", "-c", "exit 4", NULL};
	int st = -1;
	if (posix_spawn(&pid, "/bin/sh", NULL, NULL, argv, environ) == 0)
		waitpid(pid, &st, 0);
	printf("system=%d popen=%s spawn=%d\n", WIFEXITED(sys) ? WEXITSTATUS(sys) : -WTERMSIG(sys), line,
	       WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st));
	return 0;
}
