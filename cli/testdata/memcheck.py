# memcheck.py OUT: a parent and a forked child that hold memory of every
# kind a restore treats apart, and check every 0.1 s that it still holds
# what it held: each check appends "ROLE N ok" (or "ROLE N bad WHAT") to OUT.
#
# - anon: 16 MiB of private anonymous memory, its pages in turn random,
#   all zeros (written, so resident), zeros but one byte, and untouched; the
#   child rewrites part of it after the fork (the rest it shares, copy on
#   write, with the parent);
# - readonly: 1 MiB of private anonymous memory made read-only;
# - hidden: 256 KiB of private anonymous memory made inaccessible
#   (PROT_NONE), which each check opens to read and closes again;
# - file: a private mapping of a file, two of its pages changed (so their
#   copies are anonymous pages of a file mapping);
# - heap: 8 MiB in a bytearray;
# - shared: 2 MiB of shared anonymous memory (MAP_SHARED|MAP_ANONYMOUS),
#   which parent and child both map;
# - memfd: a memfd of 1 MiB and a bit, written with write(), which both
#   map and also read through its descriptor.
import ctypes
import hashlib
import mmap
import os
import random
import sys
import time

out = sys.argv[1]
PAGE = 4096
PROT_NONE = 0
rnd = random.Random(os.getpid())
libc = ctypes.CDLL(None, use_errno=True)
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]

anon = mmap.mmap(-1, 16 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
for i in range(0, len(anon), PAGE):
    kind = (i // PAGE) % 4
    if kind == 0:
        anon[i:i + PAGE] = rnd.randbytes(PAGE)
    elif kind == 1:
        anon[i:i + PAGE] = bytes(PAGE)
    elif kind == 2:
        anon[i + 100] = 0x5A

readonly = mmap.mmap(-1, 1 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
readonly[:] = rnd.randbytes(len(readonly))
view = ctypes.c_char.from_buffer(readonly)
if libc.mprotect(ctypes.addressof(view), len(readonly), mmap.PROT_READ) != 0:
    sys.exit("mprotect: errno %d" % ctypes.get_errno())
del view

hidden = mmap.mmap(-1, 256 << 10, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
hidden[:] = rnd.randbytes(len(hidden))
view = ctypes.c_char.from_buffer(hidden)
hidden_addr = ctypes.addressof(view)
del view


def protect_hidden(prot):
    if libc.mprotect(hidden_addr, len(hidden), prot) != 0:
        sys.exit("mprotect: errno %d" % ctypes.get_errno())


protect_hidden(PROT_NONE)

with open(out + ".file", "wb") as f:
    f.write(rnd.randbytes(1 << 20))
with open(out + ".file", "r+b") as f:
    file = mmap.mmap(f.fileno(), 1 << 20, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
file[0:PAGE] = rnd.randbytes(PAGE)
file[5 * PAGE + 7] ^= 0xFF

heap = bytearray(rnd.randbytes(8 << 20))

shared = mmap.mmap(-1, 2 << 20, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
shared[0:1 << 20] = rnd.randbytes(1 << 20)
shared[(2 << 20) - PAGE + 9] = 0xA5

memfd = os.memfd_create("memcheck")
os.write(memfd, rnd.randbytes((1 << 20) + 100))
memfd_map = mmap.mmap(memfd, 1 << 20, flags=mmap.MAP_SHARED)


class Fd:
    """The memfd's contents as read() gives them, like a region."""

    def __getitem__(self, _):
        return os.pread(memfd, (1 << 20) + 200, 0)

role = "parent"
if os.fork() == 0:
    role = "child"
    rnd = random.Random(os.getpid())
    anon[0:16 * PAGE] = rnd.randbytes(16 * PAGE)
    heap[0:PAGE] = rnd.randbytes(PAGE)

regions = {"anon": anon, "readonly": readonly, "file": file, "heap": heap,
           "shared": shared, "memfd": memfd_map, "memfd_fd": Fd()}


def digests():
    d = {name: hashlib.sha256(r[:]).hexdigest() for name, r in regions.items()}
    protect_hidden(mmap.PROT_READ)
    d["hidden"] = hashlib.sha256(hidden[:]).hexdigest()
    protect_hidden(PROT_NONE)
    return d


want = digests()
n = 0
while True:
    n += 1
    bad = [name for name, d in digests().items() if d != want[name]]
    with open(out, "a") as f:
        f.write("%s %d %s\n" % (role, n, "bad " + ",".join(bad) if bad else "ok"))
    time.sleep(0.1)
