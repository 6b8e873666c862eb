#!/usr/bin/python3
# tests/engine/train_reference.py — an independent PyTorch run of `strata train`'s recipe, for
# test_train.py's "right numbers" check: the same GPT-2 (plain torch, fp32, weights loaded from
# the safetensors strata exported at step 0), the same batch order, torch.optim.AdamW with
# weight decay on 2-D tensors only and clip_grad_norm_ before each update. Prints the loss of
# every step and writes the final weights as raw float32 files.
# With `adamw8bit BLOCK MIN_8BIT EMBEDDING_STATE` after the usual arguments, tensors of at least
# MIN_8BIT elements (but wte when EMBEDDING_STATE is fp32) take the 8-bit block-wise AdamW of
# tests/optim/adamw8bit_reference.py (a torch reimplementation of kernels/optim/adamw8bit.h's
# contract, each tensor its own blocks as bitsandbytes quantises them); the others keep
# torch.optim.AdamW.
#
# Usage: train_reference.py INIT.safetensors DATA OUT_DIR n_head batch seq steps lr beta1 beta2 eps wd clip
#                           [adamw8bit BLOCK MIN_8BIT fp32|8bit]
import os
import sys

try:
    import torch
except ImportError as error:
    print(f"SKIP: PyTorch is not importable by {sys.executable} ({error}); install Debian's python3-torch",
          file=sys.stderr)
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "gpt2"))
import gpt2_reference  # noqa: E402  (the block and attention of the kernels' own reference)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from safetensors_file import read_entries  # noqa: E402


def read_safetensors(path):
    tensors = {}
    for name, (entry, raw) in read_entries(path)[0].items():
        assert entry["dtype"] == "F32", name
        raw = bytearray(raw)
        name = name[len("transformer."):] if name.startswith("transformer.") else name
        tensors[name] = torch.frombuffer(raw, dtype=torch.float32).view(entry["shape"]).clone()
    return tensors


def main():
    init_path, data_path, out_dir = sys.argv[1:4]
    n_head, batch, seq, steps = (int(v) for v in sys.argv[4:8])
    lr, beta1, beta2, eps, wd, clip = (float(v) for v in sys.argv[8:14])
    eight_bit = len(sys.argv) > 14 and sys.argv[14] == "adamw8bit"
    torch.set_num_threads(2)
    params = {name: t.requires_grad_(True) for name, t in read_safetensors(init_path).items()}
    quantised = {}  # name -> the 8-bit state of adamw8bit_reference.reference_step
    if eight_bit:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "optim"))
        import adamw8bit_reference as ref8  # noqa: E402
        block, min_8bit, embedding_state = int(sys.argv[15]), int(sys.argv[16]), sys.argv[17]
        tables = ref8.Tables()
        for name, p in params.items():
            if p.numel() < min_8bit or (name == "wte.weight" and embedding_state == "fp32"):
                continue
            blocks = (p.numel() + block - 1) // block
            quantised[name] = {"p": p.detach().clone().reshape(-1),
                               "cm": torch.full((p.numel(),), 127, dtype=torch.uint8),
                               "cv": torch.zeros(p.numel(), dtype=torch.uint8),
                               "am": torch.zeros(blocks), "av": torch.zeros(blocks)}
    n_layer = 1 + max(int(name.split(".")[1]) for name in params if name.startswith("h."))
    vocab, n_embd = params["wte.weight"].shape
    with open(data_path, "rb") as f:
        tokens_all = torch.tensor(list(f.read()), dtype=torch.long)
    window_count = tokens_all.numel() - seq - 1

    decay = [p for name, p in params.items() if p.dim() == 2 and name not in quantised]
    no_decay = [p for name, p in params.items() if p.dim() != 2 and name not in quantised]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": wd},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=lr, betas=(beta1, beta2), eps=eps)
    for step in range(steps):
        rows = []
        for b in range(batch):
            start = ((step * batch + b) * seq) % window_count
            rows.append(tokens_all[start:start + seq + 1])
        window = torch.stack(rows)
        inputs, targets = window[:, :-1], window[:, 1:]
        x = params["wte.weight"][inputs] + params["wpe.weight"][torch.arange(seq)]
        for i in range(n_layer):
            x = gpt2_reference.block(params, i, x, n_head)
        x = torch.nn.functional.layer_norm(x, (n_embd,), params["ln_f.weight"], params["ln_f.bias"], eps=1e-5)
        logits = torch.matmul(x, params["wte.weight"].t())
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))
        optimizer.zero_grad()
        for name in quantised:  # not in the torch optimizer, so zero_grad does not reach them
            params[name].grad = None
        loss.backward()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(list(params.values()), clip)
        optimizer.step()
        with torch.no_grad():
            for name, state in quantised.items():
                p = params[name]
                ref8.reference_step(tables, state, p.grad.reshape(-1), step + 1,
                                    (lr, beta1, beta2, eps, wd if p.dim() == 2 else 0.0), block, 1.0)
                p.copy_(state["p"].view(p.shape))
        print(f"loss {step + 1} {loss.item():.9g}")
    os.makedirs(out_dir, exist_ok=True)
    for name, tensor in params.items():
        with open(os.path.join(out_dir, name + ".f32"), "wb") as f:
            f.write(tensor.detach().contiguous().numpy().tobytes())


if __name__ == "__main__":
    main()
