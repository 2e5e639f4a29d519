/* _native: the agent's compiled calls, a Python extension module: starting a command in one
 * step, and the filesystem identity switch (setfsuid/setfsgid, which the checks before a
 * command and file operations as another user make: through ctypes they cost its import and
 * ~1 MiB of every agent that ran a command).
 *
 * spawn_helper.c does the privilege drop after a posix_spawn, at the cost of an exec of the
 * helper itself (~0.5 ms on this kind of host, a tenth of a command's round trip). This does the
 * same work in a vfork-style child (clone with CLONE_VM | CLONE_VFORK, as posix_spawn itself):
 * the agent's memory is neither copied nor made copy-on-write, and the command is the one exec.
 *
 *   spawn(path, argv, envp, stdio, err_fd, switch, uid, gid, groups, keep, tty, cwd)
 *     path: what to exec, looked up in envp's PATH as execvp does (spawn_child.h's rule)
 *     stdio: the three descriptors for 0, 1 and 2; err_fd: where a failure is written
 *     switch: drop to uid/gid/groups keeping the capabilities in the bit mask keep
 *   -> the child's pid. A failure in the child goes up the error pipe (moved to fd 3) as
 *   spawn_child.h's ``fail`` writes it, and the child exits 127.
 *
 * The child shares the agent's memory until it execs, so it makes system calls only (raw ones,
 * or glibc's plain wrappers): no allocation, no lock, no wrapper that signals the other
 * threads (setuid's, setgroups') and no Python. Everything it needs is prepared by the parent.
 * Built by sandhold.runtime.agentlib against the host's Python; without it the agent uses the
 * helper. */
#define PY_SSIZE_T_CLEAN
#define _GNU_SOURCE
#include <Python.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "spawn_child.h"

#define STACK_SIZE (64 * 1024)

struct job {
  char **paths; /* the candidates, in order (one for a path with a slash) */
  char **argv, **envp;
  int stdio[3], err_fd, do_switch, tty, ngroups;
  uid_t uid;
  gid_t gid;
  gid_t *groups;
  unsigned long long keep;
  const char *cwd;
};

static int sys_ok(long r) { return r >= 0; }

static int child(void *arg) {
  const struct job *j = arg;
  /* Every signal at its default (spawn.py's DEFAULT_SIGNALS): the agent's handlers (Python's)
   * must not run here, and an ignored one would stay ignored across exec (the agent inherits
   * what the server's own parent ignored). Then an empty mask (the parent blocked everything).
   * glibc's sigaction and sigprocmask are plain system calls (they refuse its own two). */
  struct sigaction dfl;
  memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  for (int sig = 1; sig < _NSIG; sig++) {
    struct sigaction old;
    if (sig == SIGKILL || sig == SIGSTOP || sigaction(sig, NULL, &old) < 0) continue;
    if (old.sa_handler != SIG_DFL) sigaction(sig, &dfl, NULL);
  }
  sigset_t empty;
  sigemptyset(&empty);
  sigprocmask(SIG_SETMASK, &empty, NULL);

  if (!sys_ok(syscall(SYS_setsid))) fail("setup", errno);
  for (int target = 0; target < 3; target++) {
    int fd = j->stdio[target];
    if (fd == target) { /* dup2 onto itself keeps close-on-exec: clear it */
      if (!sys_ok(syscall(SYS_fcntl, fd, F_SETFD, 0))) fail("setup", errno);
    } else if (!sys_ok(syscall(SYS_dup2, fd, target))) {
      fail("setup", errno);
    }
  }
  /* Last: a source may have been fd 3. Close-on-exec, so the parent sees EOF at the exec. */
  if (j->err_fd != ERR_FD && !sys_ok(syscall(SYS_dup3, j->err_fd, ERR_FD, O_CLOEXEC)))
    fail("setup", errno);
  if (j->err_fd == ERR_FD) syscall(SYS_fcntl, ERR_FD, F_SETFD, FD_CLOEXEC);
  if (syscall(SYS_close_range, ERR_FD + 1, ~0U, 0) < 0) /* kernels before 5.9 */
    for (int fd = ERR_FD + 1; fd < 65536; fd++) syscall(SYS_close, fd);
  if (j->tty && !sys_ok(syscall(SYS_ioctl, 0, TIOCSCTTY, 0))) fail("setup", errno);
  long oom = syscall(SYS_openat, AT_FDCWD, "/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
  if (oom >= 0) { /* the OOM killer should pick commands, not the agent */
    (void)!syscall(SYS_write, oom, "500", 3);
    syscall(SYS_close, oom);
  }
  if (j->do_switch) drop_privileges(j->uid, j->gid, j->groups, j->ngroups, j->keep);
  if (!sys_ok(syscall(SYS_chdir, j->cwd))) fail("chdir", errno);

  int err = ENOENT, denied = 0;
  for (char **p = j->paths; *p; p++) {
    syscall(SYS_execve, *p, j->argv, j->envp);
    err = errno;
    if (!exec_search_goes_on(err)) fail("exec", err);
    denied |= err == EACCES;
  }
  fail("exec", denied ? EACCES : err);
  return 127;
}

/* -- the parent's side ------------------------------------------------------------------------ */

static void free_strings(char **v) {
  if (!v) return;
  for (char **p = v; *p; p++) PyMem_Free(*p);
  PyMem_Free(v);
}

/* A NULL-terminated copy of a sequence of str/bytes (filesystem encoding). */
static char **strings(PyObject *seq, Py_ssize_t *count) {
  PyObject *fast = PySequence_Fast(seq, "expected a sequence of strings");
  if (!fast) return NULL;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  char **out = PyMem_Calloc((size_t)n + 1, sizeof *out);
  if (!out) {
    Py_DECREF(fast);
    PyErr_NoMemory();
    return NULL;
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *b = NULL;
    if (!PyUnicode_FSConverter(PySequence_Fast_GET_ITEM(fast, i), &b)) goto error;
    const char *s = PyBytes_AS_STRING(b);
    if ((Py_ssize_t)strlen(s) != PyBytes_GET_SIZE(b)) {
      Py_DECREF(b);
      PyErr_SetString(PyExc_ValueError, "embedded null byte");
      goto error;
    }
    out[i] = PyMem_Malloc((size_t)PyBytes_GET_SIZE(b) + 1);
    if (!out[i]) {
      Py_DECREF(b);
      PyErr_NoMemory();
      goto error;
    }
    memcpy(out[i], s, (size_t)PyBytes_GET_SIZE(b) + 1);
    Py_DECREF(b);
  }
  Py_DECREF(fast);
  if (count) *count = n;
  return out;
error:
  Py_DECREF(fast);
  free_strings(out);
  return NULL;
}

/* The paths execvp would try for ``file`` with ``envp``'s PATH (glibc's default without one). */
static char **candidates(const char *file, char **envp) {
  const char *path = NULL;
  for (char **e = envp; *e; e++)
    if (strncmp(*e, "PATH=", 5) == 0) path = *e + 5;
  if (strchr(file, '/') || !*file) {
    char **out = PyMem_Calloc(2, sizeof *out);
    if (out && !(out[0] = PyMem_Malloc(strlen(file) + 1))) {
      PyMem_Free(out);
      out = NULL;
    }
    if (!out) return (char **)PyErr_NoMemory();
    strcpy(out[0], file);
    return out;
  }
  if (!path) path = "/bin:/usr/bin";
  size_t n = 1;
  for (const char *c = path; *c; c++) n += *c == ':';
  char **out = PyMem_Calloc(n + 1, sizeof *out);
  if (!out) return (char **)PyErr_NoMemory();
  size_t i = 0;
  for (const char *start = path;; i++) {
    const char *end = strchrnul(start, ':');
    size_t dlen = (size_t)(end - start);
    out[i] = PyMem_Malloc(dlen + 1 + strlen(file) + 1);
    if (!out[i]) {
      free_strings(out);
      return (char **)PyErr_NoMemory();
    }
    if (dlen == 0) strcpy(out[i], file); /* an empty entry: the cwd */
    else {
      memcpy(out[i], start, dlen);
      out[i][dlen] = '/';
      strcpy(out[i] + dlen + 1, file);
    }
    if (!*end) break;
    start = end + 1;
  }
  return out;
}

static PyObject *spawn(PyObject *self, PyObject *args) {
  PyObject *path_obj, *argv_obj, *envp_obj, *groups_obj, *path_bytes = NULL, *cwd_bytes = NULL;
  struct job j;
  memset(&j, 0, sizeof j);
  if (!PyArg_ParseTuple(args, "OOO(iii)ipIIOKpO&:spawn", &path_obj, &argv_obj, &envp_obj,
                        &j.stdio[0], &j.stdio[1], &j.stdio[2], &j.err_fd, &j.do_switch, &j.uid,
                        &j.gid, &groups_obj, &j.keep, &j.tty, PyUnicode_FSConverter, &cwd_bytes))
    return NULL;
  PyObject *result = NULL;
  Py_ssize_t argc = 0;
  void *stack = MAP_FAILED;
  if (!PyUnicode_FSConverter(path_obj, &path_bytes)) goto done;
  if (!(j.argv = strings(argv_obj, &argc)) || !(j.envp = strings(envp_obj, NULL))) goto done;
  if (argc < 1) {
    PyErr_SetString(PyExc_ValueError, "argv must not be empty");
    goto done;
  }
  if (!(j.paths = candidates(PyBytes_AS_STRING(path_bytes), j.envp))) goto done;
  PyObject *groups = PySequence_Fast(groups_obj, "groups must be a sequence of ints");
  if (!groups) goto done;
  j.ngroups = (int)PySequence_Fast_GET_SIZE(groups);
  j.groups = PyMem_Calloc((size_t)j.ngroups + 1, sizeof *j.groups);
  for (int i = 0; j.groups && i < j.ngroups; i++)
    j.groups[i] = (gid_t)PyLong_AsUnsignedLong(PySequence_Fast_GET_ITEM(groups, i));
  Py_DECREF(groups);
  if (!j.groups) {
    PyErr_NoMemory();
    goto done;
  }
  if (PyErr_Occurred()) goto done;
  j.cwd = PyBytes_AS_STRING(cwd_bytes);

  stack = mmap(NULL, STACK_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK,
               -1, 0);
  if (stack == MAP_FAILED) {
    PyErr_SetFromErrno(PyExc_OSError);
    goto done;
  }
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old); /* no handler of ours may run in the child */
  pid_t pid = clone(child, (char *)stack + STACK_SIZE, CLONE_VM | CLONE_VFORK | SIGCHLD, &j);
  int clone_errno = errno;
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (pid < 0) {
    errno = clone_errno;
    PyErr_SetFromErrno(PyExc_OSError);
    goto done;
  }
  result = PyLong_FromLong(pid);
done:
  if (stack != MAP_FAILED) munmap(stack, STACK_SIZE);
  free_strings(j.paths);
  free_strings(j.argv);
  free_strings(j.envp);
  PyMem_Free(j.groups);
  Py_XDECREF(path_bytes);
  Py_XDECREF(cwd_bytes);
  return result;
}

/* setfsuid(id) / setfsgid(id) -> the previous id; never fails (an invalid id only reports) */
static PyObject *set_fsuid(PyObject *self, PyObject *arg) {
  (void)self;
  unsigned long id = PyLong_AsUnsignedLong(arg);
  if (id == (unsigned long)-1 && PyErr_Occurred()) return NULL;
  return PyLong_FromLong(syscall(SYS_setfsuid, (unsigned)id));
}

static PyObject *set_fsgid(PyObject *self, PyObject *arg) {
  (void)self;
  unsigned long id = PyLong_AsUnsignedLong(arg);
  if (id == (unsigned long)-1 && PyErr_Occurred()) return NULL;
  return PyLong_FromLong(syscall(SYS_setfsgid, (unsigned)id));
}

static PyMethodDef methods[] = {
    {"spawn", spawn, METH_VARARGS, "Start a command in one step (see the module's source)."},
    {"setfsuid", set_fsuid, METH_O, "Set the filesystem uid; returns the previous one."},
    {"setfsgid", set_fsgid, METH_O, "Set the filesystem gid; returns the previous one."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", NULL, -1, methods};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&module); }
