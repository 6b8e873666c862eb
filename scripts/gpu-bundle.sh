#!/usr/bin/env bash
# Builds strata with CUDA (sm_80 and sm_90) and writes ONE archive that runs the GPU check on a
# bare lent machine: it unpacks to strata-gpu/ with bin/ (strata and the CUDA test programs,
# stripped, run path $ORIGIN/../lib), lib/ (every shared library they need except glibc's own,
# the dynamic loader, the NVIDIA driver, cuBLAS and NCCL — those are the machine's: cuBLAS and
# NCCL are dlopen'ed from the CUDA toolkit or PyTorch's wheels, common/runtime_library.h),
# configs/, data/ and gpu-check.sh. Fails when the archive is over 48 MiB (a lent machine takes
# 64 MiB of files per call, the source tree included).
#
#   scripts/gpu-bundle.sh gpu/strata-gpu.tar.xz     (here: nvcc under /usr/local/cuda/bin)
#
# Release build (-O3, no debug info; asserts stay on: b_ndebug is left false) in its own folder,
# build-gpu-bundle/, so a CPU build/ is untouched. MPI is off: Open MPI loads plugins from
# compiled-in paths and needs mpirun, neither of which travels; one GPU needs no MPI (NCCL's id
# stays in the process).
set -euo pipefail
if [ $# -ne 1 ]; then
  echo "usage: scripts/gpu-bundle.sh OUT.tar.xz" >&2
  exit 2
fi
out_archive=$(realpath -m "$1")
cd "$(dirname "$0")/.."
root=$(pwd)
build="$root/build-gpu-bundle"
max_bytes=$((48 * 1024 * 1024))
export PATH="$PATH:/usr/local/cuda/bin"
export CCACHE_NOHASHDIR=1 CCACHE_BASEDIR="$root"  # ccache hits across worktrees
for tool in nvcc patchelf strip xz ldd; do
  command -v "$tool" > /dev/null || { echo "gpu-bundle: $tool not found (scripts/setup.sh installs patchelf; nvcc: the CUDA toolkit)" >&2; exit 1; }
done

# The programs that travel: the CLI and the CUDA suites gpu-check.sh runs (tests/*/meson.build).
targets=(strata tests/gpt2/test_gpt2_cuda tests/optim/test_optim_cuda tests/scheduler/test_cuda_device
         tests/backend/test_backend_ops tests/comm/test_comm_collectives tests/lora/test_lora)
mkdir -p "$build"
if [ ! -f "$build/build.ninja" ]; then
  meson setup "$build" -Dcuda=enabled -Dnccl=enabled -Dmpi=disabled --buildtype=release > "$build/bundle-setup.log" 2>&1 ||
    { tail -20 "$build/bundle-setup.log" >&2; echo "gpu-bundle: meson setup failed (log: $build/bundle-setup.log)" >&2; exit 1; }
fi
ninja -C "$build" "${targets[@]}" > "$build/bundle-ninja.log" 2>&1 ||
  { tail -30 "$build/bundle-ninja.log" >&2; echo "gpu-bundle: build failed (log: $build/bundle-ninja.log)" >&2; exit 1; }

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
bundle="$stage/strata-gpu"
mkdir -p "$bundle/bin" "$bundle/lib" "$bundle/configs" "$bundle/data"
for target in "${targets[@]}"; do
  cp "$build/$target" "$bundle/bin/"
done

# Libraries that never travel: glibc's own and the loader (the machine's must match its
# kernel and each other), the driver (tied to the kernel module), cuBLAS and NCCL (found on the
# machine at run time; hundreds of MB).
stays_home() {
  case "$1" in
    linux-vdso.so*|ld-linux*|libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|libutil.so*|libresolv.so*) return 0 ;;
    libcuda.so*|libnvidia*|libcublas*|libnccl*) return 0 ;;
  esac
  return 1
}
# Every library ldd resolves for every program, copied under its soname (the name the loader
# asks for), following links to the real file.
for program in "$bundle"/bin/*; do
  while read -r soname arrow path _; do
    [ "$arrow" = "=>" ] || continue
    stays_home "$soname" && continue
    if [ "$path" = "not" ]; then
      echo "gpu-bundle: $(basename "$program") needs $soname, which is not found here" >&2
      exit 1
    fi
    [ -f "$bundle/lib/$soname" ] || cp -L "$path" "$bundle/lib/$soname"
  done < <(ldd "$program")
done

# Strip what ships (debug info is 95 % of strata's bytes), then point every program at lib/:
# DT_RPATH, not RUNPATH, because the executable's RPATH also serves its libraries' own needs
# (libopenblas → libgfortran) and the dlopen calls the code makes.
chmod u+w "$bundle"/lib/*
strip --strip-unneeded "$bundle"/bin/* "$bundle"/lib/*
for program in "$bundle"/bin/*; do
  patchelf --force-rpath --set-rpath '$ORIGIN/../lib' "$program"
done
for library in "$bundle"/lib/*; do
  patchelf --set-rpath '$ORIGIN' "$library"
done

# What the check runs: its configs, the demo's text (the lent image need not carry Debian's
# licence files), the check itself at the top.
cp configs/demo.yaml configs/llama-1b-offload.yaml configs/chat-finetune.yaml "$bundle/configs/"
cp -r configs/chat "$bundle/configs/chat"
cp /usr/share/common-licenses/GPL-3 "$bundle/data/GPL-3"
cp scripts/gpu-check.sh "$bundle/gpu-check.sh"
git -C "$root" describe --always --dirty > "$bundle/VERSION" 2> /dev/null || echo unknown > "$bundle/VERSION"

mkdir -p "$(dirname "$out_archive")"
# xz -9: OpenBLAS (37 MB unpacked) is most of the bytes; the whole bundle went 63 MiB → 10.3 MiB.
XZ_OPT="-9 -T2" tar -C "$stage" -cJf "$out_archive" strata-gpu
size_bytes=$(stat -c %s "$out_archive")
unpacked=$(du -sb "$bundle" | cut -f1)
echo "gpu-bundle: $out_archive: $((size_bytes / 1024)) KiB ($((unpacked / 1024 / 1024)) MiB unpacked; $(ls "$bundle/bin" | wc -l) programs, $(ls "$bundle/lib" | wc -l) libraries)"
if [ "$size_bytes" -gt "$max_bytes" ]; then
  echo "gpu-bundle: the archive is over 48 MiB: a lent machine takes 64 MiB per call, the tree included" >&2
  exit 1
fi
