# Proves at the CLI (issue 12): mutated inputs — bit flips, truncations and wrong JSON/YAML
# types in a config, a safetensors init file, a store manifest and a tokens-u16 data file —
# given to `strata train`, `strata store verify` and `strata store inspect` end with exit 0
# (the mutation left the input valid), or 1 or 2 and exactly one line; never a signal, a hang
# (each run has a timeout) or a write outside the store (every file outside the store folder
# and its data file is hashed before and after each run).
#
# How: one tiny run is trained first, then a seeded RNG makes a bounded number of mutants of
# each input (about 45 runs in all). Usage: test_mutated_inputs.py STRATA_BINARY
import hashlib
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_train import STRATA, config, fail, strata  # noqa: E402  (argv[1] is the binary)

RUN_TIMEOUT_S = 120  # a sanitized binary is slow; a hang is far longer


def snapshot(folder, skip):
    """Hash of every file under folder except those under a path in skip."""
    seen = {}
    for root, dirs, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            if any(path == s or path.startswith(s + os.sep) for s in skip):
                continue
            with open(path, "rb") as f:
                seen[path] = hashlib.sha256(f.read()).hexdigest()
    return seen


def run_checked(what, args, folder, store_paths):
    before = snapshot(folder, store_paths)
    try:
        result = subprocess.run([STRATA, "--log-level", "warn", *args], capture_output=True, text=True,
                                timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        fail(f"{what}: strata {' '.join(args)} did not end within {RUN_TIMEOUT_S} s (a hang)")
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    if result.returncode < 0:
        fail(f"{what}: killed by signal {-result.returncode}:\n{result.stderr[-3000:]}")
    if result.returncode not in (0, 1, 2):
        fail(f"{what}: exit {result.returncode} (expected 0, 1 or 2):\n{result.stderr[-3000:]}")
    if result.returncode != 0 and len(lines) != 1:
        fail(f"{what}: exit {result.returncode} with {len(lines)} lines, expected one:\n{result.stderr[-3000:]}")
    after = snapshot(folder, store_paths)
    if after != before:
        changed = sorted(set(before.items()) ^ set(after.items()))
        fail(f"{what}: files outside the store changed: {changed[:5]}")
    return result.returncode, (lines[0] if lines else "")


def mutate_bytes(rng, data):
    kind = rng.choice(["flip", "flip", "truncate", "zero"])
    data = bytearray(data)
    if kind == "truncate" or not data:
        return bytes(data[:rng.randrange(len(data) + 1)]), "truncated"
    at = rng.randrange(len(data))
    if kind == "zero":
        data[at] = 0
        return bytes(data), f"zeroed byte {at}"
    data[at] ^= 1 << rng.randrange(8)
    return bytes(data), f"flipped a bit of byte {at}"


def retype(rng, value):
    """The same document with one scalar replaced by a value of another type."""
    paths = []

    def walk(node, path):
        if isinstance(node, dict):
            for key, child in node.items():
                walk(child, path + [key])
        elif isinstance(node, list):
            for index, child in enumerate(node):
                walk(child, path + [index])
        else:
            paths.append(path)
    walk(value, [])
    path = rng.choice(paths)
    parent = value
    for key in path[:-1]:
        parent = parent[key]
    replacement = rng.choice([[], {}, "x", -1, 1.5e300, None, True, 2 ** 64, -(2 ** 63)])
    parent[path[-1]] = replacement
    return value, f"{'.'.join(map(str, path))} := {json.dumps(replacement)}"


def main():
    rng = random.Random(12)
    counts = {}
    with tempfile.TemporaryDirectory(dir=os.environ.get("STRATA_TEST_TMPDIR")) as folder:
        os.makedirs(folder, exist_ok=True)
        tokens = os.path.join(folder, "tokens.u16")
        with open(tokens, "wb") as f:
            f.write(struct.pack("<4000H", *[rng.randrange(256) for _ in range(4000)]))
        cfg_path, cfg = config(folder, steps=2, data={"path": tokens, "format": "tokens-u16"},
                               model={"n_layer": 1, "n_head": 2, "n_embd": 32, "seq_len": 8})
        strata("--log-level", "warn", "train", cfg_path)
        nvme = cfg["nvme"]["paths"][0]
        store = os.path.join(nvme, "store")
        data_file = os.path.join(nvme, "strata.data")
        store_paths = [store, data_file]
        init = os.path.join(folder, "init.safetensors")
        strata("--log-level", "warn", "store", "export", store, init)
        pristine_manifest = open(os.path.join(store, "manifest.json"), "rb").read()
        pristine_data = open(data_file, "rb").read()

        def restore_store():
            with open(os.path.join(store, "manifest.json"), "wb") as f:
                f.write(pristine_manifest)
            with open(data_file, "wb") as f:
                f.write(pristine_data)
            for name in os.listdir(store):
                if name != "manifest.json":
                    os.remove(os.path.join(store, name))

        def record(what, code, line):
            counts[code] = counts.get(code, 0) + 1
            print(f"{what}: exit {code}: {line[:160]}")

        # 1. The config: raw byte mutants and wrong types, given to `strata train` (which resumes
        #    the trained store and has no step left to do when the mutant is still valid).
        text = open(cfg_path, "rb").read()
        for i in range(14):
            if i % 2 == 0:
                mutant, how = mutate_bytes(rng, text)
            else:
                value, how = retype(rng, json.loads(text))
                mutant = json.dumps(value).encode()
            path = os.path.join(folder, f"mutant-{i}.yaml")
            with open(path, "wb") as f:
                f.write(mutant)
            record(f"config ({how})", *run_checked(f"config ({how})", ["train", path, "--resume"], folder, store_paths))
            os.remove(path)
            restore_store()

        # 2. The safetensors init file: header bytes flipped, truncated, wrong types; a fresh NVMe
        #    folder each time (what the init seeds), with `steps: 1`.
        raw = open(init, "rb").read()
        (header_bytes,) = struct.unpack("<Q", raw[:8])
        header = json.loads(raw[8:8 + header_bytes])
        for i in range(10):
            if i % 3 == 2:
                value, how = retype(rng, json.loads(json.dumps(header)))
                text_h = json.dumps(value).encode()
                mutant = struct.pack("<Q", len(text_h)) + text_h + raw[8 + header_bytes:]
            else:
                head, how = mutate_bytes(rng, raw[:8 + header_bytes])
                mutant = head + raw[8 + header_bytes:] if len(head) == 8 + header_bytes else head
            path = os.path.join(folder, "mutant.safetensors")
            with open(path, "wb") as f:
                f.write(mutant)
            fresh = os.path.join(folder, f"nvme-init-{i}")
            os.makedirs(fresh)
            mutant_cfg = dict(cfg, model={**cfg["model"], "init": path}, nvme={"paths": [fresh]}, steps=1)
            mutant_cfg_path = os.path.join(folder, "init-mutant.yaml")
            with open(mutant_cfg_path, "w") as f:
                json.dump(mutant_cfg, f)
            skip = store_paths + [fresh]
            record(f"init ({how})", *run_checked(f"init ({how})", ["train", mutant_cfg_path], folder, skip))
            shutil.rmtree(fresh)

        # 3. The store manifest: byte mutants and wrong types, to verify, inspect and train.
        manifest = json.loads(pristine_manifest)
        for i in range(15):
            if i % 2 == 0:
                mutant, how = mutate_bytes(rng, pristine_manifest)
            else:
                value, how = retype(rng, json.loads(json.dumps(manifest)))
                mutant = json.dumps(value).encode()
            command = [["store", "verify", store], ["store", "inspect", store], ["train", cfg_path, "--resume"]][i % 3]
            with open(os.path.join(store, "manifest.json"), "wb") as f:
                f.write(mutant)
            what = f"manifest ({how}) → {command[0]} {command[1]}"
            record(what, *run_checked(what, command, folder, store_paths))
            restore_store()
        # The data file a manifest names, pointed outside the store: refused by a writable open.
        evil = dict(manifest, files=[os.path.join(folder, "evil.strata")])
        with open(os.path.join(folder, "evil.strata"), "wb") as f:
            f.write(pristine_data)
        with open(os.path.join(store, "manifest.json"), "w") as f:
            json.dump(evil, f)
        code, line = run_checked("manifest naming a file outside the store", ["train", cfg_path, "--resume"], folder, store_paths)
        record("manifest naming a file outside the store", code, line)
        if code == 0 or "outside the store folder" not in line:
            fail(f"a manifest naming {evil['files'][0]} was not refused: exit {code}: {line}")
        restore_store()

        # Metadata the trainer reads back as numbers (model shape, chunk size): not numbers, or
        # a shape no config could give (n_head 0 divided the layout by zero; "x" made std::stoul
        # throw through main). Export and resume refuse them with one line.
        for key, bad in [("model.n_head", "0"), ("model.n_layer", "x"), ("model.n_embd", "99999999999999999999"),
                         ("optim_chunk_elements", "-5")]:
            tampered = json.loads(json.dumps(manifest))
            tampered["metadata"][key] = bad
            with open(os.path.join(store, "manifest.json"), "w") as f:
                json.dump(tampered, f)
            for command in (["store", "export", store, os.path.join(folder, "export-out.safetensors")],
                            ["train", cfg_path, "--resume"]):
                what = f"metadata {key} = {bad!r} → {command[0]} {command[1]}"
                code, line = run_checked(what, command, folder, store_paths + [os.path.join(folder, "export-out.safetensors")])
                record(what, code, line)
                if code == 0 or key not in line:
                    fail(f"{what}: expected a refusal naming {key}, got exit {code}: {line}")
            restore_store()

        # 4. The data file (tokens-u16): flipped bits make tokens outside the vocabulary; a
        #    truncation makes it too short or odd-sized.
        pristine_tokens = open(tokens, "rb").read()
        for i in range(6):
            mutant, how = mutate_bytes(rng, pristine_tokens)
            with open(tokens, "wb") as f:
                f.write(mutant)
            record(f"data ({how})", *run_checked(f"data ({how})", ["train", cfg_path, "--resume"], folder,
                                                 store_paths + [tokens]))
            restore_store()
        with open(tokens, "wb") as f:
            f.write(pristine_tokens)

        # `strata store verify` given the NVMe folder (the store is one level down) verifies it.
        code, line = run_checked("verify given the NVMe folder", ["store", "verify", nvme], folder, store_paths)
        if code != 0:
            fail(f"`strata store verify {nvme}` (the store is in {store}) exited {code}: {line}")
    print(f"exit codes over all mutants: {dict(sorted(counts.items()))}")
    if counts.get(1, 0) + counts.get(2, 0) == 0:
        fail("no mutant was refused: the mutations are not reaching the parsers")


if __name__ == "__main__":
    main()
