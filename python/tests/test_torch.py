"""Tests of the Python package with PyTorch on a GPU: a real model and
optimizer state round-trips bit-exactly, in place and not. Skipped where
torch or a CUDA GPU is missing (CI); run on the GPU machine:

    cd python; STASIS_LIB=../bin/libstasis.so PYTHONPATH=. python3 -m unittest -v tests.test_torch
"""

import os
import tempfile
import unittest

import stasis

try:
    import torch
    from torch import nn
except ImportError:
    torch = None

HAVE_GPU = torch is not None and torch.cuda.is_available()


def clone(x):
    if torch.is_tensor(x):
        return x.detach().clone()
    if isinstance(x, dict):
        return {k: clone(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(clone(v) for v in x)
    return x


class Model(nn.Module if torch else object):
    """Four encoder layers, the last two in bf16."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.TransformerEncoderLayer(256, 8, 1024, batch_first=True) for _ in range(4))
        self.layers[2].to(torch.bfloat16)
        self.layers[3].to(torch.bfloat16)

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x.to(torch.bfloat16) if i == 2 else x)
        return x.float()


def train(model, opt, steps, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(8, 32, 256, device="cuda", generator=g)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def setup(seed=0):
    torch.manual_seed(seed)
    model = Model().cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    train(model, opt, 3, seed)
    return model, opt


@unittest.skipUnless(HAVE_GPU, "needs torch and a CUDA GPU (run on the GPU machine)")
class TorchGPU(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.home = os.path.join(self.tmp.name, "store")

    def tearDown(self):
        self.tmp.cleanup()

    def assertSameState(self, want, got, path="state"):
        self.assertEqual(type(want), type(got), path)
        if torch.is_tensor(want):
            self.assertEqual((want.dtype, want.shape, want.device), (got.dtype, got.shape, got.device), path)
            self.assertTrue(torch.equal(want, got), f"{path}: values differ")
        elif isinstance(want, dict):
            self.assertEqual(list(want), list(got), path)
            for k in want:
                self.assertSameState(want[k], got[k], f"{path}[{k!r}]")
        elif isinstance(want, (list, tuple)):
            self.assertEqual(len(want), len(got), path)
            for i, (a, b) in enumerate(zip(want, got)):
                self.assertSameState(a, b, f"{path}[{i}]")
        else:
            self.assertEqual(want, got, path)

    def state(self, model, opt):
        base = torch.randn(64, 48, device="cuda")
        return {"model": model.state_dict(), "opt": opt.state_dict(), "step": 3,
                "rng": torch.cuda.get_rng_state(), "cpu": torch.arange(10, dtype=torch.int64),
                "transposed": base.t(), "fp16": base[:, :5].half()}

    def test_async_save_round_trips_bit_exactly(self):
        model, opt = setup()
        state = self.state(model, opt)
        want = clone(state)
        h = stasis.save(state, job="gpu", step=3, home=self.home)
        train(model, opt, 2, seed=1)  # changes the tensors the save was given
        h.wait()
        self.assertFalse(torch.equal(model.layers[0].linear1.weight, want["model"]["layers.0.linear1.weight"]),
                         "training did not change the weights: the snapshot test proves nothing")
        got = stasis.load(job="gpu", home=self.home)
        want["transposed"] = want["transposed"].contiguous()
        self.assertSameState(want, got)
        fresh = Model().cuda()
        fresh.load_state_dict(got["model"])
        fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
        fresh_opt.load_state_dict(got["opt"])
        on_cpu = stasis.load(job="gpu", device="cpu", home=self.home)
        self.assertEqual(on_cpu["model"]["layers.3.linear2.weight"].device.type, "cpu")
        self.assertTrue(torch.equal(on_cpu["model"]["layers.3.linear2.weight"], want["model"]["layers.3.linear2.weight"].cpu()))

    def test_blocking_save_and_load_in_place(self):
        model, opt = setup()
        state = self.state(model, opt)
        want = clone(state)
        stasis.save(state, job="inplace", step=3, blocking=True, home=self.home)
        train(model, opt, 2, seed=2)
        current = {"model": model.state_dict(), "opt": opt.state_dict(), "step": 5,
                   "rng": torch.cuda.get_rng_state(), "cpu": torch.zeros(10, dtype=torch.int64),
                   "transposed": torch.zeros(64, 48, device="cuda").t(), "fp16": torch.zeros(64, 5, device="cuda").half()}
        weight = model.layers[0].linear1.weight
        got = stasis.load(job="inplace", into=current, home=self.home)
        self.assertTrue(torch.equal(weight, want["model"]["layers.0.linear1.weight"]), "the model was not loaded in place")
        self.assertTrue(torch.equal(opt.state[weight]["exp_avg"], want["opt"]["state"][0]["exp_avg"]),
                        "the optimizer state was not loaded in place")
        self.assertIs(got["transposed"], current["transposed"])
        self.assertSameState(want, got)

    def test_load_into_the_wrong_structure(self):
        model, opt = setup()
        stasis.save({"model": model.state_dict()}, job="wrong", step=1, blocking=True, home=self.home)
        into = {"model": dict(model.state_dict())}
        into["model"]["layers.1.norm1.weight"] = torch.zeros(255, device="cuda")
        with self.assertRaisesRegex(stasis.Mismatch, r"state\['model'\]\['layers.1.norm1.weight'\]: the checkpoint has float32\[256\], into= has float32\[255\]"):
            stasis.load(job="wrong", into=into, home=self.home)


if __name__ == "__main__":
    unittest.main()
