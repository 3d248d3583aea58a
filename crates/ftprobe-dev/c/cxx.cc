// cxx N: a C++ program with ftrace sites (-pg -mfentry -mrecord-mcount): main calls
// ns::K::get(i) N times (default 3) and ns::twice<long>(i) once per call; prints "cxx=<sum>".
#include <cstdio>
#include <cstdlib>

namespace ns {
struct K {
    long base;
    __attribute__((noinline)) long get(long i) const
    {
        asm volatile("");
        return base + i;
    }
};
template <typename T> __attribute__((noinline)) T twice(T x)
{
    asm volatile("");
    return 2 * x;
}
} // namespace ns

int main(int argc, char **argv)
{
    long n = argc > 1 ? std::atol(argv[1]) : 3;
    ns::K k{100};
    long sum = 0;
    for (long i = 0; i < n; i++)
        sum += ns::twice<long>(k.get(i));
    std::printf("cxx=%ld\n", sum);
    return 0;
}
