/* libslowctor.so, dlopened by probepath's dlopen mode: its constructor sleeps 1 s, holding
 * the loader's lock meanwhile (glibc runs constructors under it). */
#include <unistd.h>

__attribute__((constructor)) static void slow(void)
{
    sleep(1);
}
