#!/usr/bin/python3
"""strata's CPU AdamW against torch.optim.AdamW(foreach=True) on the same number of fp32
parameters and the same thread count, measured alternately in one run.

Each round runs `strata bench adam --json` (AdamW over N params writing the bf16 copy in the
same pass; its own medians, its own data check) and then times torch's step on one N-element
parameter, both without and with the bf16 copy torch needs to match (`copy_` into a bf16 tensor
allocated once). Rounds alternate which side goes first. Reports medians over rounds and the
ratios. Run with Debian's torch: /usr/bin/python3 bench/adam_vs_torch.py --strata build/strata
"""
import argparse
import json
import statistics
import subprocess
import sys
import time

import torch


def run_strata(args):
    command = [args.strata, "bench", "adam", "--params", str(args.params), "--threads",
               str(args.threads), "--repeats", str(args.strata_repeats), "--json"]
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    result = json.loads(done.stdout)
    # strata checks a sample of every pass against its scalar reference and fails otherwise.
    assert result["checked_elements_per_pass"] > 0 and result["copy"] == "bf16"
    return result


class TorchSide:
    def __init__(self, params, threads):
        torch.set_num_threads(threads)
        generator = torch.Generator().manual_seed(0)
        self.param = torch.nn.Parameter(torch.rand(params, generator=generator) * 2 - 1)
        self.param.grad = (torch.rand(params, generator=generator) * 2 - 1) * 0.01
        # torch's defaults, the same hyper-parameters strata's bench uses.
        self.optimizer = torch.optim.AdamW([self.param], lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                                           weight_decay=0.01, foreach=True)
        self.copy = torch.empty(params, dtype=torch.bfloat16)
        self.optimizer.step()  # creates exp_avg / exp_avg_sq (first touch), untimed
        self.copy.copy_(self.param.detach())

    def time_step(self, with_copy):
        start = time.perf_counter()
        self.optimizer.step()
        if with_copy:
            self.copy.copy_(self.param.detach())
        return time.perf_counter() - start

    def check(self):
        # After the timed window: the state is finite and the copy is the rounded params.
        state = self.optimizer.state[self.param]
        assert torch.isfinite(self.param).all() and torch.isfinite(state["exp_avg_sq"]).all()
        assert torch.equal(self.copy, self.param.detach().to(torch.bfloat16))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strata", default="build/strata", help="path to the strata binary")
    parser.add_argument("--params", type=int, default=200_000_000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--strata-repeats", type=int, default=3,
                        help="timed AdamW passes per strata run (its median is one sample)")
    parser.add_argument("--torch-repeats", type=int, default=3,
                        help="timed torch steps per round, each way (their median is one sample)")
    args = parser.parse_args()

    torch_side = TorchSide(args.params, args.threads)
    strata_s, stream_s, torch_s, torch_copy_s = [], [], [], []
    for round_index in range(args.rounds):
        def strata_round():
            result = run_strata(args)
            strata_s.append(result["adamw"]["median_s"])
            stream_s.append(result["stream"]["median_s"])

        def torch_round():
            torch_s.append(statistics.median(torch_side.time_step(False) for _ in range(args.torch_repeats)))
            torch_copy_s.append(statistics.median(torch_side.time_step(True) for _ in range(args.torch_repeats)))

        for side in ((strata_round, torch_round) if round_index % 2 == 0 else (torch_round, strata_round)):
            side()
        print(f"round {round_index + 1}: strata {strata_s[-1]:.3f} s, stream {stream_s[-1]:.3f} s, "
              f"torch {torch_s[-1]:.3f} s, torch+copy {torch_copy_s[-1]:.3f} s", file=sys.stderr)
    torch_side.check()

    strata_median = statistics.median(strata_s)
    torch_median = statistics.median(torch_s)
    torch_copy_median = statistics.median(torch_copy_s)
    summary = {
        "params": args.params,
        "threads": args.threads,
        "rounds": args.rounds,
        "torch_version": torch.__version__,
        "strata_adamw_with_bf16_copy_median_s": strata_median,
        "strata_stream_pass_median_s": statistics.median(stream_s),
        "torch_adamw_foreach_median_s": torch_median,
        "torch_adamw_foreach_plus_bf16_copy_median_s": torch_copy_median,
        "speedup_vs_torch_without_copy": torch_median / strata_median,
        "speedup_vs_torch_with_copy": torch_copy_median / strata_median,
        "samples_s": {"strata": strata_s, "stream": stream_s, "torch": torch_s, "torch_copy": torch_copy_s},
    }
    print(json.dumps(summary, indent=1))
    print(f"strata AdamW+bf16 copy {strata_median:.3f} s | torch foreach AdamW {torch_median:.3f} s "
          f"({summary['speedup_vs_torch_without_copy']:.2f}x) | torch + bf16 copy {torch_copy_median:.3f} s "
          f"({summary['speedup_vs_torch_with_copy']:.2f}x)", file=sys.stderr)


if __name__ == "__main__":
    main()
