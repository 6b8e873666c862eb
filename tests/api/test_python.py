"""tests/api/test_python.py — the Python package on libstrata, against Debian's torch 1.13:
strata.AdamW (host and nvme state) gives exactly torch.optim.AdamW's fp32 bits; state_dict /
load_state_dict round-trip; commit + resume continues exactly; strata.offload trains a model
to the same bits as plain PyTorch while its parameters live in the store under a budget
smaller than the model (its fetches trusted once seen intact: verify_reads="once"); a store's
verify_reads policy trusts what the handle wrote and checks what it opened; errors arrive as
StrataError with the C API's message. strata.AdamW(state_bits=8) against an independent PyTorch
implementation of bitsandbytes' block-wise 8-bit AdamW (tests/optim/adamw8bit_reference.py, the
one `strata train`'s kernel is checked against): the same bits over 6 steps, host and nvme;
state_dict's dequantised moments; a bit-identical resume; bad arguments refused.

Run by Meson with STRATA_LIBRARY (the built libstrata.so) and PYTHONPATH (python/).
"""
import atexit
import os
import shutil
import sys
import tempfile
import unittest

import torch

import strata

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "optim"))
import adamw8bit_reference as bnb_ref  # noqa: E402  (the reference lives beside the kernel tests)

torch.manual_seed(0)
TMP = os.environ.get("STRATA_TEST_TMPDIR", tempfile.gettempdir())


def tmpdir(name):
    path = os.path.join(TMP, f"py_{name}_{os.getpid()}")
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(TMP, exist_ok=True)
    atexit.register(shutil.rmtree, path, True)  # stores are preallocated: leave no disk behind
    return path


def make_model(depth=1):
    torch.manual_seed(1)
    layers = [torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.LayerNorm(64)]
    for _ in range(depth):
        layers += [torch.nn.Linear(64, 64), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(64, 8))


def batches(count):
    g = torch.Generator().manual_seed(2)
    return [(torch.randn(16, 32, generator=g), torch.randn(16, 8, generator=g)) for _ in range(count)]


def train(model, opt, data):
    for x, y in data:
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()


def same_bits(a, b):
    return all(torch.equal(a[k].view(-1).view(torch.int32), b[k].view(-1).view(torch.int32)) for k in a)


class Package(unittest.TestCase):
    def test_version(self):
        self.assertEqual(strata.__version__, "0.1.0")

    def test_error_carries_c_message(self):
        with self.assertRaises(strata.StrataError) as ctx:
            strata.Store("/nonexistent/strata-py-store")
        self.assertEqual(ctx.exception.status, "not_found")
        self.assertIn("/nonexistent/strata-py-store", str(ctx.exception))

    def test_store_round_trip(self):
        path = tmpdir("store")
        with strata.Store.create(path, 16 << 20) as store:
            t = torch.randn(3, 5)
            store.put("t", t)
            store.commit(1)
        with strata.Store(path) as store:
            self.assertEqual(store.names(), ["t"])
            self.assertTrue(torch.equal(store.get("t"), t))
            store.verify()
            with self.assertRaises(strata.StrataError):
                store.get("missing")


def flip_byte(store_dir, offset):
    with open(os.path.join(store_dir, "data.strata"), "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0x10]))
        f.flush()
        os.fsync(f.fileno())


class VerifyReads(unittest.TestCase):
    def test_once_trusts_what_this_handle_wrote_and_checks_what_it_opened(self):
        path = tmpdir("verify_once")
        t = torch.randn(1024)
        with strata.Store.create(path, 16 << 20, verify_reads="once") as store:
            store.put("t", t)
            store.commit(1)
            flip_byte(path, 8)  # the only tensor starts at offset 0 of the data file
            self.assertFalse(torch.equal(store.get("t"), t))  # the trade: trusted, damage unseen
        for policy in ("once", "always"):  # opened: nothing is trusted
            with strata.Store(path, verify_reads=policy) as store:
                with self.assertRaises(strata.StrataError) as ctx:
                    store.get("t")
                self.assertEqual(ctx.exception.status, "corrupt")
        with self.assertRaises(ValueError):
            strata.Store(path, verify_reads="never")

    def test_always_is_the_default(self):
        path = tmpdir("verify_always")
        with strata.Store.create(path, 16 << 20) as store:
            store.put("t", torch.randn(1024))
            flip_byte(path, 8)
            with self.assertRaises(strata.StrataError):
                store.get("t")


class AdamW(unittest.TestCase):
    def check_against_torch(self, **kwargs):
        ref, mine = make_model(), make_model()
        data = batches(6)
        train(ref, torch.optim.AdamW(ref.parameters(), lr=3e-3, weight_decay=0.05), data)
        opt = strata.AdamW(mine.parameters(), lr=3e-3, weight_decay=0.05, **kwargs)
        train(mine, opt, data)
        self.assertTrue(same_bits(ref.state_dict(), mine.state_dict()))
        return ref, mine, opt

    def test_host_bit_identical(self):
        self.check_against_torch()

    def test_nvme_bit_identical_and_state_dict(self):
        ref, mine, opt = self.check_against_torch(offload="nvme", path=tmpdir("nvme"), chunk_elements=1000)
        sd = opt.state_dict()
        self.assertEqual(len(sd["state"]), 8)
        self.assertEqual(float(sd["state"][0]["step"]), 6.0)
        torch_opt = torch.optim.AdamW(ref.parameters(), lr=3e-3, weight_decay=0.05)
        torch_opt.load_state_dict(sd)  # strata's state_dict loads into torch ...
        fresh = strata.AdamW(mine.parameters(), lr=3e-3, weight_decay=0.05)
        fresh.load_state_dict(torch_opt.state_dict())  # ... and torch's into strata
        data = batches(9)[6:]
        train(ref, torch_opt, data)
        train(mine, fresh, data)
        self.assertTrue(same_bits(ref.state_dict(), mine.state_dict()))

    def test_commit_and_resume(self):
        path = tmpdir("resume")
        ref, mine = make_model(), make_model()
        data = batches(8)
        train(ref, torch.optim.AdamW(ref.parameters(), lr=1e-2), data)
        opt = strata.AdamW(mine.parameters(), lr=1e-2, offload="nvme", path=path)
        train(mine, opt, data[:5])
        opt.commit()
        train(mine, opt, data[5:6])  # not committed: the resumed optimizer must not see it
        del opt
        mine_weights = make_model()
        train(mine_weights, torch.optim.AdamW(mine_weights.parameters(), lr=1e-2), data[:5])
        opt = strata.AdamW(mine_weights.parameters(), lr=1e-2, offload="nvme", path=path, resume=True)
        train(mine_weights, opt, data[5:])
        self.assertTrue(same_bits(ref.state_dict(), mine_weights.state_dict()))


def make_wide_model():
    """Parameters on both sides of min_8bit_size 4096: 64 x 128 and 128 x 64 weights (8-bit,
    32 blocks each), a 32 x 64 one (2048, fp32 moments), biases and a norm (fp32)."""
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 128), torch.nn.Tanh(),
                               torch.nn.LayerNorm(128), torch.nn.Linear(128, 64), torch.nn.GELU(),
                               torch.nn.Linear(64, 8))


class Reference8bit:
    """bitsandbytes' AdamW8bit as the reference module computes it for parameters of at least
    min_8bit_size elements; torch.optim.AdamW (fp32 moments) for the others."""

    def __init__(self, model, lr, betas, eps, weight_decay, block=256, min_8bit_size=4096):
        self.hp = (lr, betas[0], betas[1], eps, weight_decay)
        self.block = block
        self.tables = bnb_ref.Tables()
        self.eight = [p for p in model.parameters() if p.numel() >= min_8bit_size]
        small = [p for p in model.parameters() if p.numel() < min_8bit_size]
        self.fp32 = torch.optim.AdamW(small, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        self.state = {}
        for p in self.eight:
            n, blocks = p.numel(), (p.numel() + block - 1) // block
            self.state[p] = {"cm": torch.full((n,), 127, dtype=torch.uint8), "cv": torch.zeros(n, dtype=torch.uint8),
                             "am": torch.zeros(blocks), "av": torch.zeros(blocks)}
        self.step_count = 0

    def zero_grad(self):
        self.fp32.zero_grad()
        for p in self.eight:
            p.grad = None

    @torch.no_grad()
    def step(self):
        self.step_count += 1
        self.fp32.step()
        for p in self.eight:
            s = self.state[p]
            s["p"] = p.data.reshape(-1).clone()
            bnb_ref.reference_step(self.tables, s, p.grad.reshape(-1), self.step_count, self.hp, self.block, 1.0)
            p.data.copy_(s["p"].view(p.shape))

    def dequantised(self, p):
        s, n = self.state[p], p.numel()
        m = self.tables.m[s["cm"].long()] * s["am"].repeat_interleave(self.block)[:n]
        v = self.tables.v[s["cv"].long()] * s["av"].repeat_interleave(self.block)[:n]
        return m.view(p.shape), v.view(p.shape)


class AdamW8bit(unittest.TestCase):
    HP = dict(lr=3e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.05)

    def check_against_reference(self, steps=6, **kwargs):
        ref, mine = make_wide_model(), make_wide_model()
        data = wide_batches(steps)
        reference = Reference8bit(ref, **self.HP)
        opt = strata.AdamW(mine.parameters(), state_bits=8, **self.HP, **kwargs)
        for step, (x, y) in enumerate(data, 1):
            for model, o in ((ref, reference), (mine, opt)):
                o.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
                o.step()
            differ = {k: int((a.view(torch.int32) != b.view(torch.int32)).sum())
                      for (k, a), b in zip(ref.state_dict().items(), mine.state_dict().values())}
            self.assertTrue(same_bits(ref.state_dict(), mine.state_dict()), f"step {step}: elements differing {differ}")
        self.assertEqual(len(reference.eight), 2)  # both sides of min_8bit_size were exercised
        return ref, mine, reference, opt

    def test_host_matches_reference_bits(self):
        self.check_against_reference()

    def test_nvme_matches_reference_bits_and_state_dict(self):
        # 1000-element chunks snap to 768 (three blocks) inside the 8-bit weights.
        ref, mine, reference, opt = self.check_against_reference(offload="nvme", path=tmpdir("nvme8"),
                                                                 chunk_elements=1000)
        sd = opt.state_dict()
        torch_sd = reference.fp32.state_dict()["state"]
        for index, p in enumerate(mine.parameters()):
            state = sd["state"][index]
            self.assertEqual(float(state["step"]), 6.0)
            ref_p = list(ref.parameters())[index]
            if ref_p in reference.state:
                m, v = reference.dequantised(ref_p)
            else:
                small = [q for q in ref.parameters() if q not in reference.state]
                small_index = next(i for i, q in enumerate(small) if q is ref_p)
                m, v = torch_sd[small_index]["exp_avg"], torch_sd[small_index]["exp_avg_sq"]
            self.assertTrue(torch.equal(state["exp_avg"].view(torch.int32), m.view(torch.int32)), index)
            self.assertTrue(torch.equal(state["exp_avg_sq"].view(torch.int32), v.view(torch.int32)), index)
        # load_state_dict requantises: v (whose largest value is the code 1.0) comes back exact.
        again = strata.AdamW(mine.parameters(), state_bits=8, **self.HP)
        again.load_state_dict(sd)
        back = again.state_dict()["state"]
        for index in sd["state"]:
            self.assertTrue(torch.equal(back[index]["exp_avg_sq"], sd["state"][index]["exp_avg_sq"]), index)
            self.assertEqual(float(back[index]["step"]), 6.0)

    def test_commit_and_resume_bit_identical(self):
        path = tmpdir("resume8")
        whole, part = make_wide_model(), make_wide_model()
        data = wide_batches(7)
        train(whole, strata.AdamW(whole.parameters(), state_bits=8, **self.HP), data)
        opt = strata.AdamW(part.parameters(), state_bits=8, offload="nvme", path=path, chunk_elements=2048, **self.HP)
        train(part, opt, data[:4])
        opt.commit()
        weights = {k: t.clone() for k, t in part.state_dict().items()}
        train(part, opt, data[4:5])  # not committed: the resume must not see it
        del opt
        with self.assertRaisesRegex(strata.StrataError, "adamw8bit"):  # the layout must match
            strata.AdamW(part.parameters(), offload="nvme", path=path, resume=True, **self.HP)
        resumed = make_wide_model()
        resumed.load_state_dict(weights)
        opt = strata.AdamW(resumed.parameters(), state_bits=8, offload="nvme", path=path, resume=True,
                           chunk_elements=2048, **self.HP)
        train(resumed, opt, data[4:])
        self.assertTrue(same_bits(whole.state_dict(), resumed.state_dict()))

    def test_bad_arguments_are_refused_by_name(self):
        params = make_wide_model().parameters
        for kwargs, name in ((dict(state_bits=16), "state_bits"), (dict(state_bits=4), "state_bits"),
                             (dict(state_bits=True), "state_bits"), (dict(state_bits=8, block_size=100), "block_size"),
                             (dict(state_bits=8, block_size=32), "block_size"),
                             (dict(state_bits=8, block_size=8192), "block_size"),
                             (dict(state_bits=8, min_8bit_size=-1), "min_8bit_size")):
            with self.assertRaisesRegex(ValueError, name):
                strata.AdamW(params(), **kwargs)
        with self.assertRaisesRegex(strata.StrataError, "chunk_elements"):
            strata.AdamW(params(), state_bits=8, offload="nvme", path=tmpdir("bad8"), chunk_elements=128)


def wide_batches(count):
    g = torch.Generator().manual_seed(4)
    return [(torch.randn(16, 32, generator=g), torch.randn(16, 8, generator=g)) for _ in range(count)]


class Offload(unittest.TestCase):
    def test_offloaded_training_is_bit_identical(self):
        ref, mine = make_model(depth=6), make_model(depth=6)
        budget = 2 * (64 * 64 + 64) * 4 + 1  # about two of the largest layers, < the model
        total = sum(p.numel() * 4 for p in mine.parameters())
        handle = strata.offload(mine, path=tmpdir("offload"), host_memory=budget, verify_reads="once")
        self.assertLess(budget, total)
        self.assertTrue(all(p.numel() == 0 for p in mine.parameters()))
        data = batches(5)
        train(ref, torch.optim.AdamW(ref.parameters(), lr=3e-3), data)
        train(mine, strata.AdamW(mine.parameters(), lr=3e-3, offload="nvme", path=tmpdir("offload_opt")), data)
        self.assertLessEqual(handle.peak_resident_bytes, budget)
        self.assertGreater(handle.fetched_bytes, 5 * total)  # it really streamed
        sd = mine.state_dict()
        self.assertEqual(set(sd), set(ref.state_dict()))
        self.assertTrue(same_bits(ref.state_dict(), sd))
        with torch.no_grad():  # inference under the hooks gives the same outputs
            x = batches(1)[0][0]
            self.assertTrue(torch.equal(ref(x), mine(x)))

    def test_commit_and_resume_weights_and_state(self):
        params_dir, opt_dir = tmpdir("resume_params"), tmpdir("resume_opt")
        ref, mine = make_model(depth=3), make_model(depth=3)
        data = batches(6)
        train(ref, torch.optim.AdamW(ref.parameters(), lr=3e-3), data)
        handle = strata.offload(mine, path=params_dir, host_memory=40000)
        opt = strata.AdamW(mine.parameters(), lr=3e-3, offload="nvme", path=opt_dir)
        train(mine, opt, data[:4])
        handle.commit(4)
        opt.commit()
        train(mine, opt, data[4:5])  # after the commit: forgotten by the resume
        del opt, handle, mine
        again = make_model(depth=3)  # fresh initial weights: the store's must win
        strata.offload(again, path=params_dir, host_memory=40000, resume=True)
        opt = strata.AdamW(again.parameters(), lr=3e-3, offload="nvme", path=opt_dir, resume=True)
        train(again, opt, data[4:])
        self.assertTrue(same_bits(ref.state_dict(), again.state_dict()))
        other = torch.nn.Sequential(torch.nn.Linear(32, 32))  # "0.weight", another shape
        with self.assertRaisesRegex(ValueError, "0.weight"):
            strata.offload(other, path=params_dir, host_memory=1 << 20, resume=True)
        with self.assertRaises(strata.StrataError):  # a name the store lacks
            strata.offload(torch.nn.Linear(3, 3), path=params_dir, host_memory=1 << 20, resume=True)


if __name__ == "__main__":
    unittest.main(verbosity=2)
