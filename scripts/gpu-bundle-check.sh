#!/usr/bin/env bash
# Proves a GPU bundle (scripts/gpu-bundle.sh) needs nothing from the machine it lands on but
# glibc: in a bare Debian chroot (debootstrap --variant=minbase bookworm, no package added — no
# OpenBLAS, TBB, spdlog, yaml-cpp, liburing, CUDA, Python) the unpacked strata-gpu/ must
#   - run `bin/strata --version`,
#   - say "no GPU" with exit 77 from `bin/strata devices` (no driver here), and so must every
#     CUDA suite in bin/ (they start: their libraries load),
#   - train the demo config 20 steps on `cpu`, and on `emulated` when this build has that device
#     (the two exports must be byte-identical),
#   - exit 77 from `gpu-check.sh` in under 10 s.
#
#   sudo scripts/gpu-bundle-check.sh gpu/strata-gpu.tar.xz
#
# A maintainer's check, not CI: it needs root (chroot) and, the first time, the Debian mirror
# (the chroot is cached under /var/cache/strata-gpu-bundle-check and reused).
set -euo pipefail
if [ $# -ne 1 ] || [ ! -f "$1" ]; then
  echo "usage: scripts/gpu-bundle-check.sh BUNDLE.tar.xz" >&2
  exit 2
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "gpu-bundle-check: needs root (chroot, mount)" >&2
  exit 1
fi
archive=$(realpath "$1")
cache=/var/cache/strata-gpu-bundle-check
rootfs="$cache/bookworm-minbase"
if [ ! -x "$rootfs/bin/bash" ]; then
  command -v debootstrap > /dev/null || { echo "gpu-bundle-check: debootstrap not found (scripts/setup.sh installs it)" >&2; exit 1; }
  echo "gpu-bundle-check: making the bare chroot (once): $rootfs" >&2
  mkdir -p "$cache"
  rm -rf "$rootfs.tmp"
  debootstrap --variant=minbase bookworm "$rootfs.tmp" http://deb.debian.org/debian > "$cache/debootstrap.log" 2>&1 ||
    { tail -5 "$cache/debootstrap.log" >&2; echo "gpu-bundle-check: debootstrap failed (log: $cache/debootstrap.log)" >&2; exit 1; }
  mv "$rootfs.tmp" "$rootfs"
fi

# The bundle and its runs live in one folder of the chroot, removed after; /proc and /sys as a
# real machine has them (strata re-executes itself through /proc/self/exe; TBB and the I/O
# layer read the CPUs and the block devices there). No package, no library of the host.
check="$rootfs/opt/strata-check"
rm -rf "$check"
mkdir -p "$check"
cleanup() {
  umount "$rootfs/sys" 2> /dev/null || true
  umount "$rootfs/proc" 2> /dev/null || true
  rm -rf "$check"
}
trap cleanup EXIT
mount -t proc proc "$rootfs/proc"
mount -t sysfs -o ro sysfs "$rootfs/sys"
tar -xJf "$archive" -C "$check"

chroot "$rootfs" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root /bin/bash -s <<'INSIDE'
set -uo pipefail
cd /opt/strata-check
bundle=/opt/strata-check/strata-gpu
fail=0
say() { echo "gpu-bundle-check: $*"; }

# Nothing here is a library the bundle should have brought: any missing one fails --version.
version=$("$bundle/bin/strata" --version 2>&1) || { say "FAIL strata --version: $version"; exit 1; }
say "strata --version: $version ($(cat "$bundle/VERSION"))"
for program in "$bundle"/bin/*; do
  missing=$(ldd "$program" 2>&1 | grep "not found" | grep -v "libcuda\|libnvidia" || true)
  if [ -n "$missing" ]; then say "FAIL $(basename "$program") lacks: $missing"; fail=1; fi
done

# Every CUDA suite starts (its libraries load) and skips honestly without a GPU.
for suite in test_gpt2_cuda test_optim_cuda test_cuda_device test_backend_ops "test_comm_collectives nccl"; do
  rc=0
  text=$(timeout 60 $bundle/bin/$suite 2>&1) || rc=$?
  if [ "$rc" -eq 77 ]; then say "$suite: exit 77: $(tail -1 <<< "$text")"; else say "FAIL $suite: exit $rc (want 77): $(tail -2 <<< "$text")"; fail=1; fi
done

rc=0
devices=$(timeout 20 "$bundle/bin/strata" devices 2>&1) || rc=$?
if [ "$rc" -eq 77 ]; then say "strata devices: exit 77: $devices"; else say "FAIL strata devices: exit $rc (want 77): $devices"; fail=1; fi

# The demo, 20 steps, with its store and text inside the chroot.
train() {  # train KIND
  mkdir -p "nvme-$1"
  sed -e "s|kind: cpu|kind: $1|" -e "s|paths: \[[^]]*\]|paths: [/opt/strata-check/nvme-$1]|" \
      -e "s|path: /usr/share/common-licenses/GPL-3|path: $bundle/data/GPL-3|" "$bundle/configs/demo.yaml" > "demo-$1.yaml"
  "$bundle/bin/strata" train "demo-$1.yaml" --steps 20 --export "demo-$1.safetensors" > "train-$1.log" 2>&1
}
if train cpu; then
  say "train cpu: 20 steps:"
  grep -a "^step *20/\|^trained steps" train-cpu.log | sed 's/^/    /'
else
  say "FAIL train cpu (exit $?):"
  tail -5 train-cpu.log | sed 's/^/    /'
  fail=1
fi
if train emulated; then
  if cmp -s demo-cpu.safetensors demo-emulated.safetensors; then
    say "train emulated: 20 steps, export byte-identical to cpu's"
  else
    say "FAIL train emulated: its export differs from cpu's"
    fail=1
  fi
elif grep -q "'emulated' is not accepted" train-emulated.log; then
  say "train emulated: skipped, this build has no emulated device ($(tail -1 train-emulated.log))"
else
  say "FAIL train emulated:"
  tail -5 train-emulated.log | sed 's/^/    /'
  fail=1
fi

begin=$(date +%s%N)
rc=0
line=$(timeout 20 "$bundle/gpu-check.sh" /opt/strata-check/gpu-check-out 2>&1) || rc=$?
ms=$((($(date +%s%N) - begin) / 1000000))
if [ "$rc" -eq 77 ] && [ "$ms" -lt 10000 ]; then
  say "gpu-check.sh: exit 77 in ${ms} ms: $line"
else
  say "FAIL gpu-check.sh: exit $rc in ${ms} ms (want 77 in under 10 s): $line"
  fail=1
fi
[ "$fail" -eq 0 ] && say "all passed" || say "FAILED"
exit "$fail"
INSIDE
