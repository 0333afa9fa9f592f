"""What a host task's containment costs the kernel, apart from the daemon: N fork+exec of
/usr/bin/true from a small C program, one after another, bare, then with each part a host
rank has (issue 25): its two v1 cgroups (cpu, pids) entered before exec, its mount
namespace (unshare, / made private, a bind at /workspace), those two cgroups made with
their limits and removed per task, or kept and renamed in and out (runtime/host/cgroups.py's
pool, with the emptiness check it makes). Needs root, cgroup v1's cpu and pids, and a C
compiler; prints wall and CPU a task (the children's, and the parent's own: the cgroups'
making and removal).

    python scripts/bench/containment.py [TASKS] [ROUNDS]
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import table

SOURCE = r"""
#define _GNU_SOURCE
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
extern char **environ;
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t);
                          return t.tv_sec + t.tv_nsec / 1e9; }
static void put(const char *p, const char *v) {
    int fd = open(p, O_WRONLY | O_TRUNC | O_CLOEXEC);
    if (fd < 0 || write(fd, v, strlen(v)) < 0) { perror(p); _exit(1); }
    close(fd);
}
static int empty(const char *dir) {
    char p[512], buf[16]; snprintf(p, sizeof p, "%s/cgroup.procs", dir);
    int fd = open(p, O_RDONLY | O_CLOEXEC); ssize_t n = read(fd, buf, sizeof buf); close(fd);
    return n == 0;
}
static double ms(struct rusage *r) {
    return (r->ru_utime.tv_sec + r->ru_stime.tv_sec) * 1e3
         + (r->ru_utime.tv_usec + r->ru_stime.tv_usec) / 1e3;
}
/* argv: tasks, attach, namespace, cgroups (0 none, 1 made and removed, 2 kept), cpu
 * parent, pids parent, workspace */
int main(int argc, char **argv) {
    int n = atoi(argv[1]), attach = atoi(argv[2]), ns = atoi(argv[3]), mk = atoi(argv[4]);
    const char *parent[2] = {argv[5], argv[6]}, *ws = argv[7];
    char idle[2][512], own[2][512];
    for (int h = 0; h < 2; h++) {
        snprintf(idle[h], sizeof idle[h], "%s/idle-0", parent[h]);
        if (mk == 2) mkdir(idle[h], 0755);
    }
    double t0 = now();
    for (int i = 0; i < n; i++) {
        for (int h = 0; h < 2; h++) {
            snprintf(own[h], sizeof own[h], "%s/job-%d-1-r0", parent[h], i);
            if (mk == 2 && rename(idle[h], own[h]) != 0) { perror("rename"); return 1; }
            if (mk == 1) {
                char p[600];
                if (mkdir(own[h], 0755) != 0) { perror("mkdir"); return 1; }
                snprintf(p, sizeof p, "%s/%s", own[h], h ? "pids.max" : "cpu.cfs_quota_us");
                put(p, h ? "4096" : "100000");
            }
        }
        pid_t pid = fork();
        if (pid == 0) {
            if (attach) {
                char p[600], me[32]; snprintf(me, sizeof me, "%d", getpid());
                for (int h = 0; h < 2; h++) {
                    snprintf(p, sizeof p, "%s/cgroup.procs", mk ? own[h] : parent[h]);
                    put(p, me);
                }
            }
            if (ns) {
                if (unshare(CLONE_NEWNS) != 0) { perror("unshare"); _exit(1); }
                mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL);
                mount(ws, "/workspace", NULL, MS_BIND | MS_REC, NULL);
            }
            char *args[] = {"true", NULL};
            execve("/usr/bin/true", args, environ);
            _exit(127);
        }
        int status;
        waitpid(pid, &status, 0);
        for (int h = 0; h < 2; h++) {
            if (mk == 1) rmdir(own[h]);
            if (mk == 2 && (!empty(own[h]) || rename(own[h], idle[h]) != 0)) {
                perror("keep"); return 1;
            }
        }
    }
    double wall = now() - t0;
    for (int h = 0; h < 2; h++) rmdir(idle[h]);
    struct rusage children, self;
    getrusage(RUSAGE_CHILDREN, &children);
    getrusage(RUSAGE_SELF, &self);
    printf("%.4f %.4f %.4f\n", wall * 1e3 / n, ms(&children) / n, ms(&self) / n);
    return 0;
}
"""

CASES = [  # attach, namespace, cgroups per task
    ("fork+exec true", 0, 0, 0),
    ("+ 2 cgroups entered", 1, 0, 0),
    ("+ mount namespace", 0, 1, 0),
    ("+ both", 1, 1, 0),
    ("+ both, 2 cgroups made and removed a task", 1, 1, 1),
    ("+ both, 2 cgroups kept and renamed", 1, 1, 2),
]


def main() -> None:
    tasks = int(sys.argv[1]) if len(sys.argv) > 1 else 500
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    cc = shutil.which("cc") or shutil.which("gcc")
    roots = [Path("/sys/fs/cgroup") / h for h in ("cpu", "pids")]
    if os.geteuid() != 0 or cc is None or not all((r / "cgroup.procs").exists()
                                                  for r in roots):
        sys.exit("needs root, a C compiler, and cgroup v1's cpu and pids hierarchies")
    with tempfile.TemporaryDirectory(prefix="nl-containment-") as tmp:
        source, binary = Path(tmp) / "c.c", Path(tmp) / "c"
        source.write_text(SOURCE)
        subprocess.run([cc, "-O2", "-o", str(binary), str(source)], check=True)
        (workspace := Path(tmp) / "ws").mkdir()
        Path("/workspace").mkdir(exist_ok=True)  # the daemon's own mount point
        parents = [r / f"nl-containment-{os.getpid()}" for r in roots]
        for parent in parents:
            parent.mkdir()
        try:
            rows = []
            for _ in range(rounds):  # interleaved: this VM's speed drifts
                for name, attach, ns, mk in CASES:
                    out = subprocess.run(
                        [str(binary), str(tasks), str(attach), str(ns), str(mk),
                         *map(str, parents), str(workspace)],
                        check=True, capture_output=True, text=True).stdout.split()
                    wall, children, own = map(float, out)
                    rows.append({"task": name, "wall ms": f"{wall:.3f}",
                                 "child CPU ms": f"{children:.3f}",
                                 "parent CPU ms": f"{own:.3f}"})
            print(table(rows))
        finally:
            for parent in parents:
                parent.rmdir()


if __name__ == "__main__":
    main()
