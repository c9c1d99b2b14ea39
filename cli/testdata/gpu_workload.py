# gpu_workload.py OUT GIB [busy|weights]: fills GIB GiB of GPU memory with
# a known pattern (1 GiB tensors of arange ^ i), then every 0.2 s checks
# every tensor's sum against the one taken at the start and appends
# "step=N ok=True|False" to OUT. With "busy", each step first runs a GPU
# kernel that spins for about 1.5 s (step 2: about 10 s; torch.cuda._sleep),
# to test lock timeouts. With "weights", the tensors hold bf16 values drawn
# from normal(0, 0.02) instead, as model weights do (checked through their
# bits).
import sys
import time

import torch

out, gib = sys.argv[1], float(sys.argv[2])
mode = sys.argv[3] if len(sys.argv) > 3 else ""
busy = mode == "busy"
per = 1 << 28  # int32 elements: 1 GiB
tensors = []
left = int(gib * (1 << 30)) // 4
i = 0
while left > 0:
    n = min(per, left)
    if mode == "weights":
        w = (torch.randn(2 * n, device="cuda") * 0.02).to(torch.bfloat16)
        tensors.append(w.view(torch.int16))
    else:
        tensors.append(torch.arange(n, dtype=torch.int32, device="cuda") ^ i)
    left -= n
    i += 1
expected = [int(t.sum(dtype=torch.int64)) for t in tensors]
torch.cuda.synchronize()
step = 0
while True:
    step += 1
    if busy:
        # Step 2 spins for about 10 s: the scenarios begin once step 1 is
        # logged, so a short lock timeout surely meets a kernel still
        # running (with equal steps it could land in the gap between two).
        torch.cuda._sleep(20_000_000_000 if step == 2 else 3_000_000_000)
    ok = all(int(t.sum(dtype=torch.int64)) == e for t, e in zip(tensors, expected))
    with open(out, "a") as f:
        f.write(f"step={step} ok={ok}\n")
    time.sleep(0.2)
