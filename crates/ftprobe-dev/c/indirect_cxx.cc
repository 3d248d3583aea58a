// indirect_cxx: real C++ virtual calls, as g++ compiles them (-O2 -fno-devirtualize: the
// call stays indirect, `call *OFF(%rax)` through the vtable), for int3 probes on them.
//
// `indirect_cxx N` builds N shapes of three classes, calls `total` (which makes one
// virtual call per shape) three times, and prints how many virtual calls it made, how many
// times each override ran and the sum. Exits 3.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

static long rect_calls, square_calls, tri_calls;

struct Shape {
    virtual ~Shape() {}
    virtual long sides() const = 0;
    virtual long area() const = 0;
};
struct Rect : Shape {
    long w, h;
    Rect(long w, long h) : w(w), h(h) {}
    long sides() const override { return 4; }
    long area() const override { rect_calls++; return w * h; }
};
struct Square : Rect {
    explicit Square(long s) : Rect(s, s) {}
    long area() const override { square_calls++; return w * w + 1000; }
};
struct Tri : Shape {
    long b, h;
    Tri(long b, long h) : b(b), h(h) {}
    long sides() const override { return 3; }
    long area() const override { tri_calls++; return b * h / 2; }
};

static long virtual_calls;

// One virtual call per shape: the probed instruction.
extern "C" __attribute__((noinline)) long total(Shape *const *v, long n) {
    long s = 0;
    for (long i = 0; i < n; i++)
        s += v[i]->area();
    virtual_calls += n;
    return s;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 7;
    std::vector<std::unique_ptr<Shape>> own;
    std::vector<Shape *> v;
    for (long i = 0; i < n; i++) {
        switch (i % 3) {
        case 0: own.emplace_back(new Rect(i, 2)); break;
        case 1: own.emplace_back(new Square(i)); break;
        default: own.emplace_back(new Tri(i, 4)); break;
        }
        v.push_back(own.back().get());
    }
    long sum = 0;
    for (int k = 0; k < 3; k++)
        sum += total(v.data(), n);
    printf("virtual_calls=%ld rect=%ld square=%ld tri=%ld sum=%ld\n", virtual_calls, rect_calls,
           square_calls, tri_calls, sum);
    return 3;
}
