/* sandhold-spawn: what the agent's forked child did in Python before exec, done after a
 * posix_spawn (vfork: the agent's memory is neither copied nor made copy-on-write, which cost a
 * fork of the agent about 1.5 ms and the agent's next writes their page faults).
 *
 *   sandhold-spawn SWITCH UID GID GROUPS KEEP PTY CWD -- ARGV...
 *
 * The agent has set up, through posix_spawn: stdin/stdout/stderr (or a PTY's slave) on 0-2, the
 * error pipe on 3, a new session, default signal dispositions and an empty signal mask. Here:
 * the PTY becomes the controlling terminal; every other descriptor is closed; the OOM killer is
 * told to prefer the command; with SWITCH (the agent is root in the sandbox's user namespace):
 * nothing ambient, an empty bounding set but KEEP (hex mask), the groups (GROUPS: comma list,
 * or "-"), gid and uid, then permitted and effective = KEEP and nothing inheritable; chdir, exec
 * (PATH from the command's own environment, see exec_search). A failure writes
 * "stage\0errno\0text" on fd 3 and exits 127; fd 3 is close-on-exec, so the agent reads EOF once
 * the command runs. Not used where the agent's one-step spawn (native.c) was built.
 * Built by sandhold.runtime.agentlib (cc -static); without a compiler the agent forks itself. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ERR_FD 3
#define MAX_GROUPS 256

static void fail(const char *stage) {
  int e = errno;
  char buf[512];
  int n = snprintf(buf, sizeof buf, "%s%c%d%c%s", stage, 0, e, 0, strerror(e));
  if (n > 0) {
    ssize_t w = write(ERR_FD, buf, (size_t)(n < (int)sizeof buf ? n : (int)sizeof buf - 1));
    (void)w;
  }
  _exit(127);
}

static void drop_privileges(uid_t uid, gid_t gid, char *group_list, unsigned long long keep) {
  prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); /* EINVAL on old kernels */
  for (int cap = 0; cap < 64; cap++) {
    if (keep & (1ULL << cap)) continue;
    if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 && errno == EINVAL) break; /* past the last */
  }
  if (getuid() != uid || getgid() != gid) {
    gid_t groups[MAX_GROUPS];
    int n = 0;
    if (strcmp(group_list, "-") != 0)
      for (char *p = strtok(group_list, ","); p && n < MAX_GROUPS; p = strtok(NULL, ","))
        groups[n++] = (gid_t)strtoul(p, NULL, 10);
    if (setgroups((size_t)n, groups) < 0 && errno != EPERM) fail("setgroups");
    if (setresgid(gid, gid, gid) < 0) fail("setgid");
    if (setresuid(uid, uid, uid) < 0) fail("setuid");
  }
  struct __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct data[2];
  memset(data, 0, sizeof data);
  for (int cap = 0; cap < 64; cap++)
    if (keep & (1ULL << cap)) {
      data[cap / 32].effective |= 1u << (cap % 32);
      data[cap / 32].permitted |= 1u << (cap % 32);
    }
  syscall(SYS_capset, &header, data); /* best effort, as before */
}

/* execvp's search of the command's PATH, but a file that is no executable is "exec format
 * error", as in envd (Go), not run by /bin/sh. */
static void exec_search(char **argv) {
  const char *file = argv[0], *path = getenv("PATH");
  if (!*file || strchr(file, '/')) {
    if (!*file) errno = ENOENT;
    else execv(file, argv);
    fail("exec");
  }
  int denied = 0;
  char buf[4096];
  for (const char *start = path ? path : "/bin:/usr/bin";;) {
    const char *end = strchrnul(start, ':');
    size_t dlen = (size_t)(end - start);
    if (dlen + strlen(file) + 2 <= sizeof buf) {
      memcpy(buf, start, dlen);
      buf[dlen] = '/';
      strcpy(buf + (dlen ? dlen + 1 : 0), file); /* an empty entry: the cwd */
      execv(buf, argv);
      if (errno == EACCES) denied = 1;
      else if (errno != ENOENT && errno != ENOTDIR && errno != ESTALE && errno != ENODEV &&
               errno != ETIMEDOUT)
        fail("exec");
    }
    if (!*end) break;
    start = end + 1;
  }
  errno = denied ? EACCES : ENOENT;
  fail("exec");
}

int main(int argc, char **argv) {
  if (argc < 10 || strcmp(argv[8], "--") != 0) {
    errno = EINVAL;
    fail("setup");
  }
  if (fcntl(ERR_FD, F_SETFD, FD_CLOEXEC) < 0) _exit(127);
  if (syscall(SYS_close_range, ERR_FD + 1, ~0U, 0) < 0) /* kernels before 5.9 */
    for (int fd = ERR_FD + 1; fd < 65536; fd++) close(fd);
  if (atoi(argv[6]) && ioctl(0, TIOCSCTTY, 0) < 0) fail("setup");
  int oom = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
  if (oom >= 0) {
    ssize_t w = write(oom, "500", 3); /* the OOM killer should pick commands, not the agent */
    (void)w;
    close(oom);
  }
  if (atoi(argv[1]))
    drop_privileges((uid_t)strtoul(argv[2], NULL, 10), (gid_t)strtoul(argv[3], NULL, 10),
                    argv[4], strtoull(argv[5], NULL, 16));
  if (chdir(argv[7]) < 0) fail("chdir");
  exec_search(&argv[9]);
  return 127;
}
