"""Times PyTorch's and safetensors' save and load on the bytes the stasis
GPU test saved (PREFIX.bin, written by TestRealGPU with
STASIS_GPU_TEST_OUT=PREFIX), so that both sides work on the same data in
the same run. Prints a JSON object.

    python3 scripts/bench_peers.py PREFIX DIR [--single]

Each save is followed by fsync (durable, as stasis's saves are); each load
starts from a cold page cache (drop_caches, root) and ends with the tensors
on the GPU. The state is one tensor, and again 20,000 tensors holding the
same bytes (not with --single, which keeps a 32 GiB run within minutes).
Each figure is printed to stderr as soon as it is measured.
"""
import json
import os
import sys
import time

import numpy as np
import torch
from safetensors.torch import load_file, save_file


def cold():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3")


def fsync(path):
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)


def timed(fn):
    torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t


def measure(name, state, nbytes, d):
    out = {}
    path = os.path.join(d, name + ".pt")

    def torch_save():
        torch.save(state, path)
        fsync(path)

    out["torch_save_gbps"] = nbytes / timed(torch_save) / 1e9
    print(name, "torch_save_gbps", out["torch_save_gbps"], file=sys.stderr, flush=True)
    cold()
    out["torch_load_gbps"] = nbytes / timed(lambda: torch.load(path, map_location="cuda")) / 1e9
    print(name, "torch_load_gbps", out["torch_load_gbps"], file=sys.stderr, flush=True)
    os.remove(path)
    path = os.path.join(d, name + ".safetensors")

    def st_save():
        save_file(state, path)
        fsync(path)

    out["safetensors_save_gbps"] = nbytes / timed(st_save) / 1e9
    print(name, "safetensors_save_gbps", out["safetensors_save_gbps"], file=sys.stderr, flush=True)
    cold()
    out["safetensors_load_gbps"] = nbytes / timed(lambda: load_file(path, device="cuda")) / 1e9
    print(name, "safetensors_load_gbps", out["safetensors_load_gbps"], file=sys.stderr, flush=True)
    os.remove(path)
    return out


def main():
    prefix, d = sys.argv[1], sys.argv[2]
    single = "--single" in sys.argv[3:]
    raw = np.fromfile(prefix + ".bin", dtype=np.uint16)
    w = torch.from_numpy(raw).cuda().view(torch.bfloat16)
    nbytes = w.numel() * 2
    result = {"bytes": nbytes}
    for k, v in measure("one", {"w": w}, nbytes, d).items():
        result[k] = v
    if single:
        print(json.dumps(result, indent=1))
        return
    per = (w.numel() // 20000)
    small = {f"p{i}": w[i * per:(i + 1) * per].clone() for i in range(20000)}
    for k, v in measure("small", small, per * 20000 * 2, d).items():
        result["small_" + k] = v
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
