#!/usr/bin/env bash
# Idempotent setup of everything Sandhold needs on Debian 12 or 13, as root: apt packages,
# CRIU, the venv.
# Quick when everything is already there (dpkg and a stamp of pyproject.toml are checked first).
set -euo pipefail
cd "$(dirname "$0")/.."

# What serving needs:
# e2fsprogs: mkfs.ext4 formats the sandboxes' disk images (docs/runtime.md, "Disk budget");
# skopeo, umoci: OCI image pulls (runtime/templates/oci.py); r-base-core to openjdk: the
# interpreter's R, TypeScript and Java contexts (the release's own JDK: 17 on Debian 12, 21 on
# 13); gcc and libc6-dev: the agent's static spawn helper; python3-dev: its one-step spawn
# (agent/native.c, an extension of /usr/bin/python3)
APT_PACKAGES=(bubblewrap util-linux e2fsprogs libseccomp2 python3 python3-pip python3-venv nftables
              debootstrap ca-certificates curl procps iproute2 skopeo umoci r-base-core
              r-cran-irkernel node-typescript default-jdk-headless gcc libc6-dev python3-dev)
# What only the tests need (`scripts/install.sh --test`, as `make test` runs it):
# postgresql: the gateway's store on PostgreSQL; docker-registry: a registry for the image
# tests; prometheus: a real Prometheus scraping `sandhold serve` (tests/e2b/test_metrics.py);
# chromium: the console's browser tests, driven by Playwright from the venv; qemu-system-x86,
# busybox-static, kmod: the cgroup v2 guest of tests/guest (tests/support/guest.py)
TEST_PACKAGES=(postgresql docker-registry prometheus chromium qemu-system-x86 busybox-static kmod)
# --no-venv: the system's part only (scripts/build-image.sh installs the wheel itself).
venv=1
tests=0
for arg in "$@"; do
  case $arg in
    --test) APT_PACKAGES+=("${TEST_PACKAGES[@]}"); tests=1 ;;
    --no-venv) venv=0 ;;
    *) echo "install: unknown option $arg" >&2; exit 2 ;;
  esac
done
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
command -v node >/dev/null || missing+=(nodejs)
((tests)) && ! command -v npm >/dev/null && missing+=(npm)
if ((${#missing[@]})); then
  echo "install: apt packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # The tests start docker-registry and prometheus themselves, on loopback: their system
  # services (":5000", ":9090", every address) must never serve, not even between the install
  # and the disable.
  new_services=()
  for svc in docker-registry prometheus; do
    [[ " ${missing[*]} " == *" $svc "* ]] && new_services+=("$svc")
  done
  policy=
  if [[ -d /run/systemd/system ]]; then
    for svc in "${new_services[@]}"; do systemctl mask -q "$svc.service"; done
  elif ((${#new_services[@]})) && [[ ! -e /usr/sbin/policy-rc.d ]]; then
    # invoke-rc.d asks policy-rc.d first: 101 (action forbidden) for these, for this install only
    policy=/usr/sbin/policy-rc.d
    printf '#!/bin/sh\ncase "$1" in %s) exit 101;; esac\nexit 0\n' \
      "$(IFS='|'; echo "${new_services[*]}")" >"$policy"
    chmod 755 "$policy"
  fi
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  [[ -n $policy ]] && rm -f "$policy"
  for svc in "${new_services[@]}"; do
    if [[ -d /run/systemd/system ]]; then
      systemctl unmask -q "$svc.service"
      systemctl disable --now -q "$svc.service"
    else  # no systemd running: update-rc.d disables the init script and the unit (offline)
      "/etc/init.d/$svc" stop >/dev/null 2>&1 || true
      update-rc.d "$svc" disable >/dev/null 2>&1
    fi
  done
fi

# CRIU 4.1.1 (checkpoint/restore), built from Debian's source pool at /opt/sandhold/criu/4.1.1
scripts/install-criu.sh

PY=${PYTHON:-python3}
stamp=.venv/.installed-$(sha256sum pyproject.toml | cut -c1-16)
if ((venv)) && [[ ! -f $stamp ]]; then
  echo "install: venv at .venv"
  [[ -x .venv/bin/python ]] || "$PY" -m venv .venv
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -e '.[dev]'
  rm -f .venv/.installed-*
  touch "$stamp"
fi

# The official JavaScript SDKs of tests/js, from its lockfile (the registry is the machine's
# npm config's); again only when the lockfile changed.
if ((tests)); then
  js_stamp=tests/js/node_modules/.installed-$(sha256sum tests/js/package-lock.json | cut -c1-16)
  if [[ ! -f $js_stamp ]]; then
    echo "install: the JavaScript SDKs at tests/js/node_modules"
    npm ci --prefix tests/js --no-audit --no-fund --loglevel=error
    touch "$js_stamp"
  fi
fi

# The commit-msg hook (scripts/git-hooks/commit-msg: the subject's form) for this checkout.
if [[ -d .git ]] && [[ "$(git config --get core.hooksPath || true)" != scripts/git-hooks ]]; then
  git config core.hooksPath scripts/git-hooks
fi
