/*
 * orchard-entry: the first process of a sandbox whose executor is injected.
 *
 * It lives in the executor bundle (bin/orchard-entry, static, needs nothing
 * from the image) and does three things, then gets out of the way:
 *
 *   1. finds the init socket: the already-listening fd the runtime handed in
 *      (--init-fd N, the local backend), or binds <run-dir>/init.sock itself
 *      (Kubernetes: nothing outside the pod holds a socket for it);
 *   2. forks the executor: the bundle's own dynamic loader runs the bundle's
 *      python3 with the bundle's libraries (--library-path) and
 *      PYTHONHOME/PYTHONPATH inside the bundle, so nothing of the image (libc,
 *      python, site-packages) is used:
 *        <bundle>/lib/ld-linux-x86-64.so.2 --library-path <bundle>/lib
 *            <bundle>/bin/python3 -B -s -m orchard.executor
 *            --in-sandbox <run-dir> --listen <addr> [extra args]
 *   3. execs <bundle>/bin/orchard-init --listen-fd N, which becomes pid 1
 *      (the executor is its child; init reaps it like any orphan).
 *
 * The bundle folder is found from /proc/self/exe (<bundle>/bin/orchard-entry),
 * so the bundle is relocatable. The run folder is made 0700: init.sock runs
 * commands as any uid, so only root in the sandbox may reach it.
 *
 * Usage: orchard-entry --run-dir DIR --listen ADDR [--init-fd N] [-- ARGS...]
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define MAX_EXTRA 64

static void die(const char *what) {
    fprintf(stderr, "orchard-entry: %s: %s\n", what, strerror(errno));
    exit(127);
}

static void usage(void) {
    fprintf(stderr,
            "usage: orchard-entry --run-dir DIR --listen ADDR [--init-fd N] [-- ARGS...]\n");
    exit(2);
}

static int bind_init_socket(const char *run_dir) {
    struct sockaddr_un addr;
    memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    int n = snprintf(addr.sun_path, sizeof addr.sun_path, "%s/init.sock", run_dir);
    if (n < 0 || (size_t)n >= sizeof addr.sun_path) {
        errno = ENAMETOOLONG;
        die("init socket path");
    }
    int fd = socket(AF_UNIX, SOCK_STREAM, 0); /* inherited by orchard-init: no CLOEXEC */
    if (fd < 0) die("socket");
    unlink(addr.sun_path);
    if (bind(fd, (struct sockaddr *)&addr, sizeof addr) < 0) die("bind init socket");
    if (chmod(addr.sun_path, 0600) < 0) die("chmod init socket");
    if (listen(fd, 128) < 0) die("listen");
    return fd;
}

static void bundle_root(char *out, size_t size) {
    char exe[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len < 0) die("readlink /proc/self/exe");
    exe[len] = '\0';
    char *bin = dirname(exe);   /* <bundle>/bin */
    char *root = dirname(bin);  /* <bundle> */
    if ((size_t)snprintf(out, size, "%s", root) >= size) {
        errno = ENAMETOOLONG;
        die("bundle path");
    }
}

static char *join(const char *a, const char *b) {
    char *s = NULL;
    if (asprintf(&s, "%s%s", a, b) < 0) die("asprintf");
    return s;
}

static void start_executor(const char *bundle, const char *run_dir, const char *listen_addr,
                           char **extra, int n_extra) {
    setsid();
    int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (null_fd >= 0) {
        dup2(null_fd, 0);
    } else {
        close(0);
    }
    char *argv[16 + MAX_EXTRA];
    int i = 0;
    argv[i++] = join(bundle, "/lib/ld-linux-x86-64.so.2");
    argv[i++] = "--library-path";
    argv[i++] = join(bundle, "/lib");
    argv[i++] = join(bundle, "/bin/python3");
    argv[i++] = "-B";
    argv[i++] = "-s";
    argv[i++] = "-m";
    argv[i++] = "orchard.executor";
    argv[i++] = "--in-sandbox";
    argv[i++] = (char *)run_dir;
    argv[i++] = "--listen";
    argv[i++] = (char *)listen_addr;
    for (int k = 0; k < n_extra; k++) argv[i++] = extra[k];
    argv[i] = NULL;
    char *envp[] = {
        join("PYTHONHOME=", bundle),
        join(join("PYTHONPATH=", bundle), "/site"),
        "PYTHONNOUSERSITE=1",
        "PYTHONDONTWRITEBYTECODE=1",
        "PYTHONSAFEPATH=1",
        "PYTHONUTF8=1",
        /* Stay in the C locale: coercing to C.UTF-8 would make glibc open the
         * image's gconv-modules.cache; UTF-8 mode already gives Python UTF-8. */
        "PYTHONCOERCECLOCALE=0",
        "LC_ALL=C",
        "PYTHONUNBUFFERED=1",
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        NULL,
    };
    execve(argv[0], argv, envp);
    die("exec the bundled python");
}

int main(int argc, char **argv) {
    const char *run_dir = NULL;
    const char *listen_addr = NULL;
    int init_fd = -1;
    char **extra = NULL;
    int n_extra = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--run-dir") == 0 && i + 1 < argc) {
            run_dir = argv[++i];
        } else if (strcmp(argv[i], "--listen") == 0 && i + 1 < argc) {
            listen_addr = argv[++i];
        } else if (strcmp(argv[i], "--init-fd") == 0 && i + 1 < argc) {
            char *end = NULL;
            long v = strtol(argv[++i], &end, 10);
            if (end == NULL || *end != '\0' || v < 0 || v > 1024) usage();
            init_fd = (int)v;
        } else if (strcmp(argv[i], "--") == 0) {
            extra = &argv[i + 1];
            n_extra = argc - i - 1;
            break;
        } else {
            usage();
        }
    }
    if (run_dir == NULL || listen_addr == NULL || run_dir[0] != '/' || n_extra > MAX_EXTRA) {
        usage();
    }
    /* The sandbox's executor and commands run at the ordinary CPU priority, not the
     * raised one of the control plane that started this sandbox (orchard up: nice -10). */
    setpriority(PRIO_PROCESS, 0, 0);
    if (chmod(run_dir, 0700) < 0) die("chmod the run folder");
    if (init_fd < 0) init_fd = bind_init_socket(run_dir);
    char bundle[PATH_MAX];
    bundle_root(bundle, sizeof bundle);

    pid_t pid = fork();
    if (pid < 0) die("fork");
    if (pid == 0) {
        close(init_fd);
        start_executor(bundle, run_dir, listen_addr, extra, n_extra);
    }
    char fd_text[16];
    snprintf(fd_text, sizeof fd_text, "%d", init_fd);
    char *init_path = join(bundle, "/bin/orchard-init");
    char *init_argv[] = {init_path, "--listen-fd", fd_text, NULL};
    execv(init_path, init_argv);
    die("exec orchard-init");
    return 127;
}
