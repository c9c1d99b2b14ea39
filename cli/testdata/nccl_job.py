# nccl_job.py LOG: a one-rank PyTorch job with an NCCL process group on the
# GPU, all-reducing a known tensor every 0.2 s and logging whether the
# result is right ("step=N ok=True"), as gpu_workload.py logs.
import os
import sys
import time

import torch
import torch.distributed as dist

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29511")
dist.init_process_group("nccl", rank=0, world_size=1)
x = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
step = 0
while True:
    step += 1
    y = x.clone()
    dist.all_reduce(y)
    ok = bool(torch.equal(y, x))
    with open(sys.argv[1], "a") as f:
        f.write("step=%d ok=%s\n" % (step, ok))
    time.sleep(0.2)
