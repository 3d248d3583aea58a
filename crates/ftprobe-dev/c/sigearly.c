/* libsigearly.so, linked by sigmasks: its constructor runs before the preloaded agent's (the
 * program's libraries are initialized first) and installs a SIGUSR2 action with every signal
 * in its mask. The handler calls sigearly_hook, which the program sets. */
#include <signal.h>
#include <string.h>

void (*volatile sigearly_hook)(int);

static void on_usr2(int sig)
{
    if (sigearly_hook)
        sigearly_hook(sig);
}

__attribute__((constructor)) static void install(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr2;
    sigfillset(&sa.sa_mask);
    sigaction(SIGUSR2, &sa, 0);
}
