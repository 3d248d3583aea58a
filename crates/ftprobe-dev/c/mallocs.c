/* mallocs: built with no site flags at all (an "unmodified" program). Calls malloc with the
 * sizes 11, 222, 3333, 44444 in that order (through a volatile pointer, so the compiler keeps
 * every call), frees them, prints "mallocs done". */
#include <stdio.h>
#include <stdlib.h>

static void *(*volatile alloc)(size_t) = malloc;

int main(void)
{
    static const size_t sizes[] = {11, 222, 3333, 44444};
    void *p[4];
    for (int i = 0; i < 4; i++)
        p[i] = alloc(sizes[i]);
    for (int i = 0; i < 4; i++)
        free(p[i]);
    puts("mallocs done");
    return 0;
}
