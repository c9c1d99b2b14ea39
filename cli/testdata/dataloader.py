# dataloader.py OUT WORKERS: a CPU job shaped like a PyTorch training job fed
# by a DataLoader with forked workers, for the preflight and the process
# checkpoint: what it holds needs CRIU's options that `stasis checkpoint`
# now chooses by itself.
#
# - batches: a 3 MiB segment in /dev/shm, unlinked while open and mapped
#   (as torch's shared-memory tensors: a ghost file above CRIU's 1 MiB);
# - a memfd of 1 MiB, mapped shared, where each worker counts its batches;
# - a named POSIX semaphore guarding the segment (glibc maps a temporary
#   file that it links under the semaphore's name and unlinks: a file
#   unlinked where it was opened but linked elsewhere, for link-remap);
# - an exclusive flock on OUT.lock, held by the parent.
#
# Worker w (1..WORKERS) fills its slot of the segment with batch i (every
# byte i's, under the semaphore), counts i in the memfd and appends i to
# OUT.w. The parent checks every slot against the memfd's count, under the
# semaphore, and appends "N ok" (or "N bad WHAT") to OUT.
import _multiprocessing
import fcntl
import mmap
import os
import struct
import sys
import time

out, workers = sys.argv[1], int(sys.argv[2])
SLOT = 1 << 20

lock = open(out + ".lock", "w")
fcntl.flock(lock, fcntl.LOCK_EX)

fd = os.open("/dev/shm/stasis-dataloader-%d" % os.getpid(), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
os.unlink("/dev/shm/stasis-dataloader-%d" % os.getpid())
os.ftruncate(fd, workers * SLOT)
os.write(fd, bytes(workers * SLOT))  # resident, as a batch is
batches = mmap.mmap(fd, workers * SLOT, flags=mmap.MAP_SHARED)

mfd = os.memfd_create("stasis-dataloader")
os.ftruncate(mfd, 1 << 20)
counts = mmap.mmap(mfd, 1 << 20, flags=mmap.MAP_SHARED)

# kind 1 is a semaphore; not unlinked: its name stays in /dev/shm.
sem = _multiprocessing.SemLock(1, 1, 1, "/stasis-dataloader-%d" % os.getpid(), False)
with open(out + ".sem", "w") as f:
    f.write("/dev/shm/sem.stasis-dataloader-%d\n" % os.getpid())


def worker(w):
    i = struct.unpack_from("<Q", counts, w * 8)[0]
    with open(out + ".%d" % w, "a") as f:
        while True:
            i += 1
            sem.acquire()
            batches[(w - 1) * SLOT:w * SLOT] = bytes([i % 256]) * SLOT
            struct.pack_into("<Q", counts, w * 8, i)
            sem.release()
            f.write("%d\n" % i)
            f.flush()
            time.sleep(0.02)


for w in range(1, workers + 1):
    if os.fork() == 0:
        worker(w)

n = 0
with open(out, "a") as f:
    while True:
        n += 1
        bad = []
        sem.acquire()
        for w in range(1, workers + 1):
            i = struct.unpack_from("<Q", counts, w * 8)[0]
            slot = batches[(w - 1) * SLOT:w * SLOT]
            if i and slot != bytes([i % 256]) * SLOT:
                bad.append("worker %d: slot is not batch %d" % (w, i))
        sem.release()
        f.write("%d %s\n" % (n, "bad " + "; ".join(bad) if bad else "ok"))
        f.flush()
        time.sleep(0.05)
