"""Benchmarks the Python package against its peers on one training state in
one run, on the GPU machine: the stall (how long the training loop waits)
and the total time (until durable) of stasis.save, torch.save + fsync,
torch.distributed.checkpoint.async_save (one process) and safetensors
save_file + fsync; then the load time from a cold page cache of
stasis.load(device='cuda'), torch.load(map_location='cuda'), DCP load and
safetensors load_file(device='cuda'). The device-to-host bandwidth into
pinned memory is measured in the same run (the stall's floor). The `auto`
saves are prepared (stasis.prepare, then 5 s before the first save), the
`none` ones are not.

    PYTHONPATH=python STASIS_LIB=bin/libstasis.so python3 scripts/bench_library.py --gib 8 --dir /root/bl [--out FILE.json]

The state is shaped like a model with AdamW: bf16 weights drawn from
normal(0, 0.02), and fp32 first and second moments, in --tensors tensors
per group. Prints a table and writes the figures as JSON.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import torch

import stasis


def cold():
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3")
        return True
    except OSError:
        return False


def fsync_tree(path):
    paths = [path] if os.path.isfile(path) else [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs]
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)


def make_state(gib, per_group):
    """bf16 weights (1/5 of the bytes) and fp32 moments (4/5)."""
    weight_elems = int(gib * (1 << 30) / 10)  # 2 bytes + 2 x 4 bytes per element
    n = weight_elems // per_group
    g = torch.Generator(device="cuda").manual_seed(0)
    model, opt = {}, {}
    for i in range(per_group):
        w = (torch.randn(n, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
        model[f"layers.{i}.weight"] = w
        opt[i] = {"exp_avg": torch.randn(n, device="cuda", generator=g) * 1e-3,
                  "exp_avg_sq": torch.rand(n, device="cuda", generator=g) * 1e-6,
                  "step": torch.tensor(100.0)}
    state = {"model": model, "opt": {"state": opt, "param_groups": [{"lr": 3e-4, "betas": (0.9, 0.95)}]}, "step": 100}
    nbytes = sum(t.numel() * t.element_size() for t in model.values())
    nbytes += sum(v.numel() * v.element_size() for s in opt.values() for v in s.values())
    return state, nbytes


def flat(state):
    out = {}
    for k, v in state["model"].items():
        out["model." + k] = v
    for i, s in state["opt"]["state"].items():
        for k, v in s.items():
            out[f"opt.{i}.{k}"] = v
    return out


def d2h_bandwidth(nbytes):
    src = torch.empty(min(nbytes, 4 << 30), dtype=torch.uint8, device="cuda")
    dst = torch.empty(src.numel(), dtype=torch.uint8, pin_memory=True)
    best = 0
    for _ in range(3):
        torch.cuda.synchronize()
        t = time.perf_counter()
        dst.copy_(src)
        torch.cuda.synchronize()
        best = max(best, src.numel() / (time.perf_counter() - t))
    del src, dst
    return best


def clock(fn):
    torch.cuda.synchronize()
    t = time.perf_counter()
    r = fn()
    return r, time.perf_counter() - t


def bench_stasis(state, nbytes, home, compress, job, results, prepare):
    # With prepare, the snapshot memory is allocated and pinned (in the
    # background) before the first save, as a training loop does at its
    # start; the 5 s sleep stands for the training steps before that save.
    # Without, the first save allocates it (and pins it afterwards, in the
    # background); the later ones reuse it.
    if prepare:
        t0 = time.perf_counter()
        stasis.prepare(state, home=home)  # the snapshot memory; compression is per save
        results[f"{job}_prepare"] = {"call_s": time.perf_counter() - t0}
        time.sleep(5)
    for step, attempt in enumerate(("first", "second", "third")):
        t0 = time.perf_counter()
        h = stasis.save(state, job=job, step=step, home=home, compress=compress)
        stall = time.perf_counter() - t0
        rec = h.wait()
        total = time.perf_counter() - t0
        results[f"{job}_{attempt}"] = {"stall_s": stall, "snapshot_s": h.snapshot_s, "total_s": total,
                                       "stored_bytes": rec["stored_bytes"]}
    warm = cold()
    _, t = clock(lambda: stasis.load(job=job, device="cuda", home=home))
    results[f"{job}_load"] = {"load_s": t, "cold_cache": warm}
    cold()
    _, t = clock(lambda: stasis.load(job=job, device="cpu", home=home))
    results[f"{job}_load_to_host"] = {"load_s": t}
    # the disk's limit: the same stored bytes read with O_DIRECT by dd
    data = [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(home, "checkpoints", rec["id"])) for f in fs if f.startswith("data")]
    cold()
    t0 = time.perf_counter()
    for p in data:
        subprocess.run(["dd", f"if={p}", "of=/dev/null", "bs=64M", "iflag=direct"], check=True, capture_output=True)
    results[f"{job}_raw_read"] = {"load_s": time.perf_counter() - t0, "bytes": sum(os.path.getsize(p) for p in data)}


def bench_torch(state, path, results):
    def save():
        torch.save(state, path)
        fsync_tree(path)
    _, t = clock(save)
    results["torch_save"] = {"stall_s": t, "total_s": t, "stored_bytes": os.path.getsize(path)}
    warm = cold()
    _, t = clock(lambda: torch.load(path, map_location="cuda"))
    results["torch_load"] = {"load_s": t, "cold_cache": warm}
    os.remove(path)


def bench_safetensors(state, path, results):
    try:
        from safetensors.torch import load_file, save_file
    except ImportError:
        results["safetensors"] = {"skipped": "safetensors is not installed"}
        return
    tensors = flat(state)

    def save():
        save_file(tensors, path)
        fsync_tree(path)
    _, t = clock(save)
    results["safetensors_save"] = {"stall_s": t, "total_s": t, "stored_bytes": os.path.getsize(path)}
    warm = cold()
    _, t = clock(lambda: load_file(path, device="cuda"))
    results["safetensors_load"] = {"load_s": t, "cold_cache": warm}
    os.remove(path)


def bench_dcp(state, path, results):
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29517")
        dist.init_process_group("cuda:nccl,cpu:gloo", rank=0, world_size=1)
    tensors = flat(state)
    t0 = time.perf_counter()
    fut = dcp.async_save(tensors, checkpoint_id=path)
    stall = time.perf_counter() - t0
    fut.result()
    fsync_tree(path)
    total = time.perf_counter() - t0
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)
    results["dcp_async_save"] = {"stall_s": stall, "total_s": total, "stored_bytes": size}
    into = {k: torch.empty_like(v) for k, v in tensors.items()}
    warm = cold()
    _, t = clock(lambda: dcp.load(into, checkpoint_id=path))
    results["dcp_load"] = {"load_s": t, "cold_cache": warm}
    shutil.rmtree(path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=8)
    ap.add_argument("--tensors", type=int, default=256, help="tensors per group (weights, two moments)")
    ap.add_argument("--dir", required=True)
    ap.add_argument("--out")
    ap.add_argument("--skip", default="", help="comma-separated: torch,safetensors,dcp,none")
    a = ap.parse_args()
    skip = set(filter(None, a.skip.split(",")))
    os.makedirs(a.dir, exist_ok=True)
    state, nbytes = make_state(a.gib, a.tensors)
    torch.cuda.synchronize()
    results = {"bytes": nbytes, "tensors": 3 * a.tensors, "d2h_bytes_per_s": d2h_bandwidth(nbytes),
               "stasis_lib": stasis.library_path()}
    home = os.path.join(a.dir, "store")
    bench_stasis(state, nbytes, home, "auto", "auto", results, prepare=True)
    if "none" not in skip:
        bench_stasis(state, nbytes, home + "-none", "none", "none", results, prepare=False)
    if "torch" not in skip:
        bench_torch(state, os.path.join(a.dir, "state.pt"), results)
    if "safetensors" not in skip:
        bench_safetensors(state, os.path.join(a.dir, "state.safetensors"), results)
    if "dcp" not in skip:
        try:
            bench_dcp(state, os.path.join(a.dir, "dcp"), results)
        except Exception as e:  # report, do not hide: the other figures stand
            results["dcp"] = {"error": f"{type(e).__name__}: {e}"}
    shutil.rmtree(home, ignore_errors=True)
    shutil.rmtree(home + "-none", ignore_errors=True)
    floor = nbytes / results["d2h_bytes_per_s"]
    results["stall_floor_s"] = floor
    print(f"state {nbytes / 1e9:.2f} GB in {3 * a.tensors} tensors; D2H {results['d2h_bytes_per_s'] / 1e9:.1f} GB/s, "
          f"so the stall's floor is {floor:.3f} s (target <= {1.2 * floor:.3f} s)")
    for k, v in results.items():
        if isinstance(v, dict):
            print(f"  {k:24s} " + "  ".join(f"{kk}={vv:.3f}" if isinstance(vv, float) else f"{kk}={vv}" for kk, vv in v.items()))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
