#!/usr/bin/env bash
# The CI run that a new machine meets, measured: a minimal Debian 12 (debootstrap
# --variant=minbase, nothing added), a fresh clone of this checkout's HEAD, no compiler cache,
# then `bash .ci/run` inside it as CI runs it (CI=true, no standard input). What it proves:
# scripts/setup.sh installs everything the tests need on a plain Debian, and the cold total —
# the ci-time table that closes the output — is what README "CI time" records against the
# 45-minute budget. A maintainer's check (root, debootstrap and the Debian mirror), not a test.
#
# Usage: scripts/ci-cold.sh [--setup-only] [WORKDIR]   (default /var/tmp/strata-ci-cold; the
# pristine Debian is kept in WORKDIR/base so a rerun skips debootstrap, and the run's tree is
# WORKDIR/root). --setup-only runs scripts/setup.sh alone: does it install everything?
# The CUDA toolkit is bind-mounted read-only from /usr/local/cuda when the host has one, as on
# the CI machine, so the CUDA units are compiled as CI compiles them. Output: WORKDIR/ci.log.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
command='bash .ci/run'
if [ "${1:-}" = --setup-only ]; then
  command='bash scripts/setup.sh'
  shift
fi
work=${1:-/var/tmp/strata-ci-cold}
if [ "$(id -u)" -ne 0 ]; then echo "ci-cold.sh: needs root (debootstrap, chroot, mounts)" >&2; exit 2; fi
if ! command -v debootstrap >/dev/null; then
  echo "ci-cold.sh: installing debootstrap"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
fi
mkdir -p "$work"
if [ ! -x "$work/base/bin/bash" ]; then
  rm -rf "$work/base.tmp"
  debootstrap --variant=minbase bookworm "$work/base.tmp" http://deb.debian.org/debian >"$work/debootstrap.log"
  mv "$work/base.tmp" "$work/base"
fi

root="$work/root"
mounts=()
cleanup() {
  local i
  for ((i = ${#mounts[@]} - 1; i >= 0; --i)); do umount -l "${mounts[i]}" 2>/dev/null || true; done
}
trap cleanup EXIT
rm -rf "$root"
cp -a "$work/base" "$root"
bind() {  # bind SOURCE TARGET [ro]
  mkdir -p "$2"
  mount --bind "$1" "$2"
  mounts+=("$2")
  if [ "${3:-}" = ro ]; then mount -o remount,bind,ro "$2"; fi
}
mount -t proc proc "$root/proc" && mounts+=("$root/proc")
mount -t sysfs sys "$root/sys" && mounts+=("$root/sys")
bind /dev "$root/dev"
bind /dev/pts "$root/dev/pts"
mount -t tmpfs shm "$root/dev/shm" && mounts+=("$root/dev/shm")
if [ -d /usr/local/cuda/bin ]; then
  # The toolkit where the host has it, under its real name, with its libraries registered with
  # the loader as the host registers them (libcudart is found through ld.so.conf.d, not a run path).
  cuda_real=$(readlink -f /usr/local/cuda)
  bind "$cuda_real" "$root$cuda_real" ro
  if [ "$cuda_real" != /usr/local/cuda ]; then ln -sfn "$cuda_real" "$root/usr/local/cuda"; fi
  for conf in /etc/ld.so.conf.d/*.conf; do
    if grep -q "^$cuda_real" "$conf"; then cp "$conf" "$root/etc/ld.so.conf.d/"; fi
  done
  chroot "$root" /sbin/ldconfig
fi
# A machine has a resolver and a hosts file (the browser tests resolve localhost), and trusts
# what its network needs: local CAs (a network that inspects TLS) go in before setup.sh installs
# ca-certificates, and npm, which reads Node's own CA list, is pointed at the system's as here.
cp /etc/resolv.conf /etc/hosts "$root/etc/"
if [ -d /usr/local/share/ca-certificates ]; then
  mkdir -p "$root/usr/local/share/ca-certificates"
  cp -a /usr/local/share/ca-certificates/. "$root/usr/local/share/ca-certificates/"
fi
trust=()
if [ -n "${NODE_EXTRA_CA_CERTS:-}" ]; then trust=(NODE_EXTRA_CA_CERTS="$NODE_EXTRA_CA_CERTS"); fi

git clone -q "$repo" "$root/src/strata"
git -C "$root/src/strata" log --oneline -1
start=$(date +%s)
set +e
chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  LANG=C.UTF-8 CI=true "${trust[@]}" bash -c "cd /src/strata && $command" </dev/null 2>&1 | tee "$work/ci.log"
status=${PIPESTATUS[0]}
set -e
echo "ci-cold.sh: '$command' exited $status after $(( ($(date +%s) - start) / 60 )) minutes (log: $work/ci.log)"
exit "$status"
