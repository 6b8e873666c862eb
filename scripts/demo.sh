#!/usr/bin/env bash
# Sets up, builds and runs the demo: a small GPT-2 fine-tuned on the CPU with its weights and
# optimizer state streaming from the NVMe store under strata-data/ (recreated on every run),
# then a sample from the trained model.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
rm -rf strata-data/demo
mkdir -p strata-data/demo
exec build/strata train configs/demo.yaml "$@"
