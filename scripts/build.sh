#!/usr/bin/env bash
# Configures (once) and builds strata in ./build. CUDA code is compiled whenever nvcc is
# found; pass extra meson options as arguments (e.g. -Dcuda=disabled).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -x /usr/local/cuda/bin/nvcc ] && ! command -v nvcc >/dev/null; then
  export PATH="$PATH:/usr/local/cuda/bin"
fi
if [ ! -f build/build.ninja ]; then
  meson setup build "$@"
elif [ $# -gt 0 ]; then
  meson configure build "$@"
fi
ninja -C build
