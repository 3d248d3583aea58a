/* tsd_exit [THREADS]: THREADS threads (default 40) each call `work` once, then end; a
 * pthread_key destructor (and, through it, a second round: the destructor sets its key again
 * once) calls `work` 10 more times per round at the thread's end, as glibc runs key
 * destructors after the thread function returned. Prints the program's own count. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static pthread_key_t key;
static long work_calls;

__attribute__((noinline)) void work(long x)
{
    __asm__ volatile("" ::"r"(x));
    __atomic_add_fetch(&work_calls, 1, __ATOMIC_RELAXED);
}

static void dtor(void *p)
{
    for (int i = 0; i < 10; i++)
        work(i);
    if (p == (void *)1)
        pthread_setspecific(key, (void *)2); /* a second round */
}

static void *thr(void *a)
{
    (void)a;
    pthread_setspecific(key, (void *)1);
    work(-1);
    return 0;
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 40;
    pthread_key_create(&key, dtor);
    for (int i = 0; i < n; i++) {
        pthread_t t;
        pthread_create(&t, 0, thr, 0);
        pthread_join(t, 0);
    }
    printf("work=%ld\n", work_calls);
    return 0;
}
