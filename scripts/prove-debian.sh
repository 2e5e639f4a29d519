#!/usr/bin/env bash
# Proves the README's first command on a fresh Debian of another release (default: trixie, 13):
# debootstraps a minimal root from this machine's own archive, clones this checkout's HEAD into
# it and runs `make run` there (scripts/install.sh, then `sandhold demo`: the official SDKs'
# tour, stopping after it), on this machine's kernel, /proc, /sys and /dev. What the root gets from the machine is
# its configuration only: the CA certificates it trusts and its pip and npm settings.
# As root. About 15 minutes and 2 GB under $ROOT the first time (docs/deploy.md, "Debian 13").
#   scripts/prove-debian.sh [suite] [command run in the checkout]
set -euo pipefail
cd "$(dirname "$0")"
suite=${1:-trixie}
command=${2:-make run RUN_ARGS=--no-serve && .venv/bin/sandhold doctor}
root=${ROOT:-/var/tmp/sandhold-$suite}
repo=$(cd .. && pwd)

source ./debian-archive.sh
uri=$(debian_uri) || { echo "prove: no Debian archive in this machine's apt sources" >&2; exit 1; }
if [[ ! -x $root/usr/bin/apt-get ]]; then
  echo "prove: debootstrap $suite into $root"
  rm -rf "$root"
  debootstrap --variant=minbase --include=ca-certificates,make,git "$suite" "$root" "$uri" \
    >"$root.debootstrap.log" 2>&1 || { tail -n 20 "$root.debootstrap.log" >&2; exit 1; }
fi
rm -rf "$root/src/sandhold"
git clone -q --no-hardlinks "$repo" "$root/src/sandhold"

# The machine's own configuration: its extra CAs, pip's and npm's settings.
cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/" 2>/dev/null || true
for f in /etc/pip.conf /root/.config/pip/pip.conf /etc/npmrc /root/.npmrc /etc/resolv.conf; do
  if [[ -f $f ]]; then mkdir -p "$root$(dirname "$f")" && cp "$f" "$root$f"; fi
done

echo "prove: \`$command\` in $suite ($(cat "$root/etc/debian_version"))"
# A private mount namespace, every mount below going with it, whose root becomes the Debian
# root (pivot_root, not chroot: no user namespace, and so no sandbox, can be made in a chroot).
unshare --mount --propagation private -- /bin/bash -euo pipefail -c '
  root=$1 command=$2
  mount --bind "$root" "$root"
  mount -t proc proc "$root/proc"
  mount --rbind /sys "$root/sys"
  mount --rbind /dev "$root/dev"
  mount -t tmpfs -o mode=0755 tmpfs "$root/run"
  mount -t tmpfs -o mode=1777 tmpfs "$root/tmp"
  mkdir -p "$root/.oldroot"
  cd "$root"
  pivot_root . .oldroot
  exec /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM=dumb \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    /bin/bash -euo pipefail -c "umount -l /.oldroot; update-ca-certificates >/dev/null
      cd /src/sandhold; $command"
' prove "$root" "$command"
