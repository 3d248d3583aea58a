// sdt_throw N: throws and catches N exceptions (no SDT of its own: libstdc++'s markers
// libstdcxx:throw and libstdcxx:catch fire), printing each thrown object's address
// (`thrown I obj=0x...`, the address __cxa_throw gets), then `caught=N`.
#include <cstdio>
#include <cstdlib>

struct Boom {
    int n;
};

__attribute__((noinline)) static void thrower(int i) { throw Boom{i}; }

int main(int argc, char **argv) {
    int n = argc > 1 ? std::atoi(argv[1]) : 3;
    int caught = 0;
    for (int i = 0; i < n; i++) {
        try {
            thrower(i);
        } catch (const Boom &b) {
            std::printf("thrown %d obj=%p\n", b.n, static_cast<const void *>(&b));
            caught++;
        }
    }
    std::printf("caught=%d\n", caught);
    return 0;
}
