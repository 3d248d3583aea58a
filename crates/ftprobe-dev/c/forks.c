/* forks MODE: the parent calls leaf() 3 times and forks a child that calls leaf() 5 times.
 * MODE "wait": the parent waits for the child. MODE "daemon": the parent returns at once and
 * the child calls leaf() only after 300 ms (its parent is gone by then). MODE "hold": as
 * "daemon", but the child calls leaf() only once its standard input ends (the test decides
 * when, not the scheduler). Prints "forks done" from the parent. Built with -fpatchable-function-entry=5 (ftrace sites). */
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

volatile long sink;

__attribute__((noipa)) void leaf(long x)
{
	sink += x;
}

int main(int argc, char **argv)
{
	int hold = argc > 1 && strcmp(argv[1], "hold") == 0;
	int daemon = hold || (argc > 1 && strcmp(argv[1], "daemon") == 0);
	for (long i = 0; i < 3; i++)
		leaf(i);
	fflush(stdout);
	pid_t pid = fork();
	if (pid == 0) {
		if (hold) {
			char c;
			while (read(0, &c, 1) > 0)
				;
		} else if (daemon) {
			struct timespec ts = {0, 300 * 1000 * 1000};
			nanosleep(&ts, NULL);
		}
		for (long i = 0; i < 5; i++)
			leaf(100 + i);
		_exit(0);
	}
	if (!daemon)
		waitpid(pid, NULL, 0);
	printf("forks done\n");
	return 0;
}
