// tight libc loops in threads: strlen, memcpy, malloc/free; program's own counts
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static long n_strlen[8], n_memcpy[8], n_malloc[8];
volatile size_t sink;
static void *thr(void *a) {
    long id = (long)a; char buf[256], src[256];
    memset(src, 'x', 255); src[255] = 0;
    for (int i = 0; i < 20000; i++) {
        src[i % 200 + 10] = 0;
        sink += strlen(src); n_strlen[id]++;
        src[i % 200 + 10] = 'x';
        memcpy(buf, src, (i % 250) + 1); n_memcpy[id]++;
        void *p = malloc(i % 1000 + 1); n_malloc[id]++; sink += (size_t)p & 1; free(p);
    }
    return 0;
}
int main(int argc, char **argv) {
    int nt = argc > 1 ? atoi(argv[1]) : 4; pthread_t t[8];
    for (long i = 0; i < nt; i++) pthread_create(&t[i], 0, thr, (void *)i);
    long a = 0, b = 0, c = 0;
    for (int i = 0; i < nt; i++) { pthread_join(t[i], 0); a += n_strlen[i]; b += n_memcpy[i]; c += n_malloc[i]; }
    printf("strlen=%ld memcpy=%ld malloc=%ld\n", a, b, c);
    return 0;
}
