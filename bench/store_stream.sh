#!/usr/bin/env bash
# bench/store_stream.sh — does the NVMe store keep the drive's rate? Streams sets of tensors
# (16 MiB, 64 MiB, 256 MiB each; TOTAL bytes per run) NVMe → pinned arena (read) and pinned
# arena → NVMe (write, a new version) through the store — extents, xxh3 on every byte,
# read-side verification, 64 MiB of tensors in flight (at least two) — and compares each run with raw
# `strata io-bench` over the same bytes in the same directory, same engine, block size and
# queue depth. Raw and store runs alternate (order flipped every repetition); the figure is the
# median of REPS runs per side and the ratio of medians. fio with the same shape (io_uring,
# O_DIRECT, BS, QD, its own file) runs in the same alternation as a second, independent reference. Target: store ≥ 0.9× raw for tensors
# of 16 MiB and up.
#
# Buffers: io-bench reads into one page-aligned region allocated before the clock, mlocked and
# registered with io_uring; the store side reads into a HostArena (mlocked, or cudaHostAlloc'd
# on a GPU machine) registered the same way. Both print which they got; both check their data
# after the timed window. The store's write time excludes its commit (io-bench does not fsync);
# the commit time is reported on its own.
#
# Usage: bench/store_stream.sh [SCRATCH_DIR]   (env: STRATA, SIZES, TOTAL, REPS, ENGINE, BS, QD)
set -euo pipefail

STRATA=${STRATA:-build/strata}
SIZES=${SIZES:-"16MiB 64MiB 256MiB"}
TOTAL=${TOTAL:-1GiB}
REPS=${REPS:-5}
ENGINE=${ENGINE:-uring}
BS=${BS:-1MiB}
QD=${QD:-32}
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3

if [ $# -ge 1 ]; then
  DIR=$1
  mkdir -p "$DIR"
  CLEANUP=0
else
  DIR=$(mktemp -d "${TMPDIR:-/var/tmp}/strata-store-bench.XXXXXX")
  CLEANUP=1
fi
cleanup() { if [ "$CLEANUP" = 1 ]; then rm -rf "$DIR"; fi; }
trap cleanup EXIT

RESULTS="$DIR/results.jsonl"
: > "$RESULTS"
common=(--engine "$ENGINE" --block-size "$BS" --queue-depth "$QD" --json)

raw() {  # rw size
  "$STRATA" --log-level warn io-bench --file "$DIR/raw.dat" --size "$TOTAL" --rw "$1" "${common[@]}" |
    "$PY" -c 'import json,sys; d=json.load(sys.stdin); d["side"]="raw"; d["tensor"]=sys.argv[1]; print(json.dumps(d))' "$2" >> "$RESULTS"
}
fio_ref() {  # rw size: the same I/O shape through fio, a second, independent reference
  # fio reads "1MiB" as 10^6 bytes; "1M" is its binary mebibyte.
  fio --name=ref --filename="$DIR/fio.dat" --rw="$1" --bs="${BS%iB}" --iodepth="$QD" --ioengine=io_uring \
      --direct=1 --size="${TOTAL%iB}" --output-format=json 2>/dev/null |
    "$PY" -c 'import json,sys; d=json.load(sys.stdin); j=d["jobs"][0][sys.argv[1]]; print(json.dumps({"side":"fio","rw":sys.argv[1],"tensor":sys.argv[2],"MBps":j["bw_bytes"]/1e6}))' "$1" "$2" >> "$RESULTS"
}
store() {  # rw size
  "$STRATA" --log-level warn store bench --dir "$DIR" --tensor-size "$2" --total "$TOTAL" --rw "$1" "${common[@]}" |
    "$PY" -c 'import json,sys; d=json.load(sys.stdin); d["side"]="store"; d["tensor"]=sys.argv[1]; print(json.dumps(d))' "$2" >> "$RESULTS"
}

echo "store_stream: TOTAL=$TOTAL per run, engine $ENGINE, block $BS, queue depth $QD, $REPS reps, in $DIR" >&2
# Untimed warm-up: creates raw.dat (stamped) and one store per tensor size.
raw read warmup
fio_ref write warmup
for size in $SIZES; do store read "$size"; done
: > "$RESULTS"

for rw in read write; do
  for size in $SIZES; do
    for rep in $(seq 1 "$REPS"); do
      if [ $((rep % 2)) = 1 ]; then raw "$rw" "$size"; fio_ref "$rw" "$size"; store "$rw" "$size"
      else store "$rw" "$size"; fio_ref "$rw" "$size"; raw "$rw" "$size"; fi
    done
  done
done

"$PY" - "$RESULTS" <<'EOF'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
def med(side, rw, tensor):
    return statistics.median(r["MBps"] for r in rows if r["side"] == side and r["rw"] == rw and r["tensor"] == tensor)
print(f"{'rw':5} {'tensor':>7} {'io-bench':>9} {'fio':>6} {'store':>6} {'store/io-bench':>14} {'store/fio':>9} {'commit s':>8}")
missed = False
for rw in ("read", "write"):
    for tensor in dict.fromkeys(r["tensor"] for r in rows):
        st = [r for r in rows if r["side"] == "store" and r["rw"] == rw and r["tensor"] == tensor]
        if not st:
            continue
        raw, fio, store = med("raw", rw, tensor), med("fio", rw, tensor), med("store", rw, tensor)
        commit = statistics.median(r["commit_seconds"] for r in st)
        print(f"{rw:5} {tensor:>7} {raw:9.0f} {fio:6.0f} {store:6.0f} {store/raw:14.2f} {store/fio:9.2f} {commit:8.3f}")
        missed |= store / raw < 0.9
print("buffers: io-bench:", next(r["buffers"] for r in rows if r["side"] == "raw"))
print("buffers: store:", next(r["buffers"] for r in rows if r["side"] == "store"))
print("target (store >= 0.9x raw io-bench for tensors >= 16 MiB):", "MISSED" if missed else "met")
EOF
