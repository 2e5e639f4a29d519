/* What both ways of starting a command do in the child before its exec (native.c's one-step
 * spawn and spawn_helper.c): report a failure, drop privileges, and tell which exec errors let
 * the PATH search go on. Raw system calls only, so that native.c's child, which shares the
 * agent's memory, may run it: no allocation, no lock, no glibc wrapper that signals the other
 * threads (setuid's, setgroups'). */
#ifndef SANDHOLD_SPAWN_CHILD_H
#define SANDHOLD_SPAWN_CHILD_H

#include <errno.h>
#include <linux/capability.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#define ERR_FD 3 /* the error pipe, close-on-exec: the agent reads EOF once the command runs */

/* "stage\0errno\0" up the error pipe (the agent words the error), then exit 127. */
static void fail(const char *stage, int err) {
  char buf[32], digits[12];
  size_t n = strlen(stage);
  memcpy(buf, stage, n);
  buf[n++] = 0;
  int d = 0;
  unsigned v = (unsigned)err;
  do digits[d++] = (char)('0' + v % 10);
  while ((v /= 10) && d < 11);
  while (d) buf[n++] = digits[--d];
  buf[n++] = 0;
  (void)!syscall(SYS_write, ERR_FD, buf, n);
  syscall(SYS_exit_group, 127);
  __builtin_unreachable();
}

/* Nothing ambient, an empty bounding set but ``keep`` (a bit mask), the groups, gid and uid,
 * then permitted and effective = keep and nothing inheritable. */
static void drop_privileges(uid_t uid, gid_t gid, const gid_t *groups, int ngroups,
                            unsigned long long keep) {
  syscall(SYS_prctl, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); /* EINVAL: old kernel */
  for (int cap = 0; cap < 64; cap++) {
    if (keep & (1ULL << cap)) continue;
    if (syscall(SYS_prctl, PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 && errno == EINVAL) break;
  }
  if (syscall(SYS_getuid) != (long)uid || syscall(SYS_getgid) != (long)gid) {
    if (syscall(SYS_setgroups, ngroups, groups) < 0 && errno != EPERM) fail("setgroups", errno);
    if (syscall(SYS_setresgid, gid, gid, gid) < 0) fail("setgid", errno);
    if (syscall(SYS_setresuid, uid, uid, uid) < 0) fail("setuid", errno);
  }
  struct __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct data[2];
  memset(data, 0, sizeof data);
  for (int cap = 0; cap < 64; cap++)
    if (keep & (1ULL << cap)) {
      data[cap / 32].effective |= 1u << (cap % 32);
      data[cap / 32].permitted |= 1u << (cap % 32);
    }
  syscall(SYS_capset, &header, data); /* best effort */
}

/* execvp's rule: after these errors the next directory of PATH is tried; after any other the
 * search stops. A file that is no executable (ENOEXEC) stops it, as in envd (Go): glibc's
 * execvp would run it with /bin/sh. If all fail, an EACCES met on the way is the answer. */
static int exec_search_goes_on(int err) {
  return err == EACCES || err == ENOENT || err == ENOTDIR || err == ESTALE || err == ENODEV ||
         err == ETIMEDOUT;
}

#endif
