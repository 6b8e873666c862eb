"""tests/api/test_python.py — the Python package on libstrata, against Debian's torch 1.13:
strata.AdamW (host and nvme state) gives exactly torch.optim.AdamW's fp32 bits; state_dict /
load_state_dict round-trip; commit + resume continues exactly; strata.offload trains a model
to the same bits as plain PyTorch while its parameters live in the store under a budget
smaller than the model (its fetches trusted once seen intact: verify_reads="once"); a store's
verify_reads policy trusts what the handle wrote and checks what it opened; errors arrive as
StrataError with the C API's message.

Run by Meson with STRATA_LIBRARY (the built libstrata.so) and PYTHONPATH (python/).
"""
import atexit
import os
import shutil
import tempfile
import unittest

import torch

import strata

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
