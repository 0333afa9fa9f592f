/* The per-attempt shim, compiled: the same protocol as shim.py's run_shim (abandoned,
 * pid.json, exit.json and logs in the attempt directory, whose lock is the directory
 * itself here and shim.py's attempt.lock there), at a fraction of a forked Python's cost.
 * `nodus-shim --serve` is the spawner: the daemon writes requests to
 * its stdin (a 4-byte length, then NUL-terminated fields: see compiled_shim.py), and for
 * each it forks a shim and answers {"id": N, "pid": P} on stdout. A shim leads its own
 * session, outlives the spawner and the daemon, and never runs as anyone but root or the
 * daemon's user: the job's child enters the rank's cgroups (the request's), makes its mount
 * namespace (the request's mounts: its workspace at /workspace; shim.py's _Mounts) and drops
 * to the owner before exec; all left in the cgroups is killed at the end, OOM kills
 * recorded. Each log is capped as
 * shim.py's CappedLog does it (its head, a marker, its last bytes at the end), and pid.json
 * and exit.json are written into room reserved before the job runs.
 * A request may be held (armed): its shim is forked and waits, before it touches the
 * attempt directory, for SIGUSR1 (go: it runs the job) or SIGUSR2 (the daemon let it go,
 * or the spawner died: it exits having done nothing), at most its hold's seconds.
 * The spawner's reaper holds each job's mount namespace from before its exec until it
 * exits, and drops it then: see run_reaper().
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <dirent.h>
#include <sched.h>
#include <stdint.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#define MAGIC "NODUS3"
#define DRAIN_AFTER_EXIT_MS 2000 /* keep reading pipes that escaped processes hold open */
#define CHUNK 65536
#define TAIL_MAX (1 << 20) /* most bytes of a capped log's end kept for its close */
#define NOTE_ROOM 512      /* bytes of a capped log left for its two notes */
#define RECORD_ROOM 4096   /* bytes reserved on disk for pid.json and exit.json */
#define RECORD_PAD 512     /* both records padded to this: one sector, rewritten in place */
#define CGROUP_KILL_ROUNDS 500 /* reads of a cgroup's processes, 10 ms apart (shim.py's) */

struct request {
    const char *dir, *cwd, *boot_id;
    int has_uid;
    uid_t uid;
    gid_t gid;
    size_t ngroups;
    gid_t *groups;
    char **argv, **env, **mask, **cgroups; /* cgroups: the rank's, made by the daemon */
    size_t nmask, ncgroups;
    unsigned long long max_log; /* each log's cap; 0: none */
    char **mounts, **hide;      /* mounts: source, target pairs; none: no namespace */
    size_t nmounts, nhide;
    const char *hide_with;
    int no_new_privs;
    long hold; /* seconds an armed shim waits for its go; 0: it runs the job at once */
    const char *mark; /* the go mark the daemon set on dir before letting us go; "": none */
};

struct buffer {
    char *data;
    size_t len, cap;
};

struct stream {
    int fd;
    int targets[2];
    int ntargets;
    struct buffer held; /* an end of output that may be the start of a secret */
};

/* One log file, opened on its first output: see shim.py's CappedLog. */
struct log {
    const char *name;
    int fd;
    unsigned long long size, left_out, lost;
    char last; /* the last byte written: a note starts on a line of its own */
    int cut, why;
    char *tail; /* a ring of the last tail_room bytes left out */
    size_t tail_len, tail_at;
};

static const struct request *req;
#define REAPER_FD 3 /* where a shim keeps its end of the reaper's socket */
static int reaper = -1; /* in a shim and its job's process: that end, or -1 (none) */
static struct log logs[2] = {{"output.log", -1, 0, 0, 0, '\n', 0, 0, NULL, 0, 0},
                             {"stderr.log", -1, 0, 0, 0, '\n', 0, 0, NULL, 0, 0}};
static size_t tail_room;
static unsigned long long head_room;

static void die(void) { _exit(1); }

static void *xrealloc(void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    if (!q) die();
    return q;
}

static void buf_add(struct buffer *b, const char *data, size_t n) {
    if (b->len + n > b->cap) {
        b->cap = (b->len + n) * 2;
        b->data = xrealloc(b->data, b->cap);
    }
    memcpy(b->data + b->len, data, n);
    b->len += n;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static long long monotonic_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void write_all(int fd, const char *data, size_t n) {
    while (n) {
        ssize_t w = write(fd, data, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return; /* a reader that went away: nothing to do about it */
        }
        data += w;
        n -= (size_t)w;
    }
}

static char *path_in(const char *name) {
    size_t n = strlen(req->dir) + strlen(name) + 2;
    char *p = xrealloc(NULL, n);
    snprintf(p, n, "%s/%s", req->dir, name);
    return p;
}

/* --- the logs: capped, and never holding the job up for a full disk ------------------ */

/* Write what the file takes; returns the bytes it did not. */
static size_t raw_write(struct log *l, const char *data, size_t n) {
    while (n) {
        ssize_t w = write(l->fd, data, n);
        if (w <= 0) {
            if (w < 0 && errno == EINTR) continue;
            l->why = w < 0 ? errno : ENOSPC;
            return n;
        }
        l->size += (unsigned long long)w;
        l->last = data[w - 1];
        data += w;
        n -= (size_t)w;
    }
    return 0;
}

static void put(struct log *l, const char *data, size_t n);

static void note(struct log *l, const char *fmt, ...) {
    char line[512];
    int k = snprintf(line, sizeof line, "%s[noduslocal] ", l->last == '\n' ? "" : "\n");
    va_list ap;
    va_start(ap, fmt);
    k += vsnprintf(line + k, sizeof line - (size_t)k - 1, fmt, ap);
    va_end(ap);
    if (k > (int)sizeof line - 2) k = (int)sizeof line - 2;
    line[k++] = '\n';
    put(l, line, (size_t)k);
}

static void put(struct log *l, const char *data, size_t n) {
    if (l->lost) {
        char line[256];
        int k = snprintf(line, sizeof line, "%s[noduslocal] %llu bytes of output were lost "
                         "here (%s)\n", l->last == '\n' ? "" : "\n", l->lost,
                         strerror(l->why));
        if (k > (int)sizeof line - 1) k = (int)sizeof line - 1;
        if (raw_write(l, line, (size_t)k)) {
            l->lost += n;
            return;
        }
        l->lost = 0;
    }
    l->lost += raw_write(l, data, n);
}

static void keep(struct log *l, const char *data, size_t n) {
    l->left_out += n;
    if (!tail_room) return;
    if (!l->tail) l->tail = xrealloc(NULL, tail_room);
    if (n > tail_room) {
        data += n - tail_room;
        n = tail_room;
    }
    while (n) {
        size_t k = tail_room - l->tail_at < n ? tail_room - l->tail_at : n;
        memcpy(l->tail + l->tail_at, data, k);
        l->tail_at = (l->tail_at + k) % tail_room;
        l->tail_len = l->tail_len + k < tail_room ? l->tail_len + k : tail_room;
        data += k;
        n -= k;
    }
}

static void log_write(int which, const char *data, size_t n) {
    struct log *l = &logs[which];
    if (!n) return;
    if (l->fd < 0) {
        char *p = path_in(l->name);
        l->fd = open(p, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
        free(p);
        if (l->fd < 0) return; /* no inode for it: tried again with the next output */
        struct stat st;
        if (fstat(l->fd, &st) == 0) l->size = (unsigned long long)st.st_size;
    }
    if (l->cut) {
        keep(l, data, n);
        return;
    }
    size_t room = n;
    if (req->max_log)
        room = l->size >= head_room ? 0 : head_room - l->size < n ? head_room - l->size : n;
    put(l, data, room);
    if (room < n) {
        note(l, "this log reached max_log_bytes (%llu bytes): what follows is left out, "
             "except its last %zu bytes, added at the end", req->max_log, tail_room);
        l->cut = 1;
        keep(l, data + room, n - room);
    }
}

static void log_close(int which) {
    struct log *l = &logs[which];
    if (l->fd < 0) return;
    if (l->cut) {
        /* The ring in order, from the start of a line when some of it was cut off. */
        char *tail = xrealloc(NULL, l->tail_len + 1);
        size_t start = l->tail_len < tail_room ? 0 : l->tail_at, len = l->tail_len;
        for (size_t i = 0; i < len; i++) tail[i] = l->tail[(start + i) % tail_room];
        char *from = tail;
        if (l->left_out > len) {
            char *nl = memchr(tail, '\n', len);
            if (nl && nl + 1 < tail + len) from = nl + 1;
        }
        len -= (size_t)(from - tail);
        note(l, "%llu bytes were left out here; the last %zu bytes follow",
             l->left_out - len, len);
        put(l, from, len);
        free(tail);
    }
    put(l, "", 0); /* says what went missing at the end, if anything did */
    close(l->fd);
}

/* --- the request ------------------------------------------------------------------ */

static char *input;
static size_t input_len, input_pos;

static const char *field(void) {
    if (input_pos >= input_len) die();
    const char *f = input + input_pos;
    const char *end = memchr(f, 0, input_len - input_pos);
    if (!end) die();
    input_pos += (size_t)(end - f) + 1;
    return f;
}

static long number(void) {
    char *end;
    const char *f = field();
    long v = strtol(f, &end, 10);
    if (*f == 0 || *end != 0) die();
    return v;
}

static char **strings(size_t *count) {
    long n = number();
    if (n < 0) die();
    char **list = xrealloc(NULL, sizeof(char *) * ((size_t)n + 1));
    for (long i = 0; i < n; i++) list[i] = (char *)field();
    list[n] = NULL;
    if (count) *count = (size_t)n;
    return list;
}

static struct request *parse_request(char *data, size_t len) {
    input = data;
    input_len = len;
    input_pos = 0;
    struct request *r = xrealloc(NULL, sizeof *r);
    memset(r, 0, sizeof *r);
    if (strcmp(field(), MAGIC) != 0) die();
    field(); /* the request's id, the spawner's */
    r->dir = field();
    r->cwd = field();
    const char *uid = field();
    r->has_uid = *uid != 0;
    r->uid = (uid_t)strtoul(uid, NULL, 10);
    r->gid = (gid_t)number();
    char **groups = strings(&r->ngroups);
    r->groups = xrealloc(NULL, sizeof(gid_t) * (r->ngroups + 1));
    for (size_t i = 0; i < r->ngroups; i++) r->groups[i] = (gid_t)strtoul(groups[i], NULL, 10);
    r->argv = strings(NULL);
    r->env = strings(NULL);
    r->mask = strings(&r->nmask);
    r->boot_id = field();
    r->max_log = strtoull(field(), NULL, 10);
    r->cgroups = strings(&r->ncgroups);
    r->mounts = strings(&r->nmounts);
    r->hide = strings(&r->nhide);
    r->hide_with = field();
    r->no_new_privs = strcmp(field(), "1") == 0;
    r->hold = number();
    r->mark = field();
    if (!r->argv[0] || r->nmounts % 2 || r->hold < 0) die();
    return r;
}

/* --- the job ----------------------------------------------------------------------- */

static const char *env_path(void) {
    for (char **e = req->env; *e; e++)
        if (strncmp(*e, "PATH=", 5) == 0) return *e + 5;
    return "/bin:/usr/bin";
}

static void child_fail(int code, const char *fmt, ...) {
    char line[4096];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n > (int)sizeof line - 1) n = (int)sizeof line - 1;
    write_all(2, line, (size_t)n);
    _exit(code);
}

/* --- the job's mount namespace (shim.py's _Mounts, step for step) -------------------- */

#define MAX_SHADOWS 16
static char *shadows[MAX_SHADOWS]; /* directories shadowed by a tmpfs of ours */
static int nshadows;

static int mnt(const char *source, const char *target, const char *type, unsigned long flags,
               const char *data) {
    if (mount(source, target, type, flags, data) == 0) return 0;
    child_fail(126, "noduslocal: cannot make the job's mount namespace: mount on %s: %s\n",
               target, strerror(errno));
    return -1;
}

/* A tmpfs at the staging point holding a bind of each entry of `base`, moved over it (over
 * /: by a chroot into it): what is then made in `base` is made in the tmpfs, not the host. */
static void shadow(const char *base) {
    const char *staging = req->dir;
    struct stat st;
    if (stat(base, &st) != 0) child_fail(126, "noduslocal: cannot read %s: %s\n", base,
                                         strerror(errno));
    char data[128];
    snprintf(data, sizeof data, "mode=%o,uid=%u,gid=%u", (unsigned)(st.st_mode & 07777),
             (unsigned)st.st_uid, (unsigned)st.st_gid);
    mnt("tmpfs", staging, "tmpfs", MS_NOSUID | MS_NODEV, data);
    DIR *dir = opendir(base);
    if (!dir) child_fail(126, "noduslocal: cannot list %s: %s\n", base, strerror(errno));
    for (struct dirent *e; (e = readdir(dir));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char from[PATH_MAX], inside[PATH_MAX];
        snprintf(from, sizeof from, "%s/%s", strcmp(base, "/") ? base : "", e->d_name);
        snprintf(inside, sizeof inside, "%s/%s", staging, e->d_name);
        struct stat es;
        if (lstat(from, &es) != 0) continue; /* gone meanwhile */
        if (S_ISLNK(es.st_mode)) {
            char link[PATH_MAX];
            ssize_t n = readlink(from, link, sizeof link - 1);
            if (n >= 0) {
                link[n] = 0;
                if (symlink(link, inside) != 0)
                    child_fail(126, "noduslocal: cannot make %s: %s\n", inside, strerror(errno));
            }
            continue;
        }
        int made = S_ISDIR(es.st_mode) ? mkdir(inside, 0755)
                                       : close(open(inside, O_WRONLY | O_CREAT | O_CLOEXEC, 0600));
        if (made != 0)
            child_fail(126, "noduslocal: cannot make %s: %s\n", inside, strerror(errno));
        mnt(from, inside, NULL, MS_BIND | MS_REC, NULL);
    }
    closedir(dir);
    size_t blen = strcmp(base, "/") ? strlen(base) : 0;
    if (strncmp(staging, base, blen) == 0 && (staging[blen] == '/' || !strcmp(base, "/"))) {
        /* The bind of the entry above the staging point copied the tmpfs itself. */
        char copy[PATH_MAX];
        snprintf(copy, sizeof copy, "%s%s", staging, staging + blen);
        umount2(copy, MNT_DETACH);
    }
    if (!strcmp(base, "/")) {
        if (chdir(staging) != 0) child_fail(126, "noduslocal: chdir: %s\n", strerror(errno));
        mnt(".", "/", NULL, MS_MOVE, NULL);
        if (chroot(".") != 0 || chdir("/") != 0)
            child_fail(126, "noduslocal: chroot: %s\n", strerror(errno));
    } else {
        mnt(staging, base, NULL, MS_MOVE, NULL);
    }
}

/* A mount path is made as root, so only through root's directories: a directory or link
 * another user owns (in /tmp, say) could be swapped meanwhile for a link into /etc. */
static void roots_only(const char *target, const char *probe, const char *resolved) {
    struct stat st;
    char path[PATH_MAX];
    if (lstat(probe, &st) != 0 || st.st_uid != 0)
        child_fail(126, "noduslocal: cannot make the job's mount namespace: the mount path "
                   "%s passes through %s, which is not root's\n", target, probe);
    for (const char *slash = resolved + 1;; slash++) {
        slash = strchr(slash, '/');
        size_t n = slash ? (size_t)(slash - resolved) : strlen(resolved);
        snprintf(path, sizeof path, "%.*s", (int)n, resolved);
        if (lstat(path, &st) != 0 || st.st_uid != 0)
            child_fail(126, "noduslocal: cannot make the job's mount namespace: the mount "
                       "path %s passes through %s, which is not root's\n", target, path);
        if (!slash) break;
    }
}

/* Room for a target missing on the host: its deepest existing directory shadowed (once),
 * then the rest of its path made in the shadow, each part new (one that appeared since is
 * refused, never entered). */
static void make_room(const char *target) {
    char base[PATH_MAX] = "/", probe[PATH_MAX], resolved[PATH_MAX];
    struct stat st;
    const char *p = target;
    while (*p) {
        while (*p == '/') p++;
        if (!*p) break;
        const char *end = strchrnul(p, '/');
        snprintf(probe, sizeof probe, "%s/%.*s", strcmp(base, "/") ? base : "", (int)(end - p), p);
        if (lstat(probe, &st) != 0) break;
        if (!realpath(probe, resolved))
            child_fail(126, "noduslocal: cannot make the job's mount namespace: %s: %s\n",
                       probe, strerror(errno));
        roots_only(target, probe, resolved);
        snprintf(base, sizeof base, "%s", resolved);
        p = end;
    }
    int found = 0;
    for (int i = 0; i < nshadows; i++) found |= !strcmp(shadows[i], base);
    if (!found) {
        if (nshadows == MAX_SHADOWS)
            child_fail(126, "noduslocal: more than %d mount paths missing on the host\n",
                       MAX_SHADOWS);
        shadow(base);
        shadows[nshadows++] = strdup(base);
    }
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s", base);
    while (*p) {
        while (*p == '/') p++;
        if (!*p) break;
        const char *end = strchrnul(p, '/');
        size_t len = strlen(path);
        snprintf(path + len, sizeof path - len, "%s%.*s", strcmp(path, "/") ? "/" : "",
                 (int)(end - p), p);
        if (mkdir(path, 0755) != 0)
            child_fail(126, "noduslocal: cannot make %s: %s\n", path, strerror(errno));
        p = end;
    }
}

static void make_namespace(void) {
    if (unshare(CLONE_NEWNS) != 0)
        child_fail(126, "noduslocal: cannot make the job's mount namespace: unshare: %s\n",
                   strerror(errno));
    mnt(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL);
    for (size_t i = 0; i + 1 < req->nmounts; i += 2) {
        if (access(req->mounts[i + 1], F_OK) != 0) make_room(req->mounts[i + 1]);
        mnt(req->mounts[i], req->mounts[i + 1], NULL, MS_BIND | MS_REC, NULL);
    }
    for (size_t i = 0; i < req->nhide; i++) mnt(req->hide_with, req->hide[i], NULL, MS_BIND, NULL);
    for (int i = 0; i < nshadows; i++)
        mnt(NULL, shadows[i], NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, NULL);
    if (req->no_new_privs && prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
        child_fail(126, "noduslocal: cannot make the job's mount namespace: prctl: %s\n",
                   strerror(errno));
}

/* The job's mount namespace (and a pidfd of the job) to the reaper, which holds it until
 * the job exits: the job's own exit then only drops a reference. Where it cannot (no
 * reaper, a full socket), the job's exit unmounts its namespace as before. */
static void hand_namespace(void) {
    if (reaper < 0) return;
    int fds[2] = {(int)syscall(SYS_pidfd_open, getpid(), 0),
                  open("/proc/self/ns/mnt", O_RDONLY | O_CLOEXEC)};
    if (fds[0] >= 0 && fds[1] >= 0) {
        char byte = 0;
        struct iovec iov = {&byte, 1};
        union {
            struct cmsghdr header;
            char room[CMSG_SPACE(sizeof fds)];
        } control;
        memset(&control, 0, sizeof control);
        struct msghdr msg = {0};
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.room;
        msg.msg_controllen = sizeof control.room;
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof fds);
        memcpy(CMSG_DATA(c), fds, sizeof fds);
        sendmsg(reaper, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    for (int i = 0; i < 2; i++)
        if (fds[i] >= 0) close(fds[i]);
}

/* This process into a cgroup, from the thread that then execs the job (the vfork child's
 * one thread): on v1 it moves itself, "0" in `tasks`. A move through cgroup.procs moves
 * a thread group, which takes the kernel's threadgroup lock for writing, and the first
 * writer after a quiet spell waits for an RCU grace period: 5 to 30 ms on this box, paid
 * by the first task of every sweep. A thread moving itself takes no such lock (6.18 here:
 * 0.1 ms after the same quiet spell). v2 has no `tasks`: our pid in cgroup.procs. */
static int enter_cgroup(const char *dir) {
    char p[PATH_MAX], pid[32];
    const char *value = "0";
    int n = 1;
    snprintf(p, sizeof p, "%s/tasks", dir);
    int fd = open(p, O_WRONLY | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT) {
        snprintf(p, sizeof p, "%s/cgroup.procs", dir);
        n = snprintf(pid, sizeof pid, "%d", (int)getpid());
        value = pid;
        fd = open(p, O_WRONLY | O_CLOEXEC);
    }
    if (fd < 0) return -1;
    int ok = write(fd, value, (size_t)n) == n, saved = errno;
    close(fd);
    errno = saved;
    return ok ? 0 : -1;
}

/* In the job's process (job_main): the owner's identity, the workdir, then exec with PATH
 * searched in the job's own environment, with the owner's rights. */
static void exec_job(int null, int out_w, int err_w) {
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    /* Every other signal is at its default already: serve() set them so once, and the
     * shim changed only these. */
    signal(SIGCHLD, SIG_DFL);
    signal(SIGPIPE, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    setpgid(0, 0);
    if (dup2(null, 0) < 0 || dup2(out_w, 1) < 0 || dup2(err_w, 2) < 0) _exit(126);
    /* Into the rank's cgroups before exec, as root: nothing the job runs starts outside. */
    for (size_t i = 0; i < req->ncgroups; i++)
        if (enter_cgroup(req->cgroups[i]) != 0)
            child_fail(126, "noduslocal: cannot enter cgroup %s: %s\n", req->cgroups[i],
                       strerror(errno));
    if (req->nmounts) {
        make_namespace(); /* as root, before the drop: the workdir is in it */
        hand_namespace();
    }
    if (reaper >= 0) close(reaper);
    if (req->has_uid && req->uid != getuid()) {
        /* The system calls themselves: glibc's wrappers may signal every thread of the
         * process to change theirs too, and ours shares the shim's memory (job_main). */
        if (syscall(SYS_setgroups, req->ngroups, req->groups) ||
            syscall(SYS_setresgid, req->gid, req->gid, req->gid) ||
            syscall(SYS_setresuid, req->uid, req->uid, req->uid))
            child_fail(126, "noduslocal: cannot become uid %u: %s\n", (unsigned)req->uid,
                       strerror(errno));
    }
    if (chdir(req->cwd) != 0)
        child_fail(126, "noduslocal: cannot enter workdir %s: %s\n", req->cwd,
                   strerror(errno));
    const char *name = req->argv[0];
    if (strchr(name, '/')) {
        execve(name, req->argv, req->env);
        child_fail(errno == ENOENT ? 127 : 126, "noduslocal: cannot execute '%s': %s\n",
                   name, strerror(errno));
    }
    const char *path = env_path();
    int denied = 0;
    char candidate[PATH_MAX];
    for (const char *p = path;; p++) {
        const char *end = strchrnul(p, ':');
        size_t dirlen = (size_t)(end - p);
        int n = dirlen ? snprintf(candidate, sizeof candidate, "%.*s/%s", (int)dirlen, p, name)
                       : snprintf(candidate, sizeof candidate, "%s", name);
        if (n > 0 && n < (int)sizeof candidate) {
            execve(candidate, req->argv, req->env);
            if (errno == EACCES) denied = errno;
            else if (errno != ENOENT && errno != ENOTDIR)
                child_fail(126, "noduslocal: cannot execute '%s': %s\n", name,
                           strerror(errno));
        }
        if (!*end) break;
        p = end;
    }
    if (denied)
        child_fail(126, "noduslocal: cannot execute '%s': %s\n", name, strerror(denied));
    child_fail(127, "noduslocal: cannot execute '%s': not found in PATH (%s); give the job "
               "yours with `--export PATH` (the CLI's default) or env PATH=...\n", name, path);
}

static long long start_ticks(pid_t pid) {
    char p[64], data[1024];
    snprintf(p, sizeof p, "/proc/%d/stat", (int)pid);
    int fd = open(p, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = read(fd, data, sizeof data - 1);
    close(fd);
    if (n <= 0) return -1;
    data[n] = 0;
    char *s = strrchr(data, ')');
    if (!s) return -1;
    s += 2; /* fields from the state on: the start time is the 20th of them */
    for (int i = 0; i < 19 && s; i++) {
        s = strchr(s, ' ');
        if (s) s++;
    }
    return s ? atoll(s) : -1;
}

static void fsync_dir(void) {
    int fd = open(req->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
}

static char *tmp_path(const char *name) {
    char tmpname[64];
    snprintf(tmpname, sizeof tmpname, ".%s.tmp", name);
    return path_in(tmpname);
}

/* The temporary file of a record, with RECORD_ROOM bytes allocated now: a job that fills
 * the disk cannot take its exit's room. -1 when it cannot be made or the disk has no room
 * for it (a file system without fallocate: written as it comes). */
static int reserve_record(const char *name) {
    char *tmp = tmp_path(name);
    int fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0) {
        /* Past the end (the size stays 0): the record's write needs no truncate after. */
        int err = fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, RECORD_ROOM) == 0 ? 0 : errno;
        if (err == ENOSPC || err == EDQUOT) {
            close(fd);
            unlink(tmp);
            fd = -1;
        }
    }
    free(tmp);
    return fd;
}

/* Write-then-rename into the reserved file (made now if there is none), for readers that
 * may look at any moment; with `durable`, synced to disk, file and directory entry. */
static void write_record(int fd, const char *name, const char *json, int durable) {
    char *tmp = tmp_path(name), *final = path_in(name);
    if (fd < 0) fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0) {
        size_t n = strlen(json);
        if (pwrite(fd, json, n, 0) == (ssize_t)n) { /* the file was empty: n is its size */
            if (durable) fdatasync(fd);
            close(fd);
            rename(tmp, final);
            if (durable) fsync_dir();
        } else {
            close(fd);
        }
    }
    free(tmp);
    free(final);
}

/* The record's JSON at the start of its reserved file, padded with spaces (JSON's own
 * whitespace) to RECORD_PAD: the exit record then rewrites the pid record in place, in
 * one sector and with no change of size, so a reader or a crash finds one or the other. */
static int put_record(int fd, const char *json) {
    char padded[RECORD_PAD];
    size_t n = strlen(json);
    if (n >= RECORD_PAD) return pwrite(fd, json, n, 0) == (ssize_t)n ? 0 : -1;
    memcpy(padded, json, n);
    memset(padded + n, ' ', RECORD_PAD - n);
    return pwrite(fd, padded, RECORD_PAD, 0) == RECORD_PAD ? 0 : -1;
}

/* --- the rank's cgroups: every process killed at the end, the OOM killer's count ------- */

static int write_file(const char *dir, const char *name, const char *value) {
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    int fd = open(p, O_WRONLY | O_TRUNC | O_CLOEXEC);
    if (fd < 0) return 0;
    int ok = write(fd, value, strlen(value)) == (ssize_t)strlen(value);
    close(fd);
    return ok;
}

/* The whole of a small cgroupfs file, NUL-terminated (empty when it cannot be read, or
 * is gone); `unread` (when given) is set when it exists but could not be read. */
static char *read_file(const char *dir, const char *name, int *unread) {
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    struct buffer b = {0};
    int fd = open(p, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (unread && errno != ENOENT) *unread = 1;
    } else {
        char chunk[4096];
        ssize_t n;
        while ((n = read(fd, chunk, sizeof chunk)) > 0) buf_add(&b, chunk, (size_t)n);
        if (unread && n < 0) *unread = 1;
        close(fd);
    }
    buf_add(&b, "", 1);
    return b.data;
}

/* Whether the rank's cgroups were seen empty after the job's end (kill_cgroups): the exit
 * record says so, and the daemon keeps them for the next rank without reading them again
 * (two opens of cgroup.procs a task on its loop, issue 25 part 5). Never claimed when a
 * read failed (procs_unread): an unread cgroup may hold a process, which the pool would
 * hand to another rank. */
static int cgroups_emptied = 0, procs_unread = 0;

/* A cgroup's processes as cgroup.procs lists them (empty when it is gone); one that
 * could not be read sets procs_unread. */
static char *read_procs(const char *dir) {
    return read_file(dir, "cgroup.procs", &procs_unread);
}

/* SIGKILL every process in the rank's cgroups, what they fork meanwhile too, until they
 * are empty: a job's setsid child dies with it (shim.py's kill_cgroups). */
static int cgroups_empty(void) {
    for (size_t i = 0; i < req->ncgroups; i++) {
        char *procs = read_procs(req->cgroups[i]);
        int some = *procs != 0;
        free(procs);
        if (some) return 0;
    }
    return 1;
}

static void kill_cgroups(void) {
    for (int round = 0; round < CGROUP_KILL_ROUNDS && req->ncgroups; round++) {
        /* Read first: most jobs leave nothing, and freezing an empty cgroup is not free. */
        if (cgroups_empty()) {
            cgroups_emptied = !procs_unread;
            return;
        }
        int left = 0, frozen[64] = {0};
        for (size_t i = 0; i < req->ncgroups && i < 64; i++)
            frozen[i] = write_file(req->cgroups[i], "freezer.state", "FROZEN");
        for (size_t i = 0; i < req->ncgroups; i++) {
            write_file(req->cgroups[i], "cgroup.kill", "1");
            char *procs = read_procs(req->cgroups[i]), *s = procs, *end;
            for (long pid; (pid = strtol(s, &end, 10)), end != s; s = end) {
                left = 1;
                kill((pid_t)pid, SIGKILL);
            }
            free(procs);
        }
        for (size_t i = 0; i < req->ncgroups && i < 64; i++) /* SIGKILL lands once thawed */
            if (frozen[i]) write_file(req->cgroups[i], "freezer.state", "THAWED");
        if (!left) {
            cgroups_emptied = !procs_unread;
            return;
        }
        struct timespec pause = {0, 10 * 1000 * 1000};
        nanosleep(&pause, NULL);
    }
}

/* The OOM killer's kills in the rank's cgroups: `oom_kill N` of v2's memory.events or
 * v1's memory.oom_control. */
static long long oom_kills(void) {
    static const char *files[] = {"memory.events", "memory.oom_control"};
    long long kills = 0;
    for (size_t i = 0; i < req->ncgroups; i++)
        for (int f = 0; f < 2; f++) {
            char *text = read_file(req->cgroups[i], files[f], NULL);
            for (char *line = text; line && *line;) {
                if (strncmp(line, "oom_kill ", 9) == 0) kills += atoll(line + 9);
                line = strchr(line, '\n');
                if (line) line++;
            }
            free(text);
        }
    return kills;
}

/* --- output: secrets masked, a value split across two reads too ------------------------ */

struct span {
    size_t start, end;
};

static int by_start(const void *a, const void *b) {
    const struct span *x = a, *y = b;
    if (x->start != y->start) return x->start < y->start ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

static void emit(struct stream *s, const char *data, size_t n) {
    for (int i = 0; i < s->ntargets; i++) log_write(s->targets[i], data, n);
}

static size_t longest_secret(void) {
    size_t m = 1;
    for (size_t i = 0; i < req->nmask; i++)
        if (strlen(req->mask[i]) > m) m = strlen(req->mask[i]);
    return m;
}

static void feed(struct stream *s, const char *chunk, size_t n, int final) {
    if (!req->nmask) {
        emit(s, chunk, n);
        return;
    }
    buf_add(&s->held, chunk, n);
    char *data = s->held.data;
    size_t len = s->held.len, nspans = 0, cap = 16, pos = 0;
    struct span *spans = xrealloc(NULL, sizeof *spans * cap);
    for (size_t i = 0; i < req->nmask; i++) {
        size_t slen = strlen(req->mask[i]);
        if (!slen) continue;
        for (char *at = data; (at = memmem(at, len - (size_t)(at - data), req->mask[i], slen));
             at++) {
            if (nspans == cap) spans = xrealloc(spans, sizeof *spans * (cap *= 2));
            spans[nspans++] = (struct span){(size_t)(at - data), (size_t)(at - data) + slen};
        }
    }
    qsort(spans, nspans, sizeof *spans, by_start);
    struct buffer out = {0};
    for (size_t i = 0; i < nspans; i++) {
        if (spans[i].start < pos) { /* overlaps the span just masked: extend it */
            if (spans[i].end > pos) pos = spans[i].end;
            continue;
        }
        buf_add(&out, data + pos, spans[i].start - pos);
        buf_add(&out, "***", 3);
        pos = spans[i].end;
    }
    free(spans);
    size_t cut = len;
    if (!final) {
        size_t keep = longest_secret() - 1;
        size_t most = keep < len - pos ? keep : len - pos;
        for (size_t size = most; size > 0; size--) {
            int prefix = 0;
            for (size_t i = 0; i < req->nmask && !prefix; i++)
                prefix = strlen(req->mask[i]) >= size &&
                         memcmp(req->mask[i], data + len - size, size) == 0;
            if (prefix) {
                cut -= size;
                break;
            }
        }
    }
    buf_add(&out, data + pos, cut - pos);
    emit(s, out.data, out.len);
    free(out.data);
    memmove(s->held.data, data + cut, len - cut);
    s->held.len = len - cut;
}

/* Copy output into the logs until the job exits and its pipes close; the wait status. */
static int pump(int out_r, int err_r, pid_t pid) {
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    int sfd = signalfd(-1, &chld, SFD_NONBLOCK | SFD_CLOEXEC);
    struct stream streams[2] = {{out_r, {0}, 1, {0}}, {err_r, {0, 1}, 2, {0}}};
    int open_pipes = 2, status = 0, have_status = 0;
    long long deadline = -1;
    char chunk[CHUNK];
    while (open_pipes) {
        /* Before every wait, after SIGCHLD is routed to the signalfd: a job that exited
         * before we got here, leaving a child that holds its pipes, is not missed. */
        if (!have_status && waitpid(pid, &status, WNOHANG) == pid) {
            have_status = 1;
            kill(-pid, SIGKILL); /* like a container: the rest of its group goes with it, */
            kill_cgroups();      /* and all else in its cgroup (a setsid child) */
            deadline = monotonic_ms() + DRAIN_AFTER_EXIT_MS;
        }
        struct pollfd fds[3];
        int nfds = 0;
        for (int i = 0; i < 2; i++)
            if (streams[i].fd >= 0) fds[nfds++] = (struct pollfd){streams[i].fd, POLLIN, 0};
        if (sfd >= 0) fds[nfds++] = (struct pollfd){sfd, POLLIN, 0};
        int timeout = -1;
        if (deadline >= 0) {
            long long left = deadline - monotonic_ms();
            timeout = left > 0 ? (int)left : 0;
        } else if (sfd < 0) {
            timeout = 50; /* no signalfd: look for the exit now and then */
        }
        int ready = poll(fds, (nfds_t)nfds, timeout);
        if (ready < 0 && errno == EINTR) continue;
        if (ready == 0 && deadline >= 0) break; /* escaped processes still hold the pipes */
        for (int k = 0; k < nfds && ready > 0; k++) {
            if (!fds[k].revents) continue;
            if (fds[k].fd == sfd) {
                struct signalfd_siginfo info;
                while (read(sfd, &info, sizeof info) > 0) {}
                continue;
            }
            struct stream *s = fds[k].fd == streams[0].fd ? &streams[0] : &streams[1];
            ssize_t n = read(s->fd, chunk, sizeof chunk);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) {
                close(s->fd);
                s->fd = -1;
                open_pipes--;
                feed(s, "", 0, 1);
            } else {
                feed(s, chunk, (size_t)n, 0);
            }
        }
    }
    for (int i = 0; i < 2; i++)
        if (streams[i].fd >= 0) feed(&streams[i], "", 0, 1); /* what the masker held */
    if (!have_status) {
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
        kill(-pid, SIGKILL);
        kill_cgroups();
    }
    log_close(0);
    log_close(1);
    return status;
}

/* The job's process starts as a clone sharing the shim's memory, the shim held until it
 * execs (posix_spawn's way): no copy of the shim's page tables, no copy-on-write faults in
 * either, and an exec with no private memory to tear down; about 0.13 ms of CPU a task
 * (issue 25, part 5). So the code before its exec writes no memory the shim reads after:
 * it changes only its own stack, descriptors and kernel state (a clone without
 * CLONE_FILES or CLONE_SIGHAND has its own descriptor table and signal actions), and the
 * shim is one thread, held in clone(), so the allocator is free for the child to use. */
struct job_fds {
    int null, out_w, err_w;
};
static char job_stack[256 * 1024] __attribute__((aligned(16)));

static int job_main(void *arg) {
    struct job_fds *fds = arg;
    exec_job(fds->null, fds->out_w, fds->err_w);
    _exit(127); /* never a return: clone() would exit() through the shim's stdio and atexit */
}

/* Whether the attempt directory (open as `dir`) bears our request's go mark (shim.py's
 * GO_MARK): the daemon sets it before it lets us go, and a restarted daemon that reuses a
 * made-ahead first attempt removes it under the directory's lock. A shim let go just
 * before the crash, which takes the lock only after that, then runs nothing: the attempt
 * is started again by the new daemon, not twice. */
static int marked(int dir) {
    char seen[128];
    ssize_t n = fgetxattr(dir, "user.noduslocal.go", seen, sizeof seen);
    return n >= 0 && (size_t)n == strlen(req->mark) && memcmp(seen, req->mark, (size_t)n) == 0;
}

/* An armed shim: held until the daemon's go (SIGUSR1), true; or false when it let us go
 * (SIGUSR2), the spawner died (the parent-death signal: the daemon is gone, and with it
 * the start that would have gone with the go) or the hold ran out. The spawner blocked
 * both signals before the fork, so a go that comes before we wait is kept pending. */
static int held_until_go(pid_t spawner) {
    sigset_t both;
    sigemptyset(&both);
    sigaddset(&both, SIGUSR1);
    sigaddset(&both, SIGUSR2);
    if (prctl(PR_SET_PDEATHSIG, SIGUSR2) != 0 || getppid() != spawner) return 0;
    struct timespec left = {req->hold, 0};
    int sig;
    do sig = sigtimedwait(&both, NULL, &left);
    while (sig < 0 && errno == EINTR);
    /* From here the shim outlives the spawner and the daemon, as every shim does. */
    prctl(PR_SET_PDEATHSIG, 0);
    return sig == SIGUSR1;
}

/* In the forked child of the spawner: run one attempt to its end. Never returns.
 * `reaper_end`: the spawner's end of the reaper's socket (-1: none). */
static void run_shim(char *data, size_t len, pid_t spawner, int reaper_end) {
    signal(SIGCHLD, SIG_DFL); /* the spawner's children are reaped for it; ours are not */
    signal(SIGPIPE, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    req = parse_request(data, len);
    setsid(); /* no terminal reaches the shim or its job */
    int null = open("/dev/null", O_RDWR);
    if (null < 0) die();
    for (int fd = 0; fd < 3; fd++) dup2(null, fd);
    if (null > 2) close(null);
    if (reaper_end >= 0 && (reaper_end == REAPER_FD ||
                            dup3(reaper_end, REAPER_FD, O_CLOEXEC) == REAPER_FD))
        reaper = REAPER_FD;
    syscall(SYS_close_range, reaper >= 0 ? REAPER_FD + 1 : 3, ~0U, 0);
    null = open("/dev/null", O_RDONLY | O_CLOEXEC);
    /* Nothing in the attempt directory yet: a shim let go leaves no trace of itself. */
    if (req->hold && !held_until_go(spawner)) _exit(0);

    /* The attempt directory itself is the lock (shim.py's LOCK file is one inode more a
     * task): held until we exit, it tells a restarted daemon that we live. */
    int lock = open(req->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (lock < 0 || flock(lock, LOCK_EX) != 0) die();
    char *abandoned = path_in("abandoned");
    if (access(abandoned, F_OK) == 0) _exit(0); /* a restarted daemon gave up on us */
    if (*req->mark && !marked(lock)) _exit(0); /* a restarted daemon took the directory */
    /* One file holds both records (an inode a task fewer: on a file system without a
     * journal each new one is dearer after recent deletions, issue 25 part 5): the pid
     * record is written into it and linked as pid.json, and at the end the exit record,
     * which repeats the pid record's fields, replaces it in place and the file is renamed
     * exit.json. pid.json then reads as the exit record, which every reader of it takes. */
    int record = reserve_record("exit.json");
    if (record < 0) {
        /* A job we could not record would run unseen: judged never started after a
         * restart, it would run twice. Not started, it is (and is queued again). */
        int marker = open(path_in("no-room"), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
        if (marker >= 0) close(marker); /* an empty file: a name needs no block */
        _exit(0);
    }
    if (req->max_log) {
        tail_room = req->max_log / 4 < TAIL_MAX ? (size_t)(req->max_log / 4) : TAIL_MAX;
        head_room = req->max_log > tail_room + NOTE_ROOM ? req->max_log - tail_room - NOTE_ROOM
                                                         : 0;
    }

    int out[2], err[2];
    if (pipe2(out, O_CLOEXEC) || pipe2(err, O_CLOEXEC)) die();
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    sigprocmask(SIG_BLOCK, &chld, NULL); /* delivered through the signalfd in pump() */
    double started = now();
    struct job_fds fds = {null, out[1], err[1]};
    pid_t pid = clone(job_main, job_stack + sizeof job_stack, CLONE_VM | CLONE_VFORK | SIGCHLD,
                      &fds);
    if (pid < 0) die();
    if (reaper >= 0) close(reaper); /* the job's process had its own copy */
    setpgid(pid, pid); /* the child does it too: whichever runs first */
    close(out[1]);
    close(err[1]);

    char json[1024], fields[512], ticks[32];
    long long t = start_ticks(pid);
    if (t < 0) snprintf(ticks, sizeof ticks, "null");
    else snprintf(ticks, sizeof ticks, "%lld", t);
    /* `armed`: let go as its start was queued, perhaps before that start was committed:
     * a daemon killed in between loses no commit it had made (recovery, orphans.py). */
    snprintf(fields, sizeof fields,
             "\"shim_pid\": %d, \"pid\": %d, \"pgid\": %d, \"started_at\": %.6f, "
             "\"boot_id\": \"%s\", \"start_ticks\": %s%s",
             (int)getpid(), (int)pid, (int)pid, started, req->boot_id, ticks,
             req->hold ? ", \"armed\": true" : "");
    snprintf(json, sizeof json, "{%s}", fields);
    char *record_tmp = tmp_path("exit.json"), *pid_path = path_in("pid.json");
    if (put_record(record, json) != 0 || link(record_tmp, pid_path) != 0)
        write_record(-1, "pid.json", json, 0); /* a file of its own: no hard links here */

    int status = pump(out[0], err[0], pid);
    char code[32], sig[32];
    if (WIFSIGNALED(status)) {
        snprintf(code, sizeof code, "%d", 128 + WTERMSIG(status));
        snprintf(sig, sizeof sig, "%d", WTERMSIG(status));
    } else {
        snprintf(code, sizeof code, "%d", WEXITSTATUS(status));
        snprintf(sig, sizeof sig, "null");
    }
    /* The OOM killer's count only matters for a job that failed (read_exit: one that
     * exited 0 outlived any kill), and its probes are four opens a task in a map. */
    int failed = WIFSIGNALED(status) || WEXITSTATUS(status) != 0;
    snprintf(json, sizeof json,
             "{%s, \"ended_at\": %.6f, \"exit_code\": %s, \"signal\": %s%s%s}",
             fields, now(), code, sig,
             !req->ncgroups ? "" : failed && oom_kills() > 0 ? ", \"oom_killed\": true"
                                                             : ", \"oom_killed\": false",
             req->ncgroups && cgroups_emptied ? ", \"cgroups_empty\": true" : "");
    /* While the spawner is our parent the daemon is alive and commits this exit within
     * milliseconds, so syncing it here too would only add device flushes to every end.
     * Once the daemon is gone this file is the only record until it returns. */
    int durable = getppid() != spawner;
    if (put_record(record, json) == 0) {
        if (durable) fdatasync(record);
        close(record);
        rename(record_tmp, path_in("exit.json"));
        if (durable) fsync_dir();
    } else {
        close(record);
    }
    _exit(0);
}

static int read_exact(int fd, void *into, size_t n) {
    char *p = into;
    while (n) {
        ssize_t r = read(fd, p, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

/* The reaper, forked by the spawner: each job's mount namespace, sent by the job's process
 * before its exec with a pidfd of it, held until that pidfd says the job exited, then
 * dropped. The last drop of a namespace unmounts its tree and waits for an RCU grace
 * period (synchronize_rcu_expedited); in the job's own exit that wait came before its
 * shim heard of the end: 0.15 ms median, 0.35 mean, 1 ms at p90 on a busy two-CPU box
 * (perf sched, issue 25 part 5), so every short task's end waited for it. It exits once
 * every shim and the spawner have closed their ends and what it holds is dropped. */
static void run_reaper(int sock) {
    /* Not the daemon's pipes: the daemon learns that its spawner died from their end. */
    int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null < 0 || dup2(null, 0) < 0 || dup2(null, 1) < 0) _exit(1);
    if (sock > 3) syscall(SYS_close_range, 3, sock - 1, 0);
    syscall(SYS_close_range, sock + 1, ~0U, 0);
    struct rlimit files;
    if (getrlimit(RLIMIT_NOFILE, &files) == 0) { /* two a running job */
        files.rlim_cur = files.rlim_max;
        setrlimit(RLIMIT_NOFILE, &files);
    }
    int ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = UINT64_MAX};
    if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, sock, &ev) != 0) _exit(1);
    long held = 0;
    while (sock >= 0 || held > 0) {
        struct epoll_event got[64];
        int n = epoll_wait(ep, got, 64, -1);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) _exit(1);
        for (int i = 0; i < n; i++) {
            uint64_t what = got[i].data.u64;
            if (what != UINT64_MAX) { /* a job exited: its namespace goes */
                int pidfd = (int)(what >> 32), ns = (int)(what & 0xffffffffu);
                epoll_ctl(ep, EPOLL_CTL_DEL, pidfd, NULL);
                close(pidfd);
                close(ns);
                held--;
                continue;
            }
            char byte;
            struct iovec iov = {&byte, 1};
            union {
                struct cmsghdr header;
                char room[CMSG_SPACE(2 * sizeof(int))];
            } control;
            struct msghdr msg = {0};
            msg.msg_iov = &iov;
            msg.msg_iovlen = 1;
            msg.msg_control = control.room;
            msg.msg_controllen = sizeof control.room;
            ssize_t r = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
            if (r == 0) { /* every sender is gone */
                epoll_ctl(ep, EPOLL_CTL_DEL, sock, NULL);
                close(sock);
                sock = -1;
                continue;
            }
            if (r < 0) continue;
            struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
            if (!c || c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
            int fds[2] = {-1, -1};
            size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            memcpy(fds, CMSG_DATA(c), (count < 2 ? count : 2) * sizeof(int));
            struct epoll_event pe = {.events = EPOLLIN,
                                     .data.u64 = (uint64_t)(unsigned)fds[0] << 32 |
                                                 (unsigned)fds[1]};
            if (count != 2 || epoll_ctl(ep, EPOLL_CTL_ADD, fds[0], &pe) != 0) {
                for (size_t k = 0; k < count && k < 2; k++) close(fds[k]);
                continue;
            }
            held++;
        }
    }
    _exit(0);
}

/* The spawner: one shim forked per request until the daemon closes our stdin. Forking
 * this small process costs far less than starting a program, and the daemon's loop only
 * writes a request and reads a line. */
static int serve(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_DFL;
    /* What the daemon's own parent ignored (nohup's SIGHUP) is not passed on to the jobs:
     * every signal at its default, once here rather than in each job's process. */
    for (int s = 1; s < NSIG; s++) signal(s, SIG_DFL);
    sa.sa_flags = SA_NOCLDWAIT; /* shims are reaped by the kernel: no zombies */
    sigaction(SIGCHLD, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    signal(SIGINT, SIG_IGN); /* a Ctrl-C at the daemon's terminal is the daemon's */
    /* An armed shim's go and let-go, blocked before its fork so that neither is lost
     * (nor, at its default action, kills it) before it waits for them; the job's process
     * unblocks every signal before its exec. */
    sigset_t held;
    sigemptyset(&held);
    sigaddset(&held, SIGUSR1);
    sigaddset(&held, SIGUSR2);
    sigprocmask(SIG_BLOCK, &held, NULL);
    pid_t self = getpid();
    int pair[2], reaper_end = -1;
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) == 0) {
        pid_t pid = fork();
        if (pid == 0) {
            close(pair[1]);
            run_reaper(pair[0]);
        }
        close(pair[0]);
        if (pid > 0) reaper_end = pair[1];
        else close(pair[1]); /* no reaper: each job's exit drops its namespace itself */
    }
    for (;;) {
        unsigned char header[4];
        if (read_exact(0, header, 4) != 0) return 0;
        size_t len = header[0] | header[1] << 8 | header[2] << 16 | (size_t)header[3] << 24;
        char *data = xrealloc(NULL, len + 1);
        if (read_exact(0, data, len) != 0) return 0;
        data[len] = 0;
        const char *id = memchr(data, 0, len) ? data + strlen(data) + 1 : "";
        if (id >= data + len) id = "";
        char reply[128];
        pid_t pid = fork();
        if (pid == 0) run_shim(data, len, self, reaper_end);
        if (pid < 0)
            snprintf(reply, sizeof reply, "{\"id\": %.20s, \"error\": \"fork: %s\"}\n", id,
                     strerror(errno));
        else
            snprintf(reply, sizeof reply, "{\"id\": %.20s, \"pid\": %d}\n", id, (int)pid);
        free(data);
        write_all(1, reply, strlen(reply));
    }
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "--serve") == 0) return serve();
    fprintf(stderr, "usage: %s --serve (started by the noduslocal daemon)\n", argv[0]);
    return 2;
}
