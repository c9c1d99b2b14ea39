# dataloader_train.py LOG STEPS START_METHOD [DEVICE]: a training loop fed
# by a PyTorch DataLoader with two persistent worker processes started by
# START_METHOD (fork, spawn or forkserver), as training jobs are usually
# shaped: the workers build batches from a deterministic synthetic dataset
# and hand them over through shared memory. On the GPU (DEVICE cuda, the
# default where there is one) CUDA is initialized before the workers start,
# so fork workers inherit its mappings. Each step appends "STEP LOSS" to
# LOG (the loss as repr, every bit of it); when STEPS are done, LOG.done is
# created. Two runs, one checkpointed and restored mid-way, must write the
# same LOG.
import os
import sys
import time

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

class Synthetic(Dataset):
    def __len__(self):
        return 1 << 20

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        x = torch.randn(64, generator=g)
        return x, int(x[:8].sum() > 0)


def main():
    log, steps, method = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    device = sys.argv[4] if len(sys.argv) > 4 else ("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 2)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = DataLoader(Synthetic(), batch_size=256, num_workers=2, persistent_workers=True,
                        multiprocessing_context=method, prefetch_factor=2)
    batches = iter(loader)
    for step in range(1, steps + 1):
        x, y = next(batches)
        x, y = x.to(device), y.to(device)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        with open(log, "a") as f:
            f.write("%d %r\n" % (step, loss.item()))
        time.sleep(0.05)
    open(log + ".done", "w").close()
    os._exit(0)  # without waiting for the workers' shutdown


if __name__ == "__main__":  # spawn and forkserver workers import this file
    main()
