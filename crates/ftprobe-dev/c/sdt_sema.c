/* The guarded marker of the sdt fixture (c/sdt.c): with _SDT_HAS_SEMAPHORES every marker of
 * this file has a semaphore, ftp_guarded_semaphore, in the .probes section; a tracer that
 * probes the marker raises it, and FTP_GUARDED_ENABLED() (the dtrace -h convention) lets the
 * round run the marker only then. */
#define _SDT_HAS_SEMAPHORES 1
#include <sys/sdt.h>

__extension__ unsigned short ftp_guarded_semaphore __attribute__((unused))
__attribute__((section(".probes")));
#define FTP_GUARDED_ENABLED() __builtin_expect(ftp_guarded_semaphore, 0)

__attribute__((noinline)) int sdt_guarded_round(int i) {
    if (FTP_GUARDED_ENABLED()) {
        long sq = (long)i * i;
        STAP_PROBE2(ftp, guarded, i, sq);
        return 1;
    }
    return 0;
}
