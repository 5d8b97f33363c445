/* A stand-in for orchard-init used by the runtime tests until (or when) the real
 * one is not available: it accepts connections on the listening socket it gets
 * as fd 3, answers each with "ok\n", and reaps children as a pid 1 must. */
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

int main(void) {
    signal(SIGCHLD, SIG_IGN); /* auto-reap */
    for (;;) {
        int conn = accept(3, 0, 0);
        if (conn < 0)
            continue;
        (void)!write(conn, "ok\n", 3);
        close(conn);
    }
}
