/* procs_tree: a known call tree in two processes of two threads each, for `ftprobe dump`
 * (sites by attribute only). a(x) calls b(x) x % 3 + 1 times; b(x) calls c(x) twice. The
 * main thread calls a(0) and a(1), its thread "pworker" a(2); then main forks a child
 * "pchild" that calls a(3), its thread "cworker" a(4) and a(5). Each thread prints its own
 * process id, thread id, name and call counts: `T pid tid name a=A b=B c=C`. A thread is
 * named before it is created (by its creator renaming itself for the moment): its ring
 * keeps the name it had when it claimed it. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#define SITE __attribute__((noinline, patchable_function_entry(5, 0)))

static __thread int na, nb, nc;
static volatile unsigned long sink;

static void spin(unsigned n)
{
    for (unsigned i = 0; i < n; i++)
        sink += i;
}

SITE void c(unsigned x)
{
    nc++;
    spin(300 + x);
}

SITE void b(unsigned x)
{
    nb++;
    spin(200);
    c(x);
    c(x + 1);
}

SITE void a(unsigned x)
{
    na++;
    spin(100);
    for (unsigned i = 0; i < x % 3 + 1; i++)
        b(x);
}

static void report(void)
{
    char name[17] = {0};
    prctl(PR_GET_NAME, name);
    printf("T %d %d %s a=%d b=%d c=%d\n", (int)getpid(), (int)gettid(), name, na, nb, nc);
}

static void *pworker(void *arg)
{
    (void)arg;
    a(2);
    report();
    return NULL;
}

static void *cworker(void *arg)
{
    (void)arg;
    a(4);
    a(5);
    report();
    return NULL;
}

/* Start `fn` in a thread named `name`, and wait for it. */
static void run_thread(void *(*fn)(void *), const char *name)
{
    char self[17] = {0};
    pthread_t t;
    prctl(PR_GET_NAME, self);
    pthread_setname_np(pthread_self(), name);
    pthread_create(&t, NULL, fn, NULL);
    pthread_setname_np(pthread_self(), self);
    pthread_join(t, NULL);
}

int main(void)
{
    a(0);
    a(1);
    run_thread(pworker, "pworker");
    report();
    fflush(stdout);
    pthread_setname_np(pthread_self(), "pchild");
    pid_t pid = fork();
    if (pid == 0) {
        /* The child counts its own calls (it inherits the parent's counters). */
        na = nb = nc = 0;
        a(3);
        run_thread(cworker, "cworker");
        report();
        fflush(stdout);
        _exit(0);
    }
    pthread_setname_np(pthread_self(), "procs_tree");
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}
