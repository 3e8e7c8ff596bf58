/* The pod sandbox of the test cluster: holds the pod's namespaces, reaps the orphans that
 * land on it, and exits at once on SIGTERM or SIGINT. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_stop(int signal_number) {
    (void)signal_number;
    _exit(0);
}

static void on_child(int signal_number) {
    (void)signal_number;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(void) {
    struct sigaction stop = {0};
    stop.sa_handler = on_stop;
    sigaction(SIGTERM, &stop, NULL);
    sigaction(SIGINT, &stop, NULL);
    struct sigaction child = {0};
    child.sa_handler = on_child;
    child.sa_flags = SA_NOCLDSTOP;
    sigaction(SIGCHLD, &child, NULL);
    for (;;) {
        pause();
    }
}
