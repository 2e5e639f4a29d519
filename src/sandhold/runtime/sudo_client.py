"""The ``sudo`` command of ``base`` (copied to ``/opt/sandhold/bin/sudo``, run by the sandbox's
Python): asks the agent to run a command as another user, root by default, with this process's
stdin, stdout and stderr (agent/sudo.py), and exits with its status. Passwordless for
every user inside, as E2B's base; what root can do inside is what any root command of the
sandbox can (no capabilities, the sandbox's seccomp, its own uid range)."""

import array
import json
import os
import socket
import sys

ADDRESS = "\0sandhold-sudo"
USAGE = "usage: sudo [-u user] [-E] [-i | -s] [-n] [-H] [--] [command [args...]]"
# -n, -H, -S, -k: nothing to do without a password; HOME is always the target user's
IGNORED = (
    "-n",
    "--non-interactive",
    "-H",
    "--set-home",
    "-S",
    "--stdin",
    "-k",
    "--reset-timestamp",
)


def main(args: list[str]) -> int:
    req: dict = {"user": "root", "login": False, "cwd": os.getcwd()}
    keep_env, shell = False, False
    while args and args[0].startswith("-"):
        a = args.pop(0)
        if a == "--":
            break
        if a in ("-u", "--user") and args:
            req["user"] = args.pop(0)
        elif a.startswith("-u") and len(a) > 2:
            req["user"] = a[2:]
        elif a in ("-E", "--preserve-env"):
            keep_env = True
        elif a in ("-i", "--login"):
            req["login"] = True
        elif a in ("-s", "--shell"):
            shell = True
        elif a in ("-l", "--list"):
            print("User may run the following commands on sandbox:\n    (ALL) NOPASSWD: ALL")
            return 0
        elif a in ("-V", "--version"):
            print("Sandhold sudo (runs commands through the sandbox's agent)")
            return 0
        elif a not in IGNORED:
            print(f"sudo: unsupported option {a}\n{USAGE}", file=sys.stderr)
            return 1
    if not args and not (req["login"] or shell):
        print(USAGE, file=sys.stderr)
        return 1
    req["argv"] = args
    keep = os.environ if keep_env else {k: v for k, v in os.environ.items() if k == "TERM"}
    req["env"] = dict(keep)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(ADDRESS)
        except OSError as e:
            print(f"sudo: the sandbox's agent does not answer: {e}", file=sys.stderr)
            return 1
        fds = array.array("i", [0, 1, 2])
        s.sendmsg([json.dumps(req).encode()], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    answer = json.loads(reply or b"{}")
    if "error" in answer:
        print(answer["error"], file=sys.stderr)
        return 1
    return int(answer.get("exit", 1))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
