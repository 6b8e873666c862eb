#!/usr/bin/python3
# bench/kahan_master.py — issue 32's last question: can the fp32 master weights (4 of AdamW's
# bytes per parameter) be bf16 with compensated (Kahan) summation and keep the loss curve within
# 1 % of the fp32 master's? A PyTorch experiment on the demo (configs/demo.yaml: GPT-2 6 × 192,
# vocab 256, 64 tokens, batch 8, lr 1e-3, betas 0.9/0.95, weight decay 0.1 on 2-D tensors,
# clipping at 1.0, 300 steps on the GPL-3 text, strata's batch order) with strata's bf16 compute
# copy (the forward sees the master rounded to bf16) and fp32 moments in every variant, so only
# the master's precision differs:
#   fp32   the master in fp32 (strata today)
#   bf16   the master itself in bf16, each update rounded to nearest into it
#   kahan  the master in bf16 plus a bf16 compensation buffer (Kahan): y = Δ − c; t = p + y
#          rounded to bf16; c = (t − p) − y rounded to bf16; p = t — 4 bytes like fp32, but
#          the two halves are what a fused 8-bit step could keep as 2 + 2 bytes
# (FlashOptim's 16 → 7 bytes per parameter for AdamW keeps the master this way.)
# Prints each variant's loss every 25 steps, the mean of the last 50 steps and the mean and
# worst relative difference from fp32 over the last 200 steps (the first 100 are the steep part).
#
# Usage: bench/kahan_master.py [--steps 300] [--seed 1]
import argparse
import math
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "gpt2"))
import gpt2_reference  # noqa: E402

N_LAYER, N_HEAD, C, VOCAB, T, B = 6, 6, 192, 256, 64, 8
LR, BETAS, EPS, WD, CLIP = 1.0e-3, (0.9, 0.95), 1.0e-8, 0.1, 1.0


def bf16(x):
    return x.to(torch.bfloat16).to(torch.float32)


def init(seed):
    g = torch.Generator().manual_seed(seed)
    p = {"wte.weight": torch.randn(VOCAB, C, generator=g) * 0.02, "wpe.weight": torch.randn(T, C, generator=g) * 0.02,
         "ln_f.weight": torch.ones(C), "ln_f.bias": torch.zeros(C)}
    for i in range(N_LAYER):
        h = f"h.{i}."
        resid = 0.02 / math.sqrt(2 * N_LAYER)
        p.update({h + "ln_1.weight": torch.ones(C), h + "ln_1.bias": torch.zeros(C),
                  h + "attn.c_attn.weight": torch.randn(C, 3 * C, generator=g) * 0.02, h + "attn.c_attn.bias": torch.zeros(3 * C),
                  h + "attn.c_proj.weight": torch.randn(C, C, generator=g) * resid, h + "attn.c_proj.bias": torch.zeros(C),
                  h + "ln_2.weight": torch.ones(C), h + "ln_2.bias": torch.zeros(C),
                  h + "mlp.c_fc.weight": torch.randn(C, 4 * C, generator=g) * 0.02, h + "mlp.c_fc.bias": torch.zeros(4 * C),
                  h + "mlp.c_proj.weight": torch.randn(4 * C, C, generator=g) * resid, h + "mlp.c_proj.bias": torch.zeros(C)})
    return p


def batch(data, step):
    windows = len(data) - T - 1
    starts = [((step * B + b) * T) % windows for b in range(B)]
    x = torch.tensor([data[s:s + T] for s in starts])
    y = torch.tensor([data[s + 1:s + T + 1] for s in starts])
    return x, y


def loss_of(w, x, y):
    h = w["wte.weight"][x] + w["wpe.weight"][torch.arange(T)]
    for i in range(N_LAYER):
        h = gpt2_reference.block(w, i, h, N_HEAD)
    h = torch.nn.functional.layer_norm(h, (C,), w["ln_f.weight"], w["ln_f.bias"], eps=1e-5)
    return torch.nn.functional.cross_entropy(torch.matmul(h, w["wte.weight"].t()).reshape(-1, VOCAB), y.reshape(-1))


def train(variant, data, steps, seed):
    master = init(seed)
    if variant != "fp32":
        master = {k: bf16(v) for k, v in master.items()}
    comp = {k: torch.zeros_like(v) for k, v in master.items()}
    m = {k: torch.zeros_like(v) for k, v in master.items()}
    v2 = {k: torch.zeros_like(v) for k, v in master.items()}
    losses = []
    for step in range(steps):
        w = {k: bf16(p).requires_grad_(True) for k, p in master.items()}  # the bf16 compute copy
        x, y = batch(data, step)
        loss = loss_of(w, x, y)
        loss.backward()
        losses.append(loss.item())
        grads = {k: t.grad for k, t in w.items()}
        norm = math.sqrt(sum(float((g.double() ** 2).sum()) for g in grads.values()))
        scale = min(1.0, CLIP / (norm + 1e-6))
        t = step + 1
        with torch.no_grad():
            for k, p in master.items():
                g = grads[k] * scale
                m[k].mul_(BETAS[0]).add_(g, alpha=1 - BETAS[0])
                v2[k].mul_(BETAS[1]).addcmul_(g, g, value=1 - BETAS[1])
                denom = v2[k].sqrt() / math.sqrt(1 - BETAS[1] ** t) + EPS
                delta = -(LR / (1 - BETAS[0] ** t)) * m[k] / denom
                if p.dim() == 2:
                    delta = delta - LR * WD * p  # decoupled decay, before the update (torch's order)
                if variant == "fp32":
                    p.add_(delta)
                elif variant == "bf16":
                    p.copy_(bf16(p + delta))
                else:  # Kahan: the compensation carries what bf16 rounding dropped
                    y_ = delta - comp[k]
                    t_ = bf16(p + y_)
                    comp[k].copy_(bf16((t_ - p) - y_))
                    p.copy_(t_)
    return losses


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(2)
    with open("/usr/share/common-licenses/GPL-3", "rb") as f:
        data = list(f.read())
    runs = {name: train(name, data, args.steps, args.seed) for name in ("fp32", "bf16", "kahan")}
    for step in range(0, args.steps, 25):
        print(f"step {step + 1:>4}: " + "  ".join(f"{n} {runs[n][step]:.4f}" for n in runs))
    ref = runs["fp32"]
    tail = range(max(0, args.steps - 200), args.steps)
    for name, losses in runs.items():
        rel = [abs(losses[i] - ref[i]) / ref[i] for i in tail]
        last50 = sum(losses[-50:]) / 50
        print(f"{name:>5}: mean of the last 50 steps {last50:.4f} ({100 * (last50 / (sum(ref[-50:]) / 50) - 1):+.2f} % "
              f"vs fp32); over the last {len(tail)} steps |Δ|/fp32 mean {100 * sum(rel) / len(rel):.2f} %, "
              f"worst {100 * max(rel):.2f} %")


if __name__ == "__main__":
    main()
