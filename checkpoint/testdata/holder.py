# holder.py READY WHAT...: holds what each WHAT names, then creates READY
# and sleeps. A stand-in for what a job's processes hold, for the
# preflight's tests:
#   flock:PATH       PATH open, with an exclusive flock
#   ghost:SIZE       a file of SIZE bytes in /dev/shm, unlinked, kept open
#   ghostmap:SIZE    the same, mapped shared and its descriptor closed
#   linkremap:DIR    DIR/a opened, linked as DIR/b, then DIR/a unlinked
#   memfd:SIZE       a memfd of SIZE bytes
#   dgram:PATH       a datagram socket connected to the socket bound at PATH
#   stream:PATH      a stream socket connected to the one listening at PATH
#   device:PATH      a page of the device PATH (a block device) mapped
#   io_uring:N       an io_uring of N entries (io_uring_setup), its rings mapped
import fcntl
import mmap
import os
import socket
import sys
import tempfile
import time

held = []
for what in sys.argv[2:]:
    kind, arg = what.split(":", 1)
    if kind == "flock":
        f = open(arg, "w")
        fcntl.flock(f, fcntl.LOCK_EX)
        held.append(f)
    elif kind in ("ghost", "ghostmap"):
        fd, path = tempfile.mkstemp(dir="/dev/shm", prefix="stasis-preflight-")
        os.unlink(path)
        os.write(fd, os.urandom(int(arg)))
        if kind == "ghostmap":
            held.append(mmap.mmap(fd, int(arg), flags=mmap.MAP_SHARED))
            os.close(fd)
        else:
            held.append(fd)
    elif kind == "linkremap":
        a, b = os.path.join(arg, "a"), os.path.join(arg, "b")
        held.append(open(a, "w"))
        os.link(a, b)
        os.unlink(a)
    elif kind == "memfd":
        fd = os.memfd_create("stasis-preflight")
        os.write(fd, os.urandom(int(arg)))
        held.append(fd)
    elif kind in ("dgram", "stream"):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM if kind == "dgram" else socket.SOCK_STREAM)
        s.connect(arg)
        held.append(s)
    elif kind == "device":
        fd = os.open(arg, os.O_RDONLY)
        held.append(mmap.mmap(fd, 4096, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ))
        os.close(fd)
    elif kind == "io_uring":
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        params = ctypes.create_string_buffer(120)  # struct io_uring_params, zeroed
        fd = libc.syscall(425, int(arg), params)  # io_uring_setup (x86-64, arm64)
        if fd < 0:
            sys.exit("holder.py: io_uring_setup: errno %d" % ctypes.get_errno())
        held.append(mmap.mmap(fd, 4096, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ, offset=0))
        held.append(fd)
    else:
        sys.exit("holder.py: what is " + what)
open(sys.argv[1], "w").close()
while True:
    time.sleep(1)
