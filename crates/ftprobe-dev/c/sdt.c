/* sdt N: SDT markers (<sys/sdt.h>, systemtap-sdt-dev) for `ftprobe list sdt` and probes on
 * markers. Each of N rounds hits:
 *   ftp:args     5 arguments: a negative int, a char, a long, the constant 5, a string;
 *   ftp:inlined  from an always_inline function called at 3 places (3 copies of the
 *                marker), once per round at each;
 *   ftp:guarded  (sdt_sema.c) only while its semaphore is set (a tracer counts it);
 *   ftp:mem      a volatile local (a memory operand) and its address;
 *   ftp:global   two globals (RIP-relative operands, in .data and .bss) and the round;
 *   ftp:noargs   no arguments.
 * Prints, per round, the values it passes (`args i=I neg=.. c=.. l=.. s=.. mem=..`,
 * `global i=I g=.. b=..`), then its own counts: `inlined=3N guarded=G noargs=N`.
 * `sdt -`: prints `ready`, then runs a round per line on stdin, each answered by
 * `done guarded=G` (for attach). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sdt.h>

int sdt_guarded_round(int i); /* sdt_sema.c: 1 when the guarded marker ran */

static const char *const names[] = {"alpha", "beta", "gamma"};
static int inlined_count;
/* ftp:global's operands: RIP-relative memory operands, in .data and in .bss */
volatile long sdt_global = 1000;
volatile long sdt_bss;

static inline __attribute__((always_inline)) void inlined_marker(int where) {
    inlined_count++;
    STAP_PROBE1(ftp, inlined, where);
}

__attribute__((noinline)) void place_a(void) { inlined_marker(1); }
__attribute__((noinline)) void place_b(void) { inlined_marker(2); }
__attribute__((noinline)) void place_c(void) { inlined_marker(3); }

__attribute__((noinline)) void round_args(int i) {
    int neg = -(i + 1) * 7;
    char c = (char)('a' + i % 26);
    long l = 1000000000000L * (i + 1);
    const char *s = names[i % 3];
    volatile long on_stack = l + i; /* a memory operand (8@OFFS(%rsp or %rbp)) */
    STAP_PROBE5(ftp, args, neg, c, l, 5, s);
    STAP_PROBE2(ftp, mem, on_stack, &on_stack);
    printf("args i=%d neg=%d c=%c l=%ld s=%s mem=%ld\n", i, neg, c, l, s, (long)on_stack);
}

static int guarded, noargs;

static void one_round(int i) {
    round_args(i);
    place_a();
    place_b();
    place_c();
    guarded += sdt_guarded_round(i);
    sdt_global += i;
    sdt_bss -= 3;
    STAP_PROBE3(ftp, global, sdt_global, i, sdt_bss);
    printf("global i=%d g=%ld b=%ld\n", i, (long)sdt_global, (long)sdt_bss);
    STAP_PROBE(ftp, noargs);
    noargs++;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "-") == 0) {
        /* Driven by a tracer that attaches: a round per `round` line on stdin, each
         * answered by `done guarded=G` (G: the guarded marker's runs so far). */
        char line[64];
        printf("ready\n");
        fflush(stdout);
        for (int i = 0; fgets(line, sizeof line, stdin); i++) {
            one_round(i);
            printf("done guarded=%d\n", guarded);
            fflush(stdout);
        }
        return 0;
    }
    int n = argc > 1 ? atoi(argv[1]) : 3;
    for (int i = 0; i < n; i++)
        one_round(i);
    printf("inlined=%d guarded=%d noargs=%d\n", inlined_count, guarded, noargs);
    return 0;
}
