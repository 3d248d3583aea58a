/* exec_a [MODE PROG ARGS...]: the first image of --follow-exec's tests (issue 13, item 5).
 * Calls ea_one() 3 times and ea_two() 5 times; MODE `threads` first starts 3 threads that
 * call ea_thread() once each and then wait forever (they die at the exec). Prints its own
 * counts (`exec_a ea_one=3 ea_two=5 ea_thread=T`) and every environment entry that starts
 * with FTPROBE_ or LD_PRELOAD (`exec_a env ENTRY`), then, with MODE `exec`, `threads` or
 * `closefds` (which first closes every descriptor from 3 to 1023), execs PROG ARGS (execv);
 * MODE `vfork`: a vfork child execs PROG ARGS, and this process, once it ended, calls
 * ea_one() twice more, prints `exec_a ea_one=5 ea_two=5 ea_thread=0` and exits with the
 * child's status. Built -no-pie, as exec_b: their functions' addresses overlap. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

static volatile int sink;
static int threads_called;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;

__attribute__((noinline)) void ea_one(int x) { sink += x; }
__attribute__((noinline)) void ea_two(int x) { sink -= x; }

__attribute__((noinline)) void ea_thread(void)
{
    pthread_mutex_lock(&mu);
    threads_called++;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
}

static void *thread_main(void *arg)
{
    (void)arg;
    ea_thread();
    for (;;)
        pause();
    return NULL;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    int threads = !strcmp(mode, "threads");
    if (threads) {
        for (int i = 0; i < 3; i++) {
            pthread_t t;
            pthread_create(&t, NULL, thread_main, NULL);
        }
        pthread_mutex_lock(&mu);
        while (threads_called < 3)
            pthread_cond_wait(&cv, &mu);
        pthread_mutex_unlock(&mu);
    }
    for (int i = 0; i < 3; i++)
        ea_one(i);
    for (int i = 0; i < 5; i++)
        ea_two(i);
    if (!strcmp(mode, "vfork") && argc > 2) {
        /* The child execs PROG ARGS; this process goes on, traced, after it. The pause:
         * as before an exec below (the live naming window, a known limit). */
        usleep(250000);
        pid_t p = vfork();
        if (p == 0) {
            execv(argv[2], argv + 2);
            _exit(126);
        }
        int st = 0;
        waitpid(p, &st, 0);
        ea_one(3);
        ea_one(4);
        printf("exec_a ea_one=5 ea_two=5 ea_thread=0\n");
        return WEXITSTATUS(st);
    }
    printf("exec_a ea_one=3 ea_two=5 ea_thread=%d\n", threads_called);
    for (char **e = environ; *e; e++)
        if (!strncmp(*e, "FTPROBE_", 8) || !strncmp(*e, "LD_PRELOAD", 10))
            printf("exec_a env %s\n", *e);
    fflush(stdout);
    int closefds = !strcmp(mode, "closefds");
    if (closefds)
        for (int fd = 3; fd < 1024; fd++)
            close(fd);
    if ((threads || closefds || !strcmp(mode, "exec")) && argc > 2) {
        /* A live trace names a record from the objects it knows when it prints it: records
         * printed after the new image appended its objects but before its announcement was
         * read can take the new image's names (a known limit, README). The pause lets the
         * live trace print this image's records first, so that the tests check the naming
         * itself; record + replay have no such window. */
        usleep(250000);
        execv(argv[2], argv + 2);
        perror("execv");
        return 126;
    }
    return 0;
}
