/*
 * orchard-init: pid 1 of every Orchard sandbox.
 *
 * It accepts connections on an already-listening Unix socket (--listen-fd N)
 * and, per connection, forks a shim that starts one command and supervises it.
 * The wire protocol is described in docs/architecture.md ("The orchard-init
 * protocol"). Everything here is written so that a malformed or hostile
 * request can only end its own connection: init parses a request itself only
 * when no shim can be forked (a full pids limit), and then acts on nothing but
 * a kill-all; every length is bounded, and init ignores the signals a sandbox
 * could send it.
 *
 * Build: gcc -static -O2 -Wall -Wextra -Werror -o orchard-init orchard_init.c
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <termios.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#define MAGIC 0x4F524331u /* "ORC1" */

#define FLAG_STDIN 1u
#define FLAG_SESSION_FDS 2u
#define FLAG_NEW_SESSION 4u
#define FLAG_INLINE_OUTPUT 8u
/* Not a command: kill every process of the sandbox but pid 1 (argv: "kill-all",
 * signal, a pid to keep or 0); answered 'A' + u32 count. */
#define FLAG_KILL_ALL 16u
/* A terminal: the shim allocates a pseudo-terminal in the sandbox, the command
 * gets its slave as fds 0..2 and controlling terminal (a new session), and the
 * 'S' answer carries one fd, the master. Two u16 (rows, cols) follow the header. */
#define FLAG_PTY 32u
#define FLAG_KNOWN \
    (FLAG_STDIN | FLAG_SESSION_FDS | FLAG_NEW_SESSION | FLAG_INLINE_OUTPUT | FLAG_KILL_ALL | \
     FLAG_PTY)

#define STAGE_CHDIR 1u
#define STAGE_CREDENTIALS 2u
#define STAGE_EXEC 3u
#define STAGE_OTHER 4u
#define STAGE_PTY 5u /* no terminal could be allocated (no /dev/ptmx?) */

/* Bounds on a request: the kernel's own exec limits are below these (at most
   6 MiB of argv + env strings and pointers; the executor checks that rule). */
#define MAX_REQUEST_BYTES (8u << 20)
#define MAX_STRINGS (1u << 20)
/* How long a shim waits for its request before giving up on the client. */
#define REQUEST_WAIT_MS 10000
/* First fd number used for the shim's own fds, above the command's 0..4. */
#define HIGH_FD 10

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

extern char **environ;

/* The only signals init (and so a shim) changes from the default: ignored. */
static const int IGNORED_SIGNALS[] = {SIGTERM, SIGINT, SIGHUP, SIGPIPE, SIGQUIT, SIGUSR1, SIGUSR2};

struct request {
    uint32_t flags;
    uint32_t uid;
    uint32_t gid;
    uint32_t timeout_ms;
    uint16_t pty_rows, pty_cols; /* FLAG_PTY only */
    char *cwd;
    char **argv; /* NULL-terminated */
    char **envp; /* NULL-terminated */
};

/* ---------------------------------------------------------------- helpers */

static uint64_t monotonic_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint32_t get_u32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void put_u32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

static void put_u64(unsigned char *p, uint64_t v) {
    put_u32(p, (uint32_t)v);
    put_u32(p + 4, (uint32_t)(v >> 32));
}

static int write_all(int fd, const void *buf, size_t len) {
    const char *p = buf;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* Read exactly len bytes from a socket, waiting at most until deadline_ns
 * (monotonic). Data that has already arrived (the usual case: the client
 * sends its whole request at once) is taken without a poll. */
static int read_exact(int fd, void *buf, size_t len, uint64_t deadline_ns) {
    char *p = buf;
    while (len > 0) {
        ssize_t got = recv(fd, p, len, MSG_DONTWAIT);
        if (got > 0) {
            p += got;
            len -= (size_t)got;
            continue;
        }
        if (got == 0 || (errno != EAGAIN && errno != EINTR))
            return -1;
        uint64_t now = monotonic_ns();
        if (now >= deadline_ns)
            return -1;
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int wait_ms = (int)((deadline_ns - now) / 1000000u) + 1;
        int r = poll(&pfd, 1, wait_ms);
        if (r == 0 || (r < 0 && errno != EINTR))
            return -1;
    }
    return 0;
}

/* Move fd to a number >= HIGH_FD, close-on-exec; returns the new fd or -1. */
static int lift_fd(int fd) {
    if (fd >= HIGH_FD)
        return fd;
    int high = fcntl(fd, F_DUPFD_CLOEXEC, HIGH_FD);
    close(fd);
    return high;
}

static int make_pipe(int fds[2]) {
    if (pipe2(fds, O_CLOEXEC) < 0)
        return -1;
    fds[0] = lift_fd(fds[0]);
    fds[1] = lift_fd(fds[1]);
    return (fds[0] < 0 || fds[1] < 0) ? -1 : 0;
}

/* A session's status (fd 3) and control (fd 4) channels are socket pairs, not
 * pipes: a pipe can be opened again through /proc/<pid>/fd/N by any process
 * of the same uid (a command's child could write a forged exit status into the
 * shell's status pipe); open() of a socket there fails with ENXIO. */
static int make_channel(int fds[2]) {
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) < 0)
        return -1;
    fds[0] = lift_fd(fds[0]);
    fds[1] = lift_fd(fds[1]);
    return (fds[0] < 0 || fds[1] < 0) ? -1 : 0;
}

static void close_fd(int *fd) {
    if (*fd >= 0) {
        close(*fd);
        *fd = -1;
    }
}

/* ------------------------------------------------------- request parsing */

/* FLAG_PTY: the terminal's size follows the header; a terminal is a command of
 * its own kind (no stdin pipe, no session fds, no inline output). */
static int parse_pty_size(const unsigned char *buf, size_t len, struct request *req) {
    if (len < 32 || (req->flags & (FLAG_STDIN | FLAG_SESSION_FDS | FLAG_INLINE_OUTPUT)))
        return -1;
    req->pty_rows = (uint16_t)(buf[28] | buf[29] << 8);
    req->pty_cols = (uint16_t)(buf[30] | buf[31] << 8);
    return 0;
}

/*
 * Parse the request body. Strings point into buf (which must outlive the
 * request). Returns 0 on success, -1 if anything is malformed.
 */
static int parse_request(unsigned char *buf, size_t len, struct request *req) {
    if (len < 28)
        return -1;
    if (get_u32(buf) != MAGIC)
        return -1;
    req->flags = get_u32(buf + 4);
    req->uid = get_u32(buf + 8);
    req->gid = get_u32(buf + 12);
    req->timeout_ms = get_u32(buf + 16);
    uint32_t argc = get_u32(buf + 20);
    uint32_t envc = get_u32(buf + 24);
    if (req->flags & ~FLAG_KNOWN)
        return -1;
    /* Inline output is for commands without stdin or session fds. */
    if ((req->flags & FLAG_INLINE_OUTPUT) && (req->flags & (FLAG_STDIN | FLAG_SESSION_FDS)))
        return -1;
    if (argc < 1 || argc > MAX_STRINGS || envc > MAX_STRINGS)
        return -1;
    /* A kill-all is exactly: that flag alone, argv "kill-all" signal keep-pid. */
    if ((req->flags & FLAG_KILL_ALL) && (req->flags != FLAG_KILL_ALL || argc != 3 || envc != 0))
        return -1;
    /* uid/gid -1 would mean "unchanged" to setresuid: refuse it. */
    if (req->uid == UINT32_MAX || req->gid == UINT32_MAX)
        return -1;
    req->argv = calloc((size_t)argc + 1, sizeof(char *));
    req->envp = calloc((size_t)envc + 1, sizeof(char *));
    if (req->argv == NULL || req->envp == NULL)
        return -1;
    size_t pos = 28;
    if (req->flags & FLAG_PTY) {
        if (parse_pty_size(buf, len, req) < 0)
            return -1;
        pos = 32;
    }
    size_t total = 1 + (size_t)argc + (size_t)envc;
    for (size_t i = 0; i < total; i++) {
        if (pos >= len)
            return -1;
        char *s = (char *)buf + pos;
        char *nul = memchr(s, '\0', len - pos);
        if (nul == NULL)
            return -1;
        pos = (size_t)(nul - (char *)buf) + 1;
        if (i == 0)
            req->cwd = s;
        else if (i <= argc)
            req->argv[i - 1] = s;
        else
            req->envp[i - 1 - argc] = s;
    }
    if (pos != len)
        return -1;
    if (req->argv[0][0] == '\0' || req->cwd[0] == '\0')
        return -1;
    return 0;
}

/* ----------------------------------------------------------- tree killing */

struct proc_entry {
    pid_t pid;
    pid_t ppid;
    char state;
};

/* The parent pid and state letter from /proc/<pid>/stat; -1 if gone. */
static pid_t read_ppid(pid_t pid, char *state_out) {
    char path[64];
    char buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    /* "pid (comm) state ppid ...": comm may hold anything, so use the last ')'. */
    char *close_paren = strrchr(buf, ')');
    if (close_paren == NULL || close_paren[1] == '\0')
        return -1;
    char state;
    int ppid;
    if (sscanf(close_paren + 1, " %c %d", &state, &ppid) != 2)
        return -1;
    *state_out = state;
    return (pid_t)ppid;
}

/*
 * SIGKILL every live (not zombie) descendant of `root` found in /proc.
 * Returns how many were signalled. Since the shim is a child subreaper, descendants whose
 * parents die are re-parented to it, so repeated calls converge.
 */
static int kill_descendants_once(pid_t root) {
    DIR *dir = opendir("/proc");
    if (dir == NULL)
        return 0;
    size_t cap = 256, count = 0;
    struct proc_entry *procs = malloc(cap * sizeof *procs);
    if (procs == NULL) {
        closedir(dir);
        return 0;
    }
    struct dirent *de;
    while ((de = readdir(dir)) != NULL) {
        char *end;
        long pid = strtol(de->d_name, &end, 10);
        if (*end != '\0' || pid <= 0 || pid > INT_MAX)
            continue;
        char state = '?';
        pid_t ppid = read_ppid((pid_t)pid, &state);
        if (ppid < 0)
            continue;
        if (count == cap) {
            struct proc_entry *bigger = realloc(procs, cap * 2 * sizeof *procs);
            if (bigger == NULL)
                break;
            procs = bigger;
            cap *= 2;
        }
        procs[count].pid = (pid_t)pid;
        procs[count].ppid = ppid;
        procs[count].state = state;
        count++;
    }
    closedir(dir);

    /* Mark descendants: a pid is in the tree if its parent is root or marked. */
    unsigned char *in_tree = calloc(count ? count : 1, 1);
    int killed = 0;
    if (in_tree != NULL) {
        int changed = 1;
        while (changed) {
            changed = 0;
            for (size_t i = 0; i < count; i++) {
                if (in_tree[i])
                    continue;
                int hit = procs[i].ppid == root;
                for (size_t j = 0; !hit && j < count; j++)
                    hit = in_tree[j] && procs[j].pid == procs[i].ppid;
                if (hit) {
                    in_tree[i] = 1;
                    changed = 1;
                }
            }
        }
        for (size_t i = 0; i < count; i++) {
            if (in_tree[i] && procs[i].state != 'Z' && kill(procs[i].pid, SIGKILL) == 0)
                killed++;
        }
        free(in_tree);
    }
    free(procs);
    return killed;
}

/* Reap every child that has exited, noting the command's status. */
static void reap_children(pid_t command_pid, pid_t *exited_pid, int *exited_status) {
    for (;;) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid <= 0)
            return;
        if (pid == command_pid && *exited_pid == 0) {
            *exited_pid = pid;
            *exited_status = status;
        }
    }
}

/*
 * Kill the command's whole tree: its process group first (cheap, catches
 * nearly everything), then every descendant in /proc, round after round,
 * until the shim has no child left. Reaps as it goes.
 */
static void kill_tree(pid_t command_pid, pid_t *exited_pid, int *exited_status) {
    pid_t self = getpid();
    kill(-command_pid, SIGKILL);
    for (int round = 0; round < 2000; round++) {
        /* Reaping dead children re-parents their own children to us. */
        reap_children(command_pid, exited_pid, exited_status);
        int live = kill_descendants_once(self);
        if (live == 0) {
            siginfo_t info;
            memset(&info, 0, sizeof info);
            if (waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) < 0 && errno == ECHILD)
                return;
        }
        /* Killed processes take a moment to exit. */
        struct timespec ts = {0, live ? 200000 : 1000000};
        nanosleep(&ts, NULL);
    }
}

/* --------------------------------------------------------------- kill-all */

/* init's own pid, set first thing in main() and inherited by every shim: 1
 * when init is the sandbox's pid 1, something else only when it runs on a
 * host (tests), where "every process" must mean init's descendants. */
static pid_t init_pid;

/* Is `pid` a descendant of `root` (by the ppid links in procs)? */
static int descends_from(const struct proc_entry *procs, size_t count, pid_t pid, pid_t root) {
    for (int depth = 0; depth < 4096 && pid > 1; depth++) {
        pid_t parent = -1;
        for (size_t i = 0; i < count; i++) {
            if (procs[i].pid == pid) {
                parent = procs[i].ppid;
                break;
            }
        }
        if (parent == root)
            return 1;
        if (parent <= 0)
            return 0;
        pid = parent;
    }
    return 0;
}

/* Every process in /proc (pid, ppid, state); the count, or 0 with *out NULL. */
static size_t read_procs(struct proc_entry **out) {
    *out = NULL;
    DIR *dir = opendir("/proc");
    if (dir == NULL)
        return 0;
    size_t cap = 256, count = 0;
    struct proc_entry *procs = malloc(cap * sizeof *procs);
    struct dirent *de;
    while (procs != NULL && (de = readdir(dir)) != NULL) {
        char *end;
        long pid = strtol(de->d_name, &end, 10);
        if (*end != '\0' || pid <= 0 || pid > INT_MAX)
            continue;
        char state = '?';
        pid_t ppid = read_ppid((pid_t)pid, &state);
        if (ppid < 0)
            continue;
        if (count == cap) {
            struct proc_entry *bigger = realloc(procs, cap * 2 * sizeof *procs);
            if (bigger == NULL)
                break;
            procs = bigger;
            cap *= 2;
        }
        procs[count++] = (struct proc_entry){(pid_t)pid, ppid, state};
    }
    closedir(dir);
    *out = procs;
    return procs ? count : 0;
}

/*
 * Signal every live process of the sandbox except pid 1 (init), the caller,
 * and `keep` (the injected executor, which lives in the sandbox) with its
 * descendants. Returns how many processes were signalled.
 *
 * When init is pid 1 (the sandbox's own pid namespace) and no pid is kept, one
 * kill(-1, sig) does it: the kernel spares init and the caller, and a fork
 * racing with it gets the signal too. Otherwise (a kept executor, or init
 * running on a host in tests, where -1 would mean the whole machine) the
 * processes are found in /proc, below init only, round after round for
 * SIGKILL until a round finds nothing but init's fresh spare shims.
 * For SIGKILL, waits (bounded) until the signalled processes are gone.
 */
static uint32_t kill_all(pid_t keep, int sig) {
    pid_t self = getpid();
    pid_t root = init_pid;
    if (root <= 0 || (self != root && getppid() != root))
        return 0; /* init is gone: nothing here is ours to judge */
    int whole_ns = root == 1;
    int one_signal = whole_ns && keep <= 0;
    size_t cap = 256, nvictims = 0;
    pid_t *victims = malloc(cap * sizeof *victims);
    int quiet_rounds = 0;
    for (int round = 0; victims != NULL && round < 200 && quiet_rounds < 3; round++) {
        struct proc_entry *procs;
        size_t count = read_procs(&procs);
        int found = 0;
        for (size_t i = 0; i < count; i++) {
            pid_t pid = procs[i].pid;
            if (pid == 1 || pid == self || pid == root || procs[i].state == 'Z')
                continue;
            if (keep > 0 && (pid == keep || descends_from(procs, count, pid, keep)))
                continue;
            if (!whole_ns && !descends_from(procs, count, pid, root))
                continue;
            /* After the first round, a new child of init is its re-forked
             * spare: signal it (harmless) but do not count it or go on for it. */
            int spare = round > 0 && procs[i].ppid == root;
            if (!one_signal && kill(pid, sig) != 0)
                continue;
            if (spare)
                continue;
            found = 1;
            if (nvictims == cap) {
                pid_t *bigger = realloc(victims, cap * 2 * sizeof *victims);
                if (bigger == NULL)
                    continue;
                victims = bigger;
                cap *= 2;
            }
            victims[nvictims++] = pid;
        }
        free(procs);
        if (one_signal) {
            kill(-1, sig); /* atomic for the namespace; the scan above only counted */
            break;
        }
        if (sig != SIGKILL)
            break;
        quiet_rounds = found ? 0 : quiet_rounds + 1;
        struct timespec ts = {0, 500000};
        nanosleep(&ts, NULL);
    }
    /* Wait (at most ~2 s) until every signalled process is gone and reaped,
     * so its pid is free again when the caller gets the answer: a zombie still
     * counts in the sandbox's pids cgroup until init (its parent by now)
     * reaps it. */
    for (int wait = 0; victims != NULL && sig == SIGKILL && wait < 2000; wait++) {
        if (self == 1)
            while (waitpid(-1, NULL, WNOHANG) > 0) {
            }
        int live = 0;
        for (size_t i = 0; i < nvictims && !live; i++) {
            char state = '?';
            live = read_ppid(victims[i], &state) >= 0;
        }
        if (!live)
            break;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    free(victims);
    return (uint32_t)nvictims;
}

static void send_error(int conn, int err, uint32_t stage);

/* Act on a parsed kill-all request and answer 'A' + u32 count. */
static void serve_kill_all(int conn, const struct request *req) {
    unsigned char msg[5] = {'A', 0, 0, 0, 0};
    char *end;
    long sig = req->argv[1] ? strtol(req->argv[1], &end, 10) : -1;
    if (req->argv[1] == NULL || *end != '\0' || sig < 1 || sig > 64 || req->argv[2] == NULL) {
        msg[0] = 'E';
    } else {
        long keep = strtol(req->argv[2], &end, 10);
        if (*end != '\0' || keep < 0 || keep > INT_MAX)
            msg[0] = 'E';
        else
            put_u32(msg + 1, kill_all((pid_t)keep, (int)sig));
    }
    if (msg[0] == 'E') {
        send_error(conn, EINVAL, STAGE_OTHER);
        return;
    }
    (void)write_all(conn, msg, sizeof msg);
}

/* ------------------------------------------------------------- the child */

static void child_fail(int err_fd, int err, uint32_t stage) {
    unsigned char msg[8];
    put_u32(msg, (uint32_t)err);
    put_u32(msg + 4, stage);
    (void)!write(err_fd, msg, sizeof msg);
    _exit(127);
}

/*
 * In the forked command: wire fds 0..4, drop privileges, chdir, exec.
 * Never returns.
 */
static void run_command(const struct request *req, int stdin_fd, int stdout_fd, int stderr_fd,
                        int fd3, int fd4, int err_fd) {
    if (req->flags & (FLAG_NEW_SESSION | FLAG_PTY)) {
        if (setsid() < 0)
            child_fail(err_fd, errno, STAGE_OTHER);
    } else if (setpgid(0, 0) < 0) {
        child_fail(err_fd, errno, STAGE_OTHER);
    }

    /* Signals: default dispositions, nothing blocked. execve resets handlers
     * but keeps SIG_IGN, and init installs no handler: it only ignores the
     * signals in IGNORED_SIGNALS, so resetting those is enough (one syscall
     * each instead of one per signal number, in a child the shim waits for). */
    sigset_t empty;
    sigemptyset(&empty);
    sigprocmask(SIG_SETMASK, &empty, NULL);
    for (size_t i = 0; i < sizeof IGNORED_SIGNALS / sizeof IGNORED_SIGNALS[0]; i++)
        signal(IGNORED_SIGNALS[i], SIG_DFL);

    /* All sources are >= HIGH_FD, so dup2 always makes a fresh, inheritable fd. */
    if (dup2(stdin_fd, 0) < 0 || dup2(stdout_fd, 1) < 0 || dup2(stderr_fd, 2) < 0)
        child_fail(err_fd, errno, STAGE_OTHER);
    if (req->flags & FLAG_SESSION_FDS) {
        if (dup2(fd3, 3) < 0 || dup2(fd4, 4) < 0)
            child_fail(err_fd, errno, STAGE_OTHER);
    }
    if ((req->flags & FLAG_PTY) && ioctl(0, TIOCSCTTY, 0) < 0)
        child_fail(err_fd, errno, STAGE_PTY);
    /* Nothing else may reach the command: everything above is close-on-exec. */
    unsigned int first_private = (req->flags & FLAG_SESSION_FDS) ? 5 : 3;
    if (syscall(SYS_close_range, first_private, ~0u, CLOSE_RANGE_CLOEXEC) < 0) {
        for (int fd = (int)first_private; fd < 1024; fd++) {
            if (fd != err_fd)
                close(fd);
        }
    }

    if (geteuid() == 0) {
        gid_t gid = (gid_t)req->gid;
        if (setgroups(1, &gid) < 0 || setgid(gid) < 0 || setuid((uid_t)req->uid) < 0)
            child_fail(err_fd, errno, STAGE_CREDENTIALS);
    } else if (req->uid != geteuid() || req->gid != getegid()) {
        child_fail(err_fd, EPERM, STAGE_CREDENTIALS);
    }
    /* chdir after dropping privileges, so the user must be allowed in. */
    if (chdir(req->cwd) < 0)
        child_fail(err_fd, errno, STAGE_CHDIR);

    /* execvpe looks PATH up in environ, so make the command's env current. */
    environ = req->envp;
    execvpe(req->argv[0], req->argv, req->envp);
    child_fail(err_fd, errno, STAGE_EXEC);
}

struct command_args {
    const struct request *req;
    int stdin_fd, stdout_fd, stderr_fd, fd3, fd4, err_fd;
};

static int command_entry(void *arg) {
    const struct command_args *a = arg;
    run_command(a->req, a->stdin_fd, a->stdout_fd, a->stderr_fd, a->fd3, a->fd4, a->err_fd);
    return 127;
}

/*
 * Start the command like posix_spawn does: clone(CLONE_VM | CLONE_VFORK) on a
 * private stack, so no page tables are copied and the shim resumes once the
 * child has exec'd (or failed). Falls back to fork() if the stack cannot be
 * mapped. The child touches only its own stack, fds and process attributes.
 */
#define COMMAND_STACK_BYTES (1u << 20)
static pid_t spawn_command(struct command_args *args) {
    void *stack = mmap(NULL, COMMAND_STACK_BYTES, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    if (stack == MAP_FAILED) {
        pid_t pid = fork();
        if (pid == 0)
            command_entry(args);
        return pid;
    }
    pid_t pid = clone(command_entry, (char *)stack + COMMAND_STACK_BYTES,
                      CLONE_VM | CLONE_VFORK | SIGCHLD, args);
    int saved = errno;
    munmap(stack, COMMAND_STACK_BYTES);
    errno = saved;
    return pid;
}

/* ------------------------------------------------------- supervision */

/* What a shim watches while its command runs. */
struct supervision {
    int conn;
    int sfd; /* SIGCHLD signalfd */
    pid_t pid; /* the command */
    uint64_t timeout_at; /* monotonic ns; 0 = none */
    int timed_out;
    int conn_open; /* 0 once the client went away or was confused */
    pid_t exited_pid; /* the command, once reaped */
    int status;
    uint64_t ended_ns; /* monotonic, when the command was seen to have exited */
    unsigned char inbox[64];
    size_t inbox_len;
};

/* Drain the signalfd and reap; note the command's exit. */
static void on_sigchld(struct supervision *sv) {
    struct signalfd_siginfo si;
    while (read(sv->sfd, &si, sizeof si) > 0) {
    }
    reap_children(sv->pid, &sv->exited_pid, &sv->status);
    if (sv->exited_pid && !sv->ended_ns)
        sv->ended_ns = monotonic_ns();
}

/* The timeout, if it has passed: kill the tree. Returns 1 if it fired. */
static int check_timeout(struct supervision *sv) {
    if (sv->timeout_at && monotonic_ns() >= sv->timeout_at) {
        sv->timed_out = 1;
        sv->timeout_at = 0;
        kill_tree(sv->pid, &sv->exited_pid, &sv->status);
        return 1;
    }
    return 0;
}

/* poll()'s wait until the timeout (-1: none). */
static int timeout_wait_ms(const struct supervision *sv) {
    if (!sv->timeout_at)
        return -1;
    uint64_t now = monotonic_ns();
    return now >= sv->timeout_at ? 0 : (int)((sv->timeout_at - now) / 1000000u) + 1;
}

/* The client went away (EOF, error) or sent something that is not K/T. */
static void client_gone(struct supervision *sv) {
    sv->conn_open = 0;
    kill_tree(sv->pid, &sv->exited_pid, &sv->status);
}

/* Read and act on the client's 'K' and 'T' messages. */
static void on_client_readable(struct supervision *sv) {
    ssize_t got = read(sv->conn, sv->inbox + sv->inbox_len, sizeof sv->inbox - sv->inbox_len);
    if (got < 0 && (errno == EINTR || errno == EAGAIN))
        return;
    if (got <= 0) {
        /* Nobody wants this command any more. */
        client_gone(sv);
        return;
    }
    sv->inbox_len += (size_t)got;
    size_t pos = 0;
    while (pos < sv->inbox_len) {
        unsigned char kind = sv->inbox[pos];
        if (kind == 'T') {
            kill_tree(sv->pid, &sv->exited_pid, &sv->status);
            pos += 1;
        } else if (kind == 'K') {
            if (sv->inbox_len - pos < 5)
                break;
            uint32_t sig = get_u32(sv->inbox + pos + 1);
            if (sig >= 1 && sig < (uint32_t)NSIG)
                kill(-sv->pid, (int)sig);
            pos += 5;
        } else {
            client_gone(sv);
            return;
        }
    }
    memmove(sv->inbox, sv->inbox + pos, sv->inbox_len - pos);
    sv->inbox_len -= pos;
}

/* Supervise a command whose pipes the client reads: until it exits. */
static void supervise(struct supervision *sv) {
    sv->conn_open = 1;
    while (sv->exited_pid == 0) {
        struct pollfd pfds[2] = {{.fd = sv->sfd, .events = POLLIN},
                                 {.fd = sv->conn, .events = POLLIN}};
        int r = poll(pfds, sv->conn_open ? 2 : 1, timeout_wait_ms(sv));
        if (r < 0 && errno != EINTR)
            return;
        if (r < 0)
            continue;
        /* Reap: the command, or orphans re-parented to us. */
        on_sigchld(sv);
        if (sv->exited_pid)
            return;
        if (check_timeout(sv))
            continue;
        if (sv->conn_open && (pfds[1].revents & (POLLIN | POLLHUP | POLLERR)))
            on_client_readable(sv);
    }
}

/*
 * Inline output (FLAG_INLINE_OUTPUT): the shim reads the command's stdout and
 * stderr itself and forwards them as 'D' frames on the connection, so the
 * client watches one socket instead of three fds and gets output, exit and
 * EOFs in one wake-up. A frame waits in `frame` until the socket takes it,
 * and the pipes are not read meanwhile: a client that stops reading stops
 * the command's output (as a full pipe would), never the shim's own loop.
 * After the command exits, the pipes are read until EOF for at most
 * DRAIN_GRACE_MS (a background job may hold them open), then closed.
 */
#define DRAIN_GRACE_MS 100
#define FRAME_HEADER 6 /* 'D' + u8 stream + u32 length */
#define FRAME_DATA (64u * 1024u)

static void supervise_inline(struct supervision *sv, int out_fd, int err_fd) {
    static unsigned char frame[FRAME_HEADER + FRAME_DATA];
    size_t frame_len = 0, frame_sent = 0;
    int pipes[2] = {out_fd, err_fd};
    uint64_t drain_until = 0;
    sv->conn_open = 1;
    for (;;) {
        if (sv->exited_pid && drain_until == 0) {
            if (!sv->ended_ns)
                sv->ended_ns = monotonic_ns();
            drain_until = sv->ended_ns + (uint64_t)DRAIN_GRACE_MS * 1000000u;
        }
        int pipes_open = pipes[0] >= 0 || pipes[1] >= 0;
        if (drain_until && (!pipes_open || monotonic_ns() >= drain_until)) {
            close_fd(&pipes[0]);
            close_fd(&pipes[1]);
            pipes_open = 0;
        }
        if (!sv->conn_open) {
            /* Nobody reads any more: drop the output; the tree is dead. */
            close_fd(&pipes[0]);
            close_fd(&pipes[1]);
            frame_len = frame_sent = 0;
            if (sv->exited_pid)
                return;
        }
        if (sv->exited_pid && !pipes_open && frame_sent == frame_len)
            return;

        int wait_ms = timeout_wait_ms(sv);
        if (drain_until) {
            uint64_t now = monotonic_ns();
            int left = now >= drain_until ? 0 : (int)((drain_until - now) / 1000000u) + 1;
            wait_ms = wait_ms < 0 || left < wait_ms ? left : wait_ms;
        }
        short conn_events = POLLIN | (frame_sent < frame_len ? POLLOUT : 0);
        short pipe_events = frame_sent < frame_len ? 0 : POLLIN;
        struct pollfd pfds[4] = {{.fd = sv->sfd, .events = POLLIN},
                                 {.fd = sv->conn_open ? sv->conn : -1, .events = conn_events},
                                 {.fd = pipes[0], .events = pipe_events},
                                 {.fd = pipes[1], .events = pipe_events}};
        int r = poll(pfds, 4, wait_ms);
        if (r < 0 && errno != EINTR)
            return;
        if (r < 0)
            continue;
        if (pfds[0].revents & POLLIN)
            on_sigchld(sv); /* the command, or orphans re-parented to us */
        if (sv->exited_pid == 0 && check_timeout(sv))
            continue;
        if (sv->conn_open && (pfds[1].revents & POLLIN))
            on_client_readable(sv);
        else if (sv->conn_open && (pfds[1].revents & (POLLHUP | POLLERR)) && frame_sent < frame_len)
            client_gone(sv);
        if (!sv->conn_open)
            continue;
        if (frame_sent < frame_len) {
            ssize_t n = send(sv->conn, frame + frame_sent, frame_len - frame_sent,
                             MSG_DONTWAIT | MSG_NOSIGNAL);
            if (n > 0)
                frame_sent += (size_t)n;
            else if (n < 0 && errno != EAGAIN && errno != EINTR)
                client_gone(sv);
            if (frame_sent < frame_len)
                continue;
            frame_len = frame_sent = 0;
        }
        for (int i = 0; i < 2 && frame_len == 0; i++) {
            if (pipes[i] < 0 || !(pfds[2 + i].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            ssize_t n = read(pipes[i], frame + FRAME_HEADER, FRAME_DATA);
            if (n < 0 && (errno == EINTR || errno == EAGAIN))
                continue;
            if (n <= 0) {
                close_fd(&pipes[i]);
                continue;
            }
            frame[0] = 'D';
            frame[1] = (unsigned char)(i + 1);
            put_u32(frame + 2, (uint32_t)n);
            frame_len = FRAME_HEADER + (size_t)n;
            ssize_t sent = send(sv->conn, frame, frame_len, MSG_DONTWAIT | MSG_NOSIGNAL);
            if (sent > 0)
                frame_sent = (size_t)sent;
            else if (sent < 0 && errno != EAGAIN && errno != EINTR)
                client_gone(sv);
            if (frame_sent == frame_len)
                frame_len = frame_sent = 0;
        }
    }
}

/* -------------------------------------------------------------- the shim */

static int send_started(int conn, pid_t pid, const int *fds, int nfds) {
    unsigned char msg[5];
    msg[0] = 'S';
    put_u32(msg + 1, (uint32_t)pid);
    struct iovec iov = {.iov_base = msg, .iov_len = sizeof msg};
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(5 * sizeof(int))];
    } control;
    memset(&control, 0, sizeof control);
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    mh.msg_control = control.buf;
    mh.msg_controllen = CMSG_SPACE((size_t)nfds * sizeof(int));
    struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN((size_t)nfds * sizeof(int));
    memcpy(CMSG_DATA(cm), fds, (size_t)nfds * sizeof(int));
    for (;;) {
        ssize_t n = sendmsg(conn, &mh, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        return n == (ssize_t)sizeof msg ? 0 : -1;
    }
}

static void send_error(int conn, int err, uint32_t stage) {
    unsigned char msg[9];
    msg[0] = 'E';
    put_u32(msg + 1, (uint32_t)err);
    put_u32(msg + 5, stage);
    (void)write_all(conn, msg, sizeof msg);
}

static void send_exit(int conn, int status, int timed_out, uint64_t duration_ns) {
    unsigned char msg[18];
    int32_t code = -1, sig = 0;
    if (WIFEXITED(status)) {
        code = WEXITSTATUS(status);
    } else if (WIFSIGNALED(status)) {
        sig = WTERMSIG(status);
    }
    msg[0] = 'X';
    put_u32(msg + 1, (uint32_t)code);
    put_u32(msg + 5, (uint32_t)sig);
    msg[9] = timed_out ? 1 : 0;
    put_u64(msg + 10, duration_ns);
    (void)write_all(conn, msg, sizeof msg);
}

/*
 * FLAG_PTY: a pseudo-terminal of the sandbox's own devpts (the shim runs in its
 * mount namespace). The slave, owned by the command's user, replaces the
 * command's stdin/stdout/stderr pipes (which are closed here); the master is
 * what the client gets. The size is set before the command starts, so its
 * first TIOCGWINSZ already sees it. Returns -1 with errno set on failure.
 */
static int open_pty(const struct request *req, int *master, int in_pipe[2], int out_pipe[2],
                    int err_pipe[2]) {
    int m = open("/dev/ptmx", O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (m < 0)
        m = open("/dev/pts/ptmx", O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (m < 0)
        return -1;
    m = lift_fd(m);
    int unlock = 0;
    if (m < 0 || ioctl(m, TIOCSPTLCK, &unlock) < 0)
        return -1;
    int s = ioctl(m, TIOCGPTPEER, O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (s < 0) {
        unsigned int n;
        char path[64];
        if (ioctl(m, TIOCGPTN, &n) < 0)
            return -1;
        snprintf(path, sizeof path, "/dev/pts/%u", n);
        s = open(path, O_RDWR | O_NOCTTY | O_CLOEXEC);
        if (s < 0)
            return -1;
    }
    s = lift_fd(s);
    if (s < 0)
        return -1;
    /* Best effort: a terminal owned by the user, as login programs leave it. */
    (void)!fchown(s, (uid_t)req->uid, (gid_t)req->gid);
    struct winsize ws = {.ws_row = req->pty_rows ? req->pty_rows : 24,
                         .ws_col = req->pty_cols ? req->pty_cols : 80};
    if (ioctl(m, TIOCSWINSZ, &ws) < 0)
        return -1;
    close_fd(&in_pipe[0]);
    close_fd(&in_pipe[1]);
    close_fd(&out_pipe[0]);
    close_fd(&out_pipe[1]);
    close_fd(&err_pipe[0]);
    close_fd(&err_pipe[1]);
    /* The child dup2s each of these onto 0..2; the parent closes them after the spawn. */
    in_pipe[0] = s;
    out_pipe[1] = fcntl(s, F_DUPFD_CLOEXEC, HIGH_FD);
    err_pipe[1] = fcntl(s, F_DUPFD_CLOEXEC, HIGH_FD);
    if (out_pipe[1] < 0 || err_pipe[1] < 0)
        return -1;
    *master = m;
    return 0;
}

/* Supervise one connection. Never returns. */
static void run_shim(int conn) {
    prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    conn = lift_fd(conn);
    if (conn < 0)
        _exit(1);

    uint64_t deadline = monotonic_ns() + (uint64_t)REQUEST_WAIT_MS * 1000000u;
    unsigned char header[4];
    if (read_exact(conn, header, 4, deadline) < 0)
        _exit(1);
    uint32_t len = get_u32(header);
    if (len > MAX_REQUEST_BYTES)
        _exit(1);
    unsigned char *buf = malloc((size_t)len + 1);
    if (buf == NULL || read_exact(conn, buf, len, deadline) < 0)
        _exit(1);
    buf[len] = '\0';
    struct request req;
    memset(&req, 0, sizeof req);
    if (parse_request(buf, len, &req) < 0)
        _exit(1);
    if (req.flags & FLAG_KILL_ALL) {
        serve_kill_all(conn, &req);
        _exit(0);
    }

    /* SIGCHLD through a signalfd, so poll() sees exits without races. */
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    sigprocmask(SIG_BLOCK, &chld, NULL);
    int sfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sfd < 0) {
        send_error(conn, errno, STAGE_OTHER);
        _exit(1);
    }
    sfd = lift_fd(sfd);

    int in_pipe[2] = {-1, -1}, out_pipe[2] = {-1, -1}, err_pipe[2] = {-1, -1};
    int fd3_pipe[2] = {-1, -1}, fd4_pipe[2] = {-1, -1}, exec_pipe[2] = {-1, -1};
    int ok = make_pipe(out_pipe) == 0 && make_pipe(err_pipe) == 0 && make_pipe(exec_pipe) == 0;
    if (ok && (req.flags & FLAG_STDIN)) {
        ok = make_pipe(in_pipe) == 0;
    } else if (ok) {
        in_pipe[0] = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (in_pipe[0] < 0) {
            /* No /dev/null in this rootfs: an already-closed pipe reads as empty. */
            ok = make_pipe(in_pipe) == 0;
            close_fd(&in_pipe[1]);
        } else {
            in_pipe[0] = lift_fd(in_pipe[0]);
            ok = in_pipe[0] >= 0;
        }
    }
    if (ok && (req.flags & FLAG_SESSION_FDS))
        ok = make_channel(fd3_pipe) == 0 && make_channel(fd4_pipe) == 0;
    int pty_master = -1;
    if (ok && (req.flags & FLAG_PTY)) {
        if (open_pty(&req, &pty_master, in_pipe, out_pipe, err_pipe) < 0) {
            send_error(conn, errno, STAGE_PTY);
            _exit(1);
        }
    }
    if (!ok) {
        send_error(conn, errno, STAGE_OTHER);
        _exit(1);
    }

    uint64_t started = monotonic_ns();
    struct command_args args = {&req, in_pipe[0], out_pipe[1], err_pipe[1],
                                fd3_pipe[1], fd4_pipe[0], exec_pipe[1]};
    pid_t pid = spawn_command(&args);
    if (pid < 0) {
        send_error(conn, errno, STAGE_OTHER);
        _exit(1);
    }

    /* The parent keeps only the ends it hands to the client. */
    close_fd(&in_pipe[0]);
    close_fd(&out_pipe[1]);
    close_fd(&err_pipe[1]);
    close_fd(&fd3_pipe[1]);
    close_fd(&fd4_pipe[0]);
    close_fd(&exec_pipe[1]);

    unsigned char failure[8];
    ssize_t n;
    do {
        n = read(exec_pipe[0], failure, sizeof failure);
    } while (n < 0 && errno == EINTR);
    close_fd(&exec_pipe[0]);
    if (n == (ssize_t)sizeof failure) {
        int status;
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
        }
        send_error(conn, (int)get_u32(failure), get_u32(failure + 4));
        _exit(0);
    }

    uint64_t timeout_at = req.timeout_ms ? started + (uint64_t)req.timeout_ms * 1000000u : 0;
    struct supervision sv = {.conn = conn, .sfd = sfd, .pid = pid, .timeout_at = timeout_at};
    if (req.flags & FLAG_INLINE_OUTPUT) {
        supervise_inline(&sv, out_pipe[0], err_pipe[0]);
    } else {
        int fds[5], nfds = 0;
        if (req.flags & FLAG_PTY)
            fds[nfds++] = pty_master;
        else if (req.flags & FLAG_STDIN)
            fds[nfds++] = in_pipe[1];
        if (!(req.flags & FLAG_PTY)) {
            fds[nfds++] = out_pipe[0];
            fds[nfds++] = err_pipe[0];
        }
        if (req.flags & FLAG_SESSION_FDS) {
            fds[nfds++] = fd3_pipe[0];
            fds[nfds++] = fd4_pipe[1];
        }
        int client_alive = send_started(conn, pid, fds, nfds) == 0;
        for (int i = 0; i < nfds; i++)
            close(fds[i]);
        if (!client_alive) {
            kill_tree(pid, &(pid_t){0}, &(int){0});
            _exit(0);
        }
        supervise(&sv);
    }
    if (sv.exited_pid == 0) {
        while (waitpid(pid, &sv.status, 0) < 0 && errno == EINTR) {
        }
    }
    send_exit(conn, sv.status, sv.timed_out, (sv.ended_ns ? sv.ended_ns : monotonic_ns()) - started);
    _exit(0);
}

/* ------------------------------------------------------------- the spare */

/*
 * A spare shim is forked before any client connects and waits in accept()
 * itself, so a new connection finds a process ready to run its command and
 * the fork is off the critical path. Once it has accepted (or if it dies), it
 * has closed its end of a pipe; init sees EOF there and forks the next spare.
 * While there is no spare (the fork failed: usually the sandbox's pids limit)
 * init accepts and forks per connection itself, and reports a failed fork.
 */
struct spare {
    pid_t pid; /* 0: none */
    int hup_fd; /* read end; EOF once the spare has taken a connection or died */
};

/* In the spare: wait for one connection, then become its shim. Never returns. */
static void run_spare(int listen_fd, int hup_w, pid_t init_pid) {
    /* On a host (tests), do not outlive init holding its socket. */
    prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    if (getppid() != init_pid)
        _exit(0);
    for (;;) {
        struct pollfd pfd = {.fd = listen_fd, .events = POLLIN};
        if (poll(&pfd, 1, -1) < 0 && errno != EINTR)
            _exit(1);
        int conn = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (conn >= 0) {
            close(listen_fd);
            close(hup_w); /* tells init to fork the next spare */
            prctl(PR_SET_PDEATHSIG, 0, 0, 0, 0);
            run_shim(conn);
        }
        if (errno == EMFILE || errno == ENFILE || errno == ENOMEM || errno == ENOBUFS) {
            struct timespec ts = {0, 10000000};
            nanosleep(&ts, NULL);
        }
    }
}

static void fork_spare(int listen_fd, int init_sfd, struct spare *spare) {
    int hup[2];
    if (pipe2(hup, O_CLOEXEC) < 0)
        return;
    pid_t init_pid = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        close(init_sfd);
        close(hup[0]);
        run_spare(listen_fd, hup[1], init_pid);
    }
    close(hup[1]);
    if (pid < 0) {
        close(hup[0]);
        return;
    }
    spare->pid = pid;
    spare->hup_fd = hup[0];
}

/* Accept every pending connection and fork a shim for each (no spare). */

/* Read one request (length prefix and body, bounded by MAX_REQUEST_BYTES),
 * waiting at most 200 ms: used when no shim could be forked to serve it.
 * A kill-all (small, so it is kept and parsed) is served by init itself:
 * a full pids limit is exactly when it is needed. Returns 1 if it was. */
static int take_request_without_shim(int conn) {
    uint64_t deadline = monotonic_ns() + 200000000u;
    unsigned char prefix[4];
    if (read_exact(conn, prefix, sizeof prefix, deadline) < 0)
        return 0;
    uint32_t left = get_u32(prefix);
    if (left > MAX_REQUEST_BYTES)
        return 0;
    unsigned char small[512];
    uint32_t len = left;
    while (left > 0) {
        unsigned char sink[4096];
        unsigned char *into = len <= sizeof small ? small + (len - left) : sink;
        size_t n = len <= sizeof small ? left : (left < sizeof sink ? left : sizeof sink);
        if (read_exact(conn, into, n, deadline) < 0)
            return 0;
        left -= (uint32_t)n;
    }
    if (len > sizeof small - 1)
        return 0;
    small[len] = '\0';
    struct request req;
    memset(&req, 0, sizeof req);
    int served = 0;
    if (parse_request(small, len, &req) == 0 && (req.flags & FLAG_KILL_ALL)) {
        serve_kill_all(conn, &req);
        served = 1;
    }
    free(req.argv);
    free(req.envp);
    return served;
}

static void accept_and_fork(int listen_fd, int sfd) {
    for (;;) {
        int conn = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (conn < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno == EMFILE || errno == ENFILE || errno == ENOMEM || errno == ENOBUFS) {
                struct timespec ts = {0, 10000000};
                nanosleep(&ts, NULL);
            }
            return;
        }
        pid_t pid = fork();
        if (pid == 0) {
            close(listen_fd);
            close(sfd);
            run_shim(conn);
        }
        if (pid < 0) {
            /* Usually the pids limit. Say so, but only after taking the whole
             * request: answering and closing before the client has written it
             * makes its write fail (EPIPE) and the client would blame the
             * platform instead of the sandbox's own limit. */
            int err = errno;
            if (!take_request_without_shim(conn))
                send_error(conn, err, STAGE_OTHER);
        }
        close(conn);
        /* Reap as we go: under a steady stream of connections this loop
         * may not return to poll() for a while, and every unreaped shim
         * still counts against the sandbox's pids limit. */
        while (waitpid(-1, NULL, WNOHANG) > 0) {
        }
    }
}

/* -------------------------------------------------------------- init main */

static void usage(void) {
    static const char text[] = "usage: orchard-init --listen-fd N\n";
    (void)write_all(2, text, sizeof text - 1);
    _exit(2);
}

int main(int argc, char **argv) {
    int listen_fd = -1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--listen-fd") == 0 && i + 1 < argc) {
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end != '\0' || v < 0 || v > INT_MAX)
                usage();
            listen_fd = (int)v;
        } else {
            usage();
        }
    }
    if (listen_fd < 0 || fcntl(listen_fd, F_GETFD) < 0)
        usage();
    init_pid = getpid();

    /* The control plane that started us runs at a raised CPU priority (orchard up:
     * nice -10), which runc passed down; the sandbox's commands get the ordinary 0.
     * Lowering one's own priority needs no privilege. */
    setpriority(PRIO_PROCESS, 0, 0);

    /* No ptrace, no /proc/1/fd from inside the sandbox. */
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    /* On a host (tests), orphans come to us rather than to the host's init. */
    prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);

    for (size_t i = 0; i < sizeof IGNORED_SIGNALS / sizeof IGNORED_SIGNALS[0]; i++)
        signal(IGNORED_SIGNALS[i], SIG_IGN);

    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    sigprocmask(SIG_BLOCK, &chld, NULL);
    int sfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sfd < 0)
        return 1;
    fcntl(listen_fd, F_SETFD, FD_CLOEXEC);
    int fl = fcntl(listen_fd, F_GETFL);
    fcntl(listen_fd, F_SETFL, fl | O_NONBLOCK);

    struct spare spare = {0, -1};
    for (;;) {
        if (spare.pid == 0)
            fork_spare(listen_fd, sfd, &spare);
        /* With a spare, it alone watches the socket; init waits for it to be taken. */
        struct pollfd pfds[2] = {{.fd = sfd, .events = POLLIN},
                                 {.fd = spare.pid ? spare.hup_fd : listen_fd, .events = POLLIN}};
        if (poll(pfds, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            struct timespec ts = {0, 10000000};
            nanosleep(&ts, NULL);
            continue;
        }
        if (pfds[0].revents & POLLIN) {
            struct signalfd_siginfo si;
            while (read(sfd, &si, sizeof si) > 0) {
            }
            while (waitpid(-1, NULL, WNOHANG) > 0) {
            }
        }
        if (pfds[1].revents & (POLLIN | POLLHUP | POLLERR)) {
            if (spare.pid) {
                close(spare.hup_fd);
                spare.pid = 0;
                spare.hup_fd = -1;
            }
            /* Under load more connections wait behind the one the spare took:
             * serve them in one batch rather than one spare at a time. When
             * there are none this is a single accept() that finds nothing,
             * made while the spare's command runs. */
            accept_and_fork(listen_fd, sfd);
        }
    }
}
