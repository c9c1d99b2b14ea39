"""stasis.dcp under PyTorch's Distributed Checkpoint, with real ranks (gloo,
one process each) saving DTensor shards, loaded back into another world
size. Needs torch with torch.distributed.checkpoint (2.x): Debian's
PyTorch 1.13 has none, so on CI it skips; the GPU machine runs it
(torch 2.11), where a CUDA state is saved and loaded through it too."""

import os
import socket
import subprocess
import sys
import textwrap
import unittest

from test_numpy import PYTHON_DIR, StoreTest

try:
    import torch
    import torch.distributed.checkpoint  # noqa: F401
    HAVE_DCP = True
except ImportError:
    HAVE_DCP = False

# A rank of a job whose state is a [64, 32] tensor sharded by rows over the
# world (a DTensor), a replicated tensor and plain values. MODE save: saves
# step STEP (async with ASYNC=1); MODE load: loads the latest into a state
# sharded over this world and checks every element.
RANK = """
    import os, sys
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    import stasis.dcp

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    step = int(os.environ["STEP"])
    mesh = init_device_mesh("cpu", (world,))

    def full(step):
        return torch.arange(64 * 32, dtype=torch.float32).reshape(64, 32) * (step + 1)

    def state(step):
        return {"model": {"w": distribute_tensor(full(step), mesh, [Shard(0)]),
                          "b": torch.full((7,), float(step), dtype=torch.bfloat16)},
                "extra": {"step": step, "lr": 0.5 / (step + 1), "name": "run-%d" % step}}

    if os.environ["MODE"] == "save":
        w = stasis.dcp.Writer(job="dcpjob", step=step)
        if os.environ.get("ASYNC") == "1":
            dcp.async_save(state(step), storage_writer=w).result()
        else:
            dcp.save(state(step), storage_writer=w)
    else:
        target = state(0)  # the shape to load into, other values
        dcp.load(target, storage_reader=stasis.dcp.Reader(job="dcpjob"))
        got = target["model"]["w"].full_tensor()
        assert torch.equal(got, full(step)), (got[0, :4], full(step)[0, :4])
        assert torch.equal(target["model"]["b"], torch.full((7,), float(step), dtype=torch.bfloat16))
        assert target["extra"] == {"step": step, "lr": 0.5 / (step + 1), "name": "run-%d" % step}, target["extra"]
    dist.barrier()
    dist.destroy_process_group()
    print("OK", rank, flush=True)
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@unittest.skipUnless(HAVE_DCP, "this PyTorch has no torch.distributed.checkpoint (Debian's 1.13); "
                               "the GPU machine's torch 2.11 runs these tests")
class DCP(StoreTest):
    def ranks(self, world, mode, step, **env):
        port = free_port()
        procs = []
        for r in range(world):
            e = dict(os.environ, PYTHONPATH=PYTHON_DIR, STASIS_HOME=self.home, RANK=str(r), WORLD_SIZE=str(world),
                     LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), MODE=mode, STEP=str(step),
                     **{k: str(v) for k, v in env.items()})
            procs.append(subprocess.Popen([sys.executable, "-c", textwrap.dedent(RANK)], env=e,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        for r, p in enumerate(procs):
            out, _ = p.communicate(timeout=300)
            self.assertEqual(p.returncode, 0, f"{mode} rank {r} of {world}:\n{out}")

    def test_save_4_load_2_and_4(self):
        import stasis
        self.ranks(4, "save", 3)
        self.ranks(4, "save", 5, ASYNC=1)
        recs = stasis.list("dcpjob", home=self.home)
        self.assertEqual([(r["kind"], r["step"]) for r in recs], [("job", 3), ("job", 5)])
        self.ranks(2, "load", 5)  # resharded by DCP's planner
        self.ranks(4, "load", 5)
        self.ranks(1, "load", 5)

    def test_cuda_state_in_one_process(self):
        if not torch.cuda.is_available():
            self.skipTest("no GPU")
        import torch.distributed.checkpoint as dcp
        import stasis.dcp
        state = {"w": torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16), "n": 7}
        dcp.save(state, storage_writer=stasis.dcp.Writer(job="gpu", step=1, home=self.home))
        into = {"w": torch.zeros(1024, 1024, device="cuda", dtype=torch.bfloat16), "n": 0}
        dcp.load(into, storage_reader=stasis.dcp.Reader(job="gpu", home=self.home))
        self.assertTrue(torch.equal(into["w"], state["w"]))
        self.assertEqual(into["n"], 7)
