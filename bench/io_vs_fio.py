#!/usr/bin/python3
"""bench/io_vs_fio.py — strata's uring engine against fio's io_uring engine, same file, same
block size and queue depth, run alternately (the order of the sides rotates every
repetition) so drift on this noisy disk hits every side alike. Reports per-configuration
medians and the ratio strata/fio; the target is >= 0.95 for 1 MiB sequential direct reads and
writes at queue depth 32 and 8. strata checks its data after each timed window (see
apps/bench/sequential_bench.h); fio runs without verify so its workload stays plain I/O.

Buffers: fio uses iomem=mmap (page-aligned anonymous memory) with fixedbufs=1 (registered
with io_uring, which pins them) and registerfiles=1; strata uses one mlocked, page-aligned
region registered with io_uring (READ_FIXED/WRITE_FIXED) and a registered file; by default
that region asks for transparent huge pages, and a third side ("strata-4k") runs strata
with 4 KiB pages like fio's, so the engine is also compared like for like.

Run with Debian's python3:  /usr/bin/python3 bench/io_vs_fio.py --strata build/strata
"""
import argparse
import json
import os
import statistics
import subprocess
import sys


def run_fio(path, size, rw, block, depth, seconds):
    command = [
        "fio", "--name=strata-vs-fio", f"--filename={path}", f"--size={size}",
        "--ioengine=io_uring", "--direct=1", f"--rw={rw}", f"--bs={block}",
        f"--iodepth={depth}", "--fixedbufs=1", "--registerfiles=1", "--iomem=mmap",
        "--time_based=1", f"--runtime={seconds}", "--ramp_time=0", "--numjobs=1",
        "--thread=1", "--output-format=json",
    ]
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    job = json.loads(out[out.index("{"):])["jobs"][0][rw]
    return job["bw_bytes"] / 1e6


def run_strata(strata, path, size, rw, block, depth, seconds, huge_pages=True):
    command = [
        strata, "--log-level", "warn", "io-bench", "--file", path, "--size", size, "--rw", rw,
        "--engine", "uring", "--block-size", block, "--queue-depth", str(depth),
        "--seconds", str(seconds), "--json",
    ] + ([] if huge_pages else ["--no-huge-pages"])
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return json.loads(out)["MBps"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strata", default="build/strata")
    parser.add_argument("--file", default="build/io_vs_fio.data")
    parser.add_argument("--size", default="2GiB")
    parser.add_argument("--seconds", type=int, default=3)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--depths", default="32,8")
    parser.add_argument("--block", default="1MiB")
    args = parser.parse_args()
    fio_size = args.size.replace("iB", "")  # fio reads "2G" as 2 GiB
    fio_block = args.block.replace("iB", "")
    depths = [int(d) for d in args.depths.split(",")]

    # Lay the file out once (strata stamps it for its read check; fio reads it as is).
    run_strata(args.strata, args.file, args.size, "read", args.block, 8, 0.1)

    # Three sides per repetition, in a rotating order: fio, strata (buffer region in
    # transparent huge pages, its default) and strata with 4 KiB pages like fio's buffers.
    sides = ("fio", "strata", "strata-4k")
    rows = []
    for rw in ("read", "write"):
        for depth in depths:
            results = {side: [] for side in sides}
            for rep in range(args.reps):
                order = sides[rep % 3:] + sides[:rep % 3]
                for side in order:
                    if side == "fio":
                        value = run_fio(args.file, fio_size, rw, fio_block, depth, args.seconds)
                    else:
                        value = run_strata(args.strata, args.file, args.size, rw, args.block, depth,
                                           args.seconds, huge_pages=(side == "strata"))
                    results[side].append(value)
                print(f"  {rw:5s} qd {depth:2d} rep {rep + 1}: " +
                      "  ".join(f"{side} {results[side][-1]:7.1f}" for side in sides) + " MB/s",
                      file=sys.stderr, flush=True)
            medians = {side: statistics.median(results[side]) for side in sides}
            rows.append((rw, depth, medians, results))

    print(f"{args.block} sequential direct I/O, {args.reps} rotating runs of {args.seconds} s per side, "
          f"file {args.file} ({args.size})")
    print("fio:       ioengine=io_uring direct=1 fixedbufs=1 registerfiles=1 iomem=mmap "
          "(4 KiB pages, pinned by registration)")
    print("strata:    io-bench --engine uring: mlocked page-aligned region, MADV_HUGEPAGE, registered "
          "with io_uring (fixed buffers), registered file")
    print("strata-4k: the same with --no-huge-pages (4 KiB pages, like fio)")
    print()
    print("| direction | queue depth | fio MB/s | strata MB/s | strata/fio | strata-4k MB/s | strata-4k/fio |")
    print("|---|---|---|---|---|---|---|")
    failed = False
    for rw, depth, medians, _ in rows:
        ratio = medians["strata"] / medians["fio"]
        ratio_4k = medians["strata-4k"] / medians["fio"]
        failed |= ratio < 0.95
        print(f"| {rw} | {depth} | {medians['fio']:.1f} | {medians['strata']:.1f} | {ratio:.3f} | "
              f"{medians['strata-4k']:.1f} | {ratio_4k:.3f} |")
    print()
    for rw, depth, _, results in rows:
        print(f"{rw} qd {depth}: " + "; ".join(
            f"{side} {' '.join(f'{x:.0f}' for x in results[side])}" for side in sides))
    os.remove(args.file)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
