#!/usr/bin/python3
"""The Python package's costs, measured against references in the same run (alternated in
adjacent pairs, medians, ratios) — issue 13's three figures:

  adamw-host  strata.AdamW (moments in strata host memory) vs torch.optim.AdamW(foreach=True),
              one step over --params fp32 parameters (default 100 M, in 8 tensors).
  adamw-nvme  strata.AdamW(offload="nvme") vs the I/O floor of its bytes: the time the same
              store takes to write and read the moments' bytes once (16 B per parameter:
              exp_avg and exp_avg_sq, read and written), in tensors of the chunk size.
  offload     a stack of Linear layers under strata.offload with host_memory = a small
              fraction of its weights: a training step (forward, backward, strata.AdamW
              nvme) vs the same model resident with strata.AdamW host state, and vs the I/O
              floor of the bytes the step fetched; peak resident parameter bytes vs the budget
              and the process's peak RSS growth.

Run: STRATA_LIBRARY=build/api/libstrata.so PYTHONPATH=python /usr/bin/python3 \
       bench/python_api.py --dir /path/on/nvme [--params N] [--rounds R] [adamw-host ...]
"""
import argparse
import os
import shutil
import statistics
import time

import torch

import strata


def timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def make_params(total, tensors, seed):
    g = torch.Generator().manual_seed(seed)
    n = total // tensors
    params = [torch.nn.Parameter(torch.randn(n, generator=g)) for _ in range(tensors)]
    for p in params:
        p.grad = torch.randn(n, generator=g) * 1e-2
    return params


def fresh(path):
    shutil.rmtree(path, ignore_errors=True)
    return path


def bench_adamw_host(args):
    mine = make_params(args.params, 8, 0)
    ref = make_params(args.params, 8, 0)
    s_opt = strata.AdamW(mine, lr=1e-3)
    t_opt = torch.optim.AdamW(ref, lr=1e-3, foreach=True)
    s_opt.step(), t_opt.step()  # warm-up: moments allocated on both sides
    s_times, t_times = [], []
    for r in range(args.rounds):
        pair = [("s", s_opt), ("t", t_opt)] if r % 2 == 0 else [("t", t_opt), ("s", s_opt)]
        for side, opt in pair:
            (s_times if side == "s" else t_times).append(timed(opt.step))
    assert all(torch.equal(a, b) for a, b in zip(mine, ref)), "strata and torch diverged"
    s, t = statistics.median(s_times), statistics.median(t_times)
    print(f"adamw-host: {args.params / 1e6:.0f} M params, threads {torch.get_num_threads()}: "
          f"strata.AdamW {s * 1e3:.1f} ms, torch AdamW(foreach) {t * 1e3:.1f} ms, "
          f"ratio {t / s:.2f}x (medians of {args.rounds}, bit-identical after {args.rounds + 1} steps)")


def bench_adamw_nvme(args):
    chunk = 1 << 22
    mine = make_params(args.params, 8, 0)
    s_opt = strata.AdamW(mine, lr=1e-3, offload="nvme", path=fresh(os.path.join(args.dir, "opt")),
                         chunk_elements=chunk)
    s_opt.step()  # first step: moments are zero and only written
    floor_store = strata.Store.create(fresh(os.path.join(args.dir, "floor")), 4 * 8 * args.params + (64 << 20))
    moment_chunks = (2 * args.params + chunk - 1) // chunk
    buf = strata.store.empty_aligned((chunk,))
    buf.normal_()

    def io_floor():  # write and read the moments' bytes once, a chunk at a time, pipelined
        tickets = [floor_store.put_async(f"c{i}", buf) for i in range(moment_chunks)]
        for t in tickets:
            floor_store.wait(t)
        outs = [strata.store.empty_aligned((chunk,)) for _ in range(4)]
        pending = []
        for i in range(moment_chunks):
            if len(pending) == 4:
                floor_store.wait(pending.pop(0))
            pending.append(floor_store.get_async(f"c{i}", outs[i % 4]))
        for t in pending:
            floor_store.wait(t)

    io_floor()
    s_times, f_times = [], []
    for r in range(args.rounds):
        order = [(s_times, s_opt.step), (f_times, io_floor)]
        if r % 2:
            order.reverse()
        for sink, fn in order:
            sink.append(timed(fn))
    s, f = statistics.median(s_times), statistics.median(f_times)
    gb = 16 * args.params / 1e9
    print(f"adamw-nvme: {args.params / 1e6:.0f} M params, {gb:.2f} GB moved per step: "
          f"strata.AdamW(nvme) {s:.3f} s, I/O floor {f:.3f} s ({gb / f:.2f} GB/s), "
          f"step / floor {s / f:.2f} (medians of {args.rounds})")
    floor_store.close()


def make_stack(width, depth):
    torch.manual_seed(0)
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
    return torch.nn.Sequential(*layers)


def vm_kib(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def bench_offload(args):
    width, depth, batch = args.width, args.depth, 32
    x = torch.randn(batch, width)
    y = torch.randn(batch, width)
    resident = make_stack(width, depth)
    wrapped = make_stack(width, depth)
    weight_bytes = sum(p.numel() * 4 for p in wrapped.parameters())
    layer_bytes = (width * width + width) * 4
    budget = 3 * layer_bytes
    handle = strata.offload(wrapped, path=fresh(os.path.join(args.dir, "params")), host_memory=budget)
    w_opt = strata.AdamW(wrapped.parameters(), lr=1e-4, offload="nvme",
                         path=fresh(os.path.join(args.dir, "params_opt")))
    # Peak RSS of offloaded training alone: the resident reference's weights are parked in a
    # store meanwhile, the peak counter reset (clear_refs 5) once the wrapped model is set up.
    parked = strata.Store.create(fresh(os.path.join(args.dir, "parked")), 2 * weight_bytes + (64 << 20))
    for i, p in enumerate(resident.parameters()):
        parked.put(f"p{i}", p.data)
        p.data = torch.empty(0)
    rss_before = vm_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")

    def wrapped_step():
        w_opt.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(wrapped(x), y).backward()
        w_opt.step()

    for _ in range(2):  # the first pass records the order
        wrapped_step()
    rss_growth = vm_kib("VmHWM") - rss_before
    for i, p in enumerate(resident.parameters()):
        p.data = parked.get(f"p{i}")
    parked.close()
    r_opt = strata.AdamW(resident.parameters(), lr=1e-4)

    def step(model, opt):
        def run():
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        return run

    for _ in range(2):  # the same two steps on the resident reference: same weights after
        step(resident, r_opt)()
    w_times, r_times, fetched, written = [], [], [], []
    for r in range(args.rounds):
        before, before_w = handle.fetched_bytes, handle.written_bytes
        order = [(w_times, step(wrapped, w_opt)), (r_times, step(resident, r_opt))]
        if r % 2:
            order.reverse()
        for sink, fn in order:
            sink.append(timed(fn))
        fetched.append(handle.fetched_bytes - before)
        written.append(handle.written_bytes - before_w)
    # The I/O floor of one offloaded step: the same store reading the parameter bytes the step
    # fetched plus the moments (8 B per parameter), and writing the updated parameters plus the
    # moments (8 B per parameter), in layer-sized tensors, two in flight, reads then writes.
    floor_dir = fresh(os.path.join(args.dir, "offload_floor"))
    fs = strata.Store.create(floor_dir, 2 * layer_bytes * depth + (64 << 20))
    w = strata.store.empty_aligned((width * width + width,))
    w.normal_()
    for i in range(depth):
        fs.put(f"l{i}", w)
    moment_bytes = 2 * weight_bytes
    reads = max(1, round((statistics.median(fetched) + moment_bytes) / layer_bytes))
    writes = max(1, round((statistics.median(written) + moment_bytes) / layer_bytes))
    outs = [strata.store.empty_aligned(w.shape) for _ in range(2)]

    def floor():
        pending = []
        for i in range(reads):
            if len(pending) == 2:
                fs.wait(pending.pop(0))
            pending.append(fs.get_async(f"l{i % depth}", outs[i % 2]))
        for t in pending:
            fs.wait(t)
        pending = []
        for i in range(writes):
            if len(pending) == 2:
                fs.wait(pending.pop(0))
            pending.append(fs.put_async(f"l{i % depth}", w))
        for t in pending:
            fs.wait(t)

    floor()
    f = statistics.median([timed(floor) for _ in range(args.rounds)])
    wm, rm = statistics.median(w_times), statistics.median(r_times)
    same = all(torch.equal(a, b) for a, b in zip(wrapped.state_dict().values(), resident.state_dict().values()))
    print(f"offload: {depth} x Linear({width}) = {weight_bytes / 1e6:.0f} MB of weights, host budget "
          f"{budget / 1e6:.1f} MB ({weight_bytes / budget:.0f}x smaller): step {wm * 1e3:.0f} ms offloaded "
          f"vs {rm * 1e3:.0f} ms resident ({wm / rm:.2f}x), I/O floor {f * 1e3:.0f} ms for "
          f"the step's {(reads + writes) * layer_bytes / 1e6:.0f} MB (params {statistics.median(fetched) / 1e6:.0f} MB "
          f"read, {statistics.median(written) / 1e6:.0f} MB written; moments {moment_bytes / 1e6:.0f} MB each way) (step / floor "
          f"{wm / f:.2f}); peak resident params {handle.peak_resident_bytes / 1e6:.1f} MB "
          f"(budget {budget / 1e6:.1f} MB); peak RSS growth while training offloaded "
          f"{rss_growth / 1e6:.0f} MB = resident params + the full fp32 gradients "
          f"({weight_bytes / 1e6:.0f} MB, not offloaded) + activations + optimizer chunks; "
          f"weights equal to the resident model's: {same}")
    fs.close()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", required=True, help="scratch directory on the drive to measure")
    parser.add_argument("--params", type=int, default=100_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--depth", type=int, default=24)
    parser.add_argument("--torch-threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    parser.add_argument("which", nargs="*", default=["adamw-host", "adamw-nvme", "offload"])
    args = parser.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs, "
          f"torch {torch.__version__}, strata {strata.__version__}")
    for which in args.which:
        {"adamw-host": bench_adamw_host, "adamw-nvme": bench_adamw_nvme, "offload": bench_offload}[which](args)


if __name__ == "__main__":
    main()
