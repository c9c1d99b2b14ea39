#!/usr/bin/env python3
"""PyTorch Distributed Checkpoint with stasis's storage (stasis.dcp) against
DCP's own FileSystemWriter, on the same sharded state, in one run.

    python3 scripts/bench_dcp.py [--ranks 4] [--gib 2] [--device cuda] [--dir DIR] [--rounds 1]

Starts RANKS processes (gloo; on one GPU they share it), each holding GIB
GiB of bf16 weights drawn from normal(0, 0.02) in tensors of 64 MiB, its
own shard (keys of its own). For each way of saving (DCP's file system
writer, blocking, with async_save, and with async_save and its pinned
staging cache (cache_staged_state_dict=True); stasis.dcp, blocking and with
async_save, where it stages into pinned memory it keeps) it measures per
rank: the stall (how long the save call held
the training loop), the time until the checkpoint is durable (for
async_save, until its future resolved; the file system writer fsyncs its
files), then the load time into the preallocated state from a cold page
cache (drop_caches, as root) and the bytes stored per checkpoint (every
checkpoint is kept until the end: the disk needs room for five per round,
about 2.5 times RANKS x GIB each). Prints one JSON object
with the slowest rank's times and the ratios stasis / file system.
Needs torch >= 2.3 with torch.distributed.checkpoint; without it (Debian's
PyTorch 1.13 on CI) it says so and exits 0 having measured nothing.
"""

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def rank_main(args):
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import stasis.dcp

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device(args.device)
    gen = torch.Generator(device=dev).manual_seed(rank)
    n = int(args.gib * (1 << 30)) // (64 << 20)
    state = {f"r{rank}.w{i}": torch.empty(32 << 20, dtype=torch.bfloat16, device=dev).normal_(0, 0.02, generator=gen)
             for i in range(n)}
    if dev.type == "cuda":
        torch.cuda.synchronize()
    out = {}

    def measure(name, make_writer, make_reader, asynchronous, step):
        dist.barrier()
        t0 = time.perf_counter()
        if asynchronous:
            fut = dcp.async_save(state, storage_writer=make_writer(step))
            stall = time.perf_counter() - t0
            fut.result()
        else:
            dcp.save(state, storage_writer=make_writer(step))
            stall = time.perf_counter() - t0
        durable = time.perf_counter() - t0
        dist.barrier()
        if rank == 0 and os.geteuid() == 0:
            os.sync()
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3")
        dist.barrier()
        into = {k: torch.empty_like(v) for k, v in state.items()}
        t0 = time.perf_counter()
        dcp.load(into, storage_reader=make_reader(step))
        if dev.type == "cuda":
            torch.cuda.synchronize()
        load = time.perf_counter() - t0
        for k in state:
            assert torch.equal(into[k], state[k]), f"{name}: {k} differs after the load"
        out[name] = {"stall_s": stall, "durable_s": durable, "load_s": load}

    fsdir = os.path.join(args.dir, "fs")
    # The writers async_save stages with, kept across rounds as a training
    # loop keeps them: DCP's file system writer with its pinned cache, and
    # stasis.dcp's (which stages into pinned memory it keeps by default).
    fs_cached = dcp.FileSystemWriter(os.path.join(fsdir, "x"), cache_staged_state_dict=True)
    st_writer = stasis.dcp.Writer(job="bench", step=0)
    for r in range(args.rounds):
        measure(f"fs/{r}", lambda s: dcp.FileSystemWriter(os.path.join(fsdir, str(s))),
                lambda s: dcp.FileSystemReader(os.path.join(fsdir, str(s))), False, 2 * r)
        measure(f"fs_async/{r}", lambda s: dcp.FileSystemWriter(os.path.join(fsdir, str(s))),
                lambda s: dcp.FileSystemReader(os.path.join(fsdir, str(s))), True, 2 * r + 1)
        measure(f"fs_async_cached/{r}", lambda s: (fs_cached.reset(os.path.join(fsdir, str(s))), fs_cached)[1],
                lambda s: dcp.FileSystemReader(os.path.join(fsdir, str(s))), True, 100 + r)
        measure(f"stasis/{r}", lambda s: stasis.dcp.Writer(job="bench", step=s, stage=False),
                lambda s: stasis.dcp.Reader(job="bench", step=s), False, 2 * r)
        measure(f"stasis_async/{r}", lambda s: st_writer.for_step(s), lambda s: stasis.dcp.Reader(job="bench", step=s),
                True, 2 * r + 1)
    results = [None] * world
    dist.all_gather_object(results, out)
    if rank == 0:
        print("RESULT " + json.dumps(results), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def du(path):
    total = 0
    for d, _, files in os.walk(path):
        for f in files:
            total += os.lstat(os.path.join(d, f)).st_blocks * 512
    return total


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--gib", type=float, default=2.0)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dir", default="/var/tmp/stasis-bench-dcp")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank_main:
        return rank_main(args)
    try:
        import torch.distributed.checkpoint  # noqa: F401
        import torch.distributed.checkpoint.state_dict_saver as saver
        if not hasattr(saver, "async_save"):
            raise ImportError("no async_save")
    except ImportError as e:
        print(f"bench_dcp: skipped, measured nothing: this PyTorch has no usable torch.distributed.checkpoint ({e})")
        return 0
    shutil.rmtree(args.dir, ignore_errors=True)
    os.makedirs(args.dir)
    home = os.path.join(args.dir, "store")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(args.ranks):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(args.ranks), LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), STASIS_HOME=home)
        env.setdefault("STASIS_LIB", os.path.join(ROOT, "bin", "libstasis.so"))
        procs.append(subprocess.Popen([sys.executable, __file__, "--rank-main", "--device", args.device, "--gib", str(args.gib),
                                       "--dir", args.dir, "--rounds", str(args.rounds)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate()[0] for p in procs]
    for r, (p, out) in enumerate(zip(procs, outs)):
        if p.returncode != 0:
            sys.exit(f"rank {r} failed:\n{out}")
    results = json.loads(next(line for line in outs[0].splitlines() if line.startswith("RESULT "))[7:])
    report = {"ranks": args.ranks, "gib_per_rank": args.gib, "device": args.device, "rounds": args.rounds}
    for way in ("fs", "fs_async", "fs_async_cached", "stasis", "stasis_async"):
        for what in ("stall_s", "durable_s", "load_s"):
            # The slowest rank of each round, the best round.
            report[f"{way}_{what}"] = round(min(max(r[f"{way}/{k}"][what] for r in results) for k in range(args.rounds)), 3)
    # Per checkpoint: the file system writer's three ways and stasis.dcp's
    # two each saved one checkpoint a round.
    report["fs_stored_bytes"] = du(os.path.join(args.dir, "fs")) // (3 * args.rounds)
    report["stasis_stored_bytes"] = du(home) // (2 * args.rounds)
    for a, b in (("stasis", "fs"), ("stasis_async", "fs_async"), ("stasis_async", "fs_async_cached")):
        for what in ("stall_s", "durable_s", "load_s"):
            if report[f"{b}_{what}"] > 0:
                report[f"{a}_vs_{b}_{what.removesuffix('_s')}"] = round(report[f"{a}_{what}"] / report[f"{b}_{what}"], 3)
    report["stasis_vs_fs_stored"] = round(report["stasis_stored_bytes"] / max(1, report["fs_stored_bytes"]), 3)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
