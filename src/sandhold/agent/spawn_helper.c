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
 * spawn_child.h's privilege drop to UID, GID and GROUPS (a comma list, or "-") keeping KEEP (a
 * hex mask); chdir, exec (PATH from the command's own environment, see exec_search). A failure
 * goes up fd 3 as spawn_child.h's ``fail`` writes it. Not used where the agent's one-step spawn
 * (native.c) was built.
 * Built by sandhold.runtime.agentlib (cc -static); without a compiler the agent forks itself. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <sys/ioctl.h>

#include "spawn_child.h"

#define MAX_GROUPS 256

/* execvp's search of the command's PATH, by spawn_child.h's rule. */
static void exec_search(char **argv) {
  const char *file = argv[0], *path = getenv("PATH");
  if (!*file || strchr(file, '/')) {
    if (!*file) errno = ENOENT;
    else execv(file, argv);
    fail("exec", errno);
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
      if (!exec_search_goes_on(errno)) fail("exec", errno);
      denied |= errno == EACCES;
    }
    if (!*end) break;
    start = end + 1;
  }
  fail("exec", denied ? EACCES : ENOENT);
}

int main(int argc, char **argv) {
  if (argc < 10 || strcmp(argv[8], "--") != 0) {
    fail("setup", EINVAL);
  }
  if (fcntl(ERR_FD, F_SETFD, FD_CLOEXEC) < 0) _exit(127);
  if (syscall(SYS_close_range, ERR_FD + 1, ~0U, 0) < 0) /* kernels before 5.9 */
    for (int fd = ERR_FD + 1; fd < 65536; fd++) close(fd);
  if (atoi(argv[6]) && ioctl(0, TIOCSCTTY, 0) < 0) fail("setup", errno);
  int oom = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
  if (oom >= 0) {
    ssize_t w = write(oom, "500", 3); /* the OOM killer should pick commands, not the agent */
    (void)w;
    close(oom);
  }
  if (atoi(argv[1])) {
    gid_t groups[MAX_GROUPS];
    int n = 0;
    if (strcmp(argv[4], "-") != 0)
      for (char *p = strtok(argv[4], ","); p && n < MAX_GROUPS; p = strtok(NULL, ","))
        groups[n++] = (gid_t)strtoul(p, NULL, 10);
    drop_privileges((uid_t)strtoul(argv[2], NULL, 10), (gid_t)strtoul(argv[3], NULL, 10), groups,
                    n, strtoull(argv[5], NULL, 16));
  }
  if (chdir(argv[7]) < 0) fail("chdir", errno);
  exec_search(&argv[9]);
  return 127;
}
