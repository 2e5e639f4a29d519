#!/usr/bin/env bash
# Builds Sandhold's OCI image (the fleet's hosts, edges and gateway: deploy/k8s/base) on this machine,
# with no container engine: a Debian trixie root debootstrapped from the machine's own archive
# (scripts/prove-debian.sh), Sandhold installed in it as on a server (scripts/install.sh: its
# packages and CRIU 4.1 with the project's patches; the wheel in /opt/sandhold/venv, `sandhold` on
# the PATH), then packed as an OCI image layout with umoci. As root; about 20 minutes the first
# time (docs/fleet.md, "The image").
#   scripts/build-image.sh [output layout directory]   (default /var/tmp/sandhold-image)
# Push it with skopeo: skopeo copy oci:/var/tmp/sandhold-image:0.1.0 docker://REGISTRY/sandhold:0.1.0
set -euo pipefail
cd "$(dirname "$0")"
out=${1:-/var/tmp/sandhold-image}
root=${ROOT:-/var/tmp/sandhold-image-root}
version=$(cd .. && python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])' 2>/dev/null \
  || sed -n 's/^version = "\(.*\)"/\1/p' ../pyproject.toml)
for tool in umoci debootstrap; do
  command -v "$tool" >/dev/null || apt-get install -y -q "$tool" >/dev/null
done

# The root, with Sandhold installed as on a server (prove-debian.sh's pivot into it).
ROOT=$root ./prove-debian.sh trixie '
  scripts/install.sh --no-venv
  python3 -m venv /opt/sandhold/venv
  /opt/sandhold/venv/bin/pip install -q .
  ln -sf /opt/sandhold/venv/bin/sandhold /usr/local/bin/sandhold
  sandhold --help >/dev/null && /opt/sandhold/criu/4.1.1/sbin/criu --version'
# What the image does not carry: the checkout, apt's caches, this machine's resolver.
rm -rf "$root/src/sandhold" "$root/var/cache/apt/archives/"*.deb "$root/var/lib/apt/lists/"* \
  "$root/etc/resolv.conf" "$root.debootstrap.log"

echo "image: packing $root as oci:$out:$version"
rm -rf "$out" "$out.bundle"
umoci init --layout "$out"
umoci new --image "$out:$version"
umoci unpack --image "$out:$version" "$out.bundle"
# The root's files as they are (numeric owners, hard links, xattrs), mount points left empty.
tar -C "$root" --numeric-owner --xattrs --one-file-system -cf - . | tar -C "$out.bundle/rootfs" -xpf -
umoci repack --image "$out:$version" "$out.bundle"
umoci config --image "$out:$version" \
  --config.env PATH=/opt/sandhold/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --config.env LANG=C.UTF-8 \
  --config.entrypoint sandhold \
  --config.workingdir / \
  --config.label "org.opencontainers.image.title=sandhold" \
  --config.label "org.opencontainers.image.version=$version"
rm -rf "$out.bundle"
umoci stat --image "$out:$version" | tail -n 3
echo "image: oci:$out:$version"
