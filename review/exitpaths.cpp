// probed function called from: C++ thread_local destructors, atexit handlers, static destructors,
// and a detached thread's pthread_cleanup handler; the program counts the calls itself
#include <cstdio>
#include <cstdlib>
#include <pthread.h>
#include <thread>
#include <vector>
#include <atomic>
std::atomic<long> from_tls{0}, from_cleanup{0}, total_work{0};
extern "C" __attribute__((noinline)) void work(long where) { total_work++; __asm__ volatile(""); }
struct TL { ~TL() { for (int i = 0; i < 5; i++) work(1); from_tls++; } };
thread_local TL tl;
struct Static { ~Static() { work(3); fprintf(stderr, "static dtor: total_work=%ld\n", total_work.load()); } } st;
static void at_exit() { work(2); }
static void cleanup(void *) { work(4); from_cleanup++; }
static void *pthr(void *) { pthread_cleanup_push(cleanup, 0); work(0); pthread_exit(0); pthread_cleanup_pop(0); return 0; }
int main() {
    atexit(at_exit);
    std::vector<std::thread> v;
    for (int i = 0; i < 8; i++) v.emplace_back([] { (void)&tl; work(0); });
    for (auto &t : v) t.join();
    for (int i = 0; i < 8; i++) { pthread_t t; pthread_create(&t, 0, pthr, 0); pthread_join(t, 0); }
    printf("from_tls=%ld from_cleanup=%ld work_so_far=%ld (+1 atexit +1 static dtor at exit)\n", from_tls.load(), from_cleanup.load(), total_work.load());
    return 0;
}
