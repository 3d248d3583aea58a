/* ctors: links libfxctors (ctors_lib.c), calls lib_traced once, joins the thread the
 * library's constructor started (it calls thread_work 4 times), and prints one line with
 * printf; the line reaches stdout at exit, through stdio's flush (a write(2) after every
 * destructor). With the library's constructor (2 calls) and destructor (3), lib_traced runs
 * 6 times; the library's destructor prints the count on stderr. */
#include <stdio.h>

long lib_traced(long x);
long lib_join(void);

int main(void)
{
    lib_traced(0);
    printf("ctors main done thread_work=%ld\n", lib_join());
    return 0;
}
