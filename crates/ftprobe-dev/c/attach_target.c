/* attach_target: a running program for `ftprobe trace -p` (attach) tests. Built with
 * -pg -mfentry -mnop-mcount -mrecord-mcount (NOP5 sites in __mcount_loc), -pthread.
 *
 * `attach_target`: four threads besides main, all started before it prints `ready`:
 *   - sleeper: nanosleep(2 ms) in a loop, calling attach_loop() after each;
 *   - reader: one read() of a pipe, which main writes at `quit`;
 *   - busy: attach_loop() in a loop;
 *   - selfsig: pthread_kill(self, SIGUSR1) in a loop (only this thread leaves SIGUSR1
 *     unblocked), its handler counting; then nanosleep(1 ms).
 * Every blocked call checks its result: an EINTR (or any other failure) is counted.
 * main reads commands on stdin, one per line:
 *   - `window N`: calls attach_window() exactly N times, prints `window N done`;
 *   - `nap MS`: one nanosleep of MS milliseconds (< 1000) in main, prints `nap done`;
 *   - `quit`: stops and joins the threads, prints
 *     `eintr=E bad=B selfsig=ok|SENT/GOT reader=R busy=yes|no`, exits 0.
 * `ready` comes once every thread has run (busy: made its first call). Every line is
 * flushed at once. The output depends on the commands only.
 *
 * `attach_target prof`: the same, with the profiling timer on (ITIMER_PROF every 1 ms of the
 * process's CPU time, as gprof's `-pg` runtime sets it, at a finer step) and a SIGPROF
 * handler (SA_RESTART) counting. The kernel sends each SIGPROF to the thread whose CPU time
 * made it, unless that thread blocks it: the sleeper's nanosleep never sees one unless a
 * running thread blocked SIGPROF (an EINTR is counted).
 *
 * `attach_target strict`: prints `ready`, enters strict seccomp (read, write, _exit,
 * sigreturn), reads one byte of stdin, writes `bye`, exits 0 with SYS_exit.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/time.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static atomic_int stop;
static atomic_long eintr, bad, busy_calls, sig_sent, sig_got;
static int pipefd[2];
static atomic_int reader_got;
/* Threads that have run (busy: made its first call); main says `ready` once all four did. */
static atomic_int started;

__attribute__((noinline)) long attach_loop(long x)
{
	__asm__ volatile("" ::: "memory");
	return x * 3 + 1;
}

__attribute__((noinline)) long attach_window(long x)
{
	__asm__ volatile("" ::: "memory");
	return x + 7;
}

static atomic_long prof_got;

static void on_prof(int sig)
{
	(void)sig;
	atomic_fetch_add(&prof_got, 1);
}

static void on_usr1(int sig)
{
	(void)sig;
	atomic_fetch_add(&sig_got, 1);
}

static void nap(long ns)
{
	struct timespec ts = {0, ns};
	if (nanosleep(&ts, NULL) != 0) {
		if (errno == EINTR)
			atomic_fetch_add(&eintr, 1);
		else
			atomic_fetch_add(&bad, 1);
	}
}

static void *sleeper(void *arg)
{
	(void)arg;
	long i = 0;
	atomic_fetch_add(&started, 1);
	while (!atomic_load(&stop)) {
		nap(2000000);
		attach_loop(i++);
	}
	return NULL;
}

static void *reader(void *arg)
{
	(void)arg;
	char c;
	atomic_fetch_add(&started, 1);
	ssize_t n = read(pipefd[0], &c, 1);
	if (n == 1)
		atomic_store(&reader_got, 1);
	else if (n < 0 && errno == EINTR)
		atomic_fetch_add(&eintr, 1);
	else
		atomic_fetch_add(&bad, 1);
	return NULL;
}

static void *busy(void *arg)
{
	(void)arg;
	long i = 0;
	while (!atomic_load(&stop)) {
		attach_loop(i++);
		if (atomic_fetch_add(&busy_calls, 1) == 0)
			atomic_fetch_add(&started, 1);
	}
	return NULL;
}

static void *selfsig(void *arg)
{
	(void)arg;
	sigset_t s;
	sigemptyset(&s);
	sigaddset(&s, SIGUSR1);
	pthread_sigmask(SIG_UNBLOCK, &s, NULL);
	atomic_fetch_add(&started, 1);
	while (!atomic_load(&stop)) {
		atomic_fetch_add(&sig_sent, 1);
		pthread_kill(pthread_self(), SIGUSR1);
		/* The handler may interrupt this sleep: an EINTR expected here, not counted. */
		struct timespec ts = {0, 1000000};
		nanosleep(&ts, NULL);
	}
	return NULL;
}

static int strict_mode(void)
{
	printf("ready\n");
	fflush(stdout);
	if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_STRICT) != 0) {
		perror("prctl");
		return 1;
	}
	char c;
	if (syscall(SYS_read, 0, &c, 1) != 1)
		syscall(SYS_exit, 3);
	syscall(SYS_write, 1, "bye\n", 4);
	syscall(SYS_exit, 0);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc > 1 && strcmp(argv[1], "strict") == 0)
		return strict_mode();
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_usr1;
	sigaction(SIGUSR1, &sa, NULL);
	/* SIGUSR1 only for the selfsig thread: blocked here, inherited by the others. */
	sigset_t s;
	sigemptyset(&s);
	sigaddset(&s, SIGUSR1);
	pthread_sigmask(SIG_BLOCK, &s, NULL);
	if (argc > 1 && strcmp(argv[1], "prof") == 0) {
		struct sigaction sp;
		memset(&sp, 0, sizeof(sp));
		sp.sa_handler = on_prof;
		sp.sa_flags = SA_RESTART;
		sigaction(SIGPROF, &sp, NULL);
		struct itimerval it = {{0, 1000}, {0, 1000}};
		setitimer(ITIMER_PROF, &it, NULL);
	}
	if (pipe(pipefd) != 0)
		return 2;
	pthread_t t[4];
	pthread_create(&t[0], NULL, sleeper, NULL);
	pthread_create(&t[1], NULL, reader, NULL);
	pthread_create(&t[2], NULL, busy, NULL);
	pthread_create(&t[3], NULL, selfsig, NULL);
	while (atomic_load(&started) < 4) {
		struct timespec ts = {0, 100000};
		nanosleep(&ts, NULL);
	}
	printf("ready\n");
	fflush(stdout);
	char line[128];
	for (;;) {
		errno = 0;
		if (!fgets(line, sizeof line, stdin)) {
			if (errno == EINTR)
				atomic_fetch_add(&eintr, 1);
			break;
		}
		long n;
		if (sscanf(line, "window %ld", &n) == 1) {
			long sum = 0;
			for (long i = 0; i < n; i++)
				sum += attach_window(i);
			printf("window %ld done\n", n);
			fflush(stdout);
			if (sum != n * (n - 1) / 2 + 7 * n)
				atomic_fetch_add(&bad, 1);
		} else if (sscanf(line, "nap %ld", &n) == 1) {
			nap(n * 1000000);
			printf("nap done\n");
			fflush(stdout);
		} else if (strncmp(line, "quit", 4) == 0) {
			break;
		}
	}
	atomic_store(&stop, 1);
	if (write(pipefd[1], "x", 1) != 1)
		atomic_fetch_add(&bad, 1);
	for (int i = 0; i < 4; i++)
		pthread_join(t[i], NULL);
	long sent = atomic_load(&sig_sent), got = atomic_load(&sig_got);
	if (sent == got)
		printf("eintr=%ld bad=%ld selfsig=ok reader=%d busy=%s\n", atomic_load(&eintr),
		       atomic_load(&bad), atomic_load(&reader_got),
		       atomic_load(&busy_calls) > 0 ? "yes" : "no");
	else
		printf("eintr=%ld bad=%ld selfsig=%ld/%ld reader=%d busy=%s\n",
		       atomic_load(&eintr), atomic_load(&bad), sent, got,
		       atomic_load(&reader_got), atomic_load(&busy_calls) > 0 ? "yes" : "no");
	return 0;
}
