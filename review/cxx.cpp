// virtual calls, indirect calls, exceptions through probed functions
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <vector>
#include <memory>
struct Shape { virtual ~Shape() {} virtual long area(long k) const = 0; };
struct Sq : Shape { long s; Sq(long s) : s(s) {} long area(long k) const override { return s * s + k; } };
struct Ci : Shape { long r; Ci(long r) : r(r) {} long area(long k) const override { if (r == 13 && k % 1000 == 7) throw std::runtime_error("thirteen"); return 3 * r * r + k; } };
long throws_caught;
__attribute__((noinline)) long total(const std::vector<std::unique_ptr<Shape>> &v, long k) {
    long t = 0;
    for (auto &p : v) t += p->area(k);   // virtual call site
    return t;
}
__attribute__((noinline)) long middle(const std::vector<std::unique_ptr<Shape>> &v, long k) {
    long t = total(v, k);
    return t + 1;
}
typedef long (*fn_t)(long);
__attribute__((noinline)) long f1(long x) { return x + 1; }
__attribute__((noinline)) long f2(long x) { return x * 2; }
fn_t tbl[2] = {f1, f2};
__attribute__((noinline)) long indirect(long i) { return tbl[i & 1](i); }
int main(int argc, char **argv) {
    std::vector<std::unique_ptr<Shape>> v;
    for (long i = 0; i < 20; i++) { if (i & 1) v.emplace_back(new Sq(i)); else v.emplace_back(new Ci(i)); }
    v.emplace_back(new Ci(13));
    long acc = 0, n = argc > 1 ? atol(argv[1]) : 100000;
    for (long k = 0; k < n; k++) {
        try { acc += middle(v, k); } catch (const std::exception &e) { throws_caught++; }
        acc += indirect(k);
    }
    printf("acc=%ld caught=%ld\n", acc, throws_caught);
    return 0;
}
