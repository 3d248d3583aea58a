// cxx_stl N: libstdc++ templates instantiated in the program, built at -O0 with -mfentry
// sites so that they stay out of line: a std::vector<std::string> grown by push_back to N
// strings (std::__relocate_a_1<...>), std::fill on an array and on a vector of a struct
// (std::__fill_a1<...>, whose return type is an enable_if expression). Prints
// "cxx_stl=<N> <1 + N> <3 + N>".
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

struct Pt {
    long x, y;
};

int main(int argc, char **argv)
{
    long n = argc > 1 ? std::atol(argv[1]) : 9;
    std::vector<std::string> v;
    for (long i = 0; i < n; i++)
        v.push_back(std::to_string(i));
    Pt a[8];
    std::fill(a, a + 8, Pt{1, n});
    std::vector<Pt> w(5);
    std::fill(w.begin(), w.end(), Pt{3, n});
    std::printf("cxx_stl=%zu %ld %ld\n", v.size(), a[7].x + a[7].y, w[4].x + w[4].y);
    return 0;
}
