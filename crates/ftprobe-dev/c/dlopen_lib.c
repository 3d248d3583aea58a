/* libdlfix.so (and libdlfix2.so, built with -DWORK=dl2_work -DCTOR=dl2_ctor): loaded with
 * dlopen by dlopen_main, built with -fpatchable-function-entry=5. Its constructor calls WORK
 * CTOR_CALLS times (arguments 0, 1, 2) inside dlopen; the program calls WORK through dlsym
 * and reads the constructor's count with dl_ctor_calls (a reload starts from 0 again). */
#ifndef WORK
#define WORK dl_work
#define CTOR dl_ctor
#endif
#define CTOR_CALLS 3

static volatile long ctor_calls;

__attribute__((noinline)) long WORK(long x)
{
    __asm__ volatile("" ::: "memory");
    return x * 2 + 1;
}

__attribute__((constructor)) static void CTOR(void)
{
    for (long i = 0; i < CTOR_CALLS; i++) {
        WORK(i);
        ctor_calls++;
    }
}

long dl_ctor_calls(void) { return ctor_calls; }
