#!/usr/bin/env bash
# Builds CRIU from Debian trixie's source pool and installs it at a versioned path, as root
# (docs/runtime.md, "CRIU"). Bookworm's 3.17 fails on current kernels (vvar_vclock) and trixie's
# binary needs a newer libc, so it is built here against bookworm's libraries.
# Quick when the binary is already there and works: one `criu check`, nothing else.
# --rebuild builds again whatever is installed.
set -euo pipefail
cd "$(dirname "$0")"

CRIU_VERSION=4.1.1
# sha256 of criu_4.1.1.orig.tar.xz, as in trixie's signed Sources index
CRIU_ORIG_SHA256=f80a66cb3726bb2116266d4759ce3bcbfab7abdb6b6d430bf20dd41911717afe
CRIU_BIN=/opt/sandhold/criu/$CRIU_VERSION/sbin/criu  # config/runtime.py: criu_path
# What `make criu` needs: libbsd (setproctitle) and libnftables (--network-lock nftables: this
# host has nft, not iptables) are optional features kept on; GnuTLS (page-server TLS) is off.
BUILD_DEPS=(build-essential pkg-config xz-utils patch libprotobuf-dev libprotobuf-c-dev protobuf-c-compiler
            libnl-3-dev libnet1-dev libcap-dev uuid-dev libbsd-dev libnftables-dev)
# What the binary links against: installed explicitly so that autoremove keeps them.
RUNTIME_LIBS=(libprotobuf-c1 libnl-3-200 libnet1 libuuid1 libbsd0 libnftables1)

# Our patches of its source (scripts/criu/*.patch, see each one's comment), applied in order; the
# installed binary records which, so that a changed patch builds it again.
PATCHES=(criu/*.patch)
# Where CRIU keeps its kernel-features cache (criu.kdat; without it every call probes the kernel
# again, ~30 ms): a tmpfs the runtime makes (runtime/criu.py: KDAT_DIR), not /run itself, which
# is not always a tmpfs (CRIU keeps the cache on a tmpfs only).
CRIU_RUNDIR=/run/sandhold-criu
PATCHES_SHA=$( (cat "${PATCHES[@]}"; echo "RUNDIR=$CRIU_RUNDIR") | sha256sum | cut -c1-16)

die() { echo "install: CRIU: $*" >&2; exit 1; }
check_output() { "$CRIU_BIN" check 2>&1 || true; }  # exits 0 even when it fails: read its words

if [[ ${1:-} != --rebuild && -x $CRIU_BIN && $(cat "$CRIU_BIN.patches" 2>/dev/null) == "$PATCHES_SHA" ]]; then
  out=$(check_output)
  [[ $out == *"Looks good."* ]] && exit 0
  if "$CRIU_BIN" --version 2>/dev/null | grep -qx "Version: $CRIU_VERSION"; then
    # The build runs; the kernel is what says no, and building again would not change that.
    echo "install: CRIU: $CRIU_BIN runs but \`criu check\` fails on this kernel (optional;" \
         "pause uses the freezer):" >&2
    grep -m 3 Error <<<"$out" >&2 || true
    exit 0
  fi
fi

# debian_uri: the machine's own Debian archive
source ./debian-archive.sh

missing=()
for p in "${BUILD_DEPS[@]}" "${RUNTIME_LIBS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install: CRIU build packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends -o DPkg::Lock::Timeout=300 "${missing[@]}" >/dev/null
fi

uri=$(debian_uri) || die "no Debian archive found in /etc/apt/sources.list{,.d/*.sources}"
tmp=$(mktemp -d /var/tmp/sandhold-criu.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
echo "install: CRIU $CRIU_VERSION: fetching the source (trixie deb-src of this machine's archive)"

# A private apt configuration: the host's sources, lists and cache stay as they are.
mkdir -p "$tmp/apt/lists/partial" "$tmp/apt/cache/archives/partial" "$tmp/src"
echo "deb-src $uri trixie main" >"$tmp/apt/sources.list"
A=(-o "Dir::Etc::SourceList=$tmp/apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
   -o "Dir::State::Lists=$tmp/apt/lists" -o "Dir::Cache=$tmp/apt/cache" -o APT::Sandbox::User=root)
apt-get "${A[@]}" -qq update || die "apt-get update of the trixie sources failed"

# Version and sha256 of the orig tarball from the signed index (Checksums-Sha256 of criu 4.1.1-*).
orig=criu_${CRIU_VERSION}.orig.tar.xz
found=$(apt-cache "${A[@]}" showsrc criu | awk -v v="$CRIU_VERSION-" -v f="$orig" '
  BEGIN { RS = ""; FS = "\n" }
  {
    ver = sum = sect = ""
    for (i = 1; i <= NF; i++) {
      if ($i ~ /^Version: /) ver = substr($i, 10)
      if ($i !~ /^[ \t]/) sect = $i
      else if (sect ~ /^Checksums-Sha256:/) { split($i, w, " "); if (w[3] == f) sum = w[1] }
    }
    if (index(ver, v) == 1 && sum != "") { print ver, sum; exit }
  }')
[[ -n $found ]] || die "no criu $CRIU_VERSION-* in the trixie Sources index of $uri"
read -r version index_sha <<<"$found"

# The .dsc and .debian.tar.xz may answer 404 on a mirror while the orig tarball (all the build
# needs) comes: apt's failure is judged by the tarball, which apt and then we check.
(cd "$tmp/src" && apt-get "${A[@]}" -qq source --download-only "criu=$version") \
  >"$tmp/source.log" 2>&1 || true
if [[ ! -f $tmp/src/$orig ]]; then
  cat "$tmp/source.log" >&2
  die "apt-get source did not fetch $orig"
fi
sha=$(sha256sum "$tmp/src/$orig" | cut -d' ' -f1)
[[ $sha == "$index_sha" ]] || die "$orig: sha256 $sha, the Sources index says $index_sha"
[[ $sha == "$CRIU_ORIG_SHA256" ]] || die "$orig: sha256 $sha, this script pins $CRIU_ORIG_SHA256"

echo "install: CRIU $CRIU_VERSION: building (about a minute)"
tar -xJf "$tmp/src/$orig" -C "$tmp"
for p in "${PATCHES[@]}"; do
  patch -d "$tmp/criu-$CRIU_VERSION" -p1 -s <"$p" || die "patch $p does not apply"
done
# The caller's make (make test, make run) must not pass its flags or jobserver on.
if ! env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -C "$tmp/criu-$CRIU_VERSION" -j"$(nproc)" \
     NO_GNUTLS=1 RUNDIR="$CRIU_RUNDIR" criu >"$tmp/build.log" 2>&1; then
  tail -n 40 "$tmp/build.log" >&2
  die "make criu failed"
fi
install -D -m 0755 "$tmp/criu-$CRIU_VERSION/criu/criu" "$CRIU_BIN.new"
mv -f "$CRIU_BIN.new" "$CRIU_BIN"
echo "$PATCHES_SHA" >"$CRIU_BIN.patches"

out=$(check_output)
if [[ $out == *"Looks good."* ]]; then
  echo "install: CRIU $CRIU_VERSION at $CRIU_BIN: criu check: Looks good."
else
  echo "install: CRIU: built at $CRIU_BIN, but \`criu check\` fails on this kernel (optional;" \
       "pause uses the freezer):" >&2
  grep -m 3 Error <<<"$out" >&2 || true
fi
