// thread-specific-data destructors and thread_local C11 dtors call a probed function at thread end
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
static pthread_key_t key; static long dtor_calls, work_calls;
__attribute__((noinline)) void work(long x) { __atomic_add_fetch(&work_calls, 1, __ATOMIC_RELAXED); }
static void dtor(void *p) { __atomic_add_fetch(&dtor_calls, 1, __ATOMIC_RELAXED); for (int i = 0; i < 10; i++) work(i); free(p); }
static void *thr(void *a) { pthread_setspecific(key, malloc(16)); work(-1); return 0; }
int main(void) {
    pthread_key_create(&key, dtor);
    for (int r = 0; r < 20; r++) { pthread_t t[4]; for (int i = 0; i < 4; i++) pthread_create(&t[i], 0, thr, 0); for (int i = 0; i < 4; i++) pthread_join(t[i], 0); }
    printf("dtor=%ld work=%ld\n", dtor_calls, work_calls);
    return 0;
}
