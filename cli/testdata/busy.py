# busy.py OUT: rewrites every page of 32 MiB of memory, pass after pass,
# each pass writing its number into each page in turn, so that at any
# instant the pages hold n+1 up to some page and n after it. Every pass
# first checks that, and appends "N ok" (or "N bad WHAT") to OUT.
import struct
import sys

out = sys.argv[1]
PAGE = 4096
mem = bytearray(32 << 20)
pages = len(mem) // PAGE
n = 0
while True:
    vals = [struct.unpack_from("<Q", mem, p * PAGE)[0] for p in range(pages)]
    cut = next((i for i in range(pages) if vals[i] != vals[0]), pages)
    ok = all(v == vals[0] for v in vals[:cut]) and all(v == vals[0] - 1 for v in vals[cut:])
    with open(out, "a") as f:
        f.write(f"{n} ok\n" if ok else f"{n} bad {vals[0]} {cut} {vals[cut:cut + 3]}\n")
    n = vals[0] + 1
    for p in range(pages):
        struct.pack_into("<Q", mem, p * PAGE, n)
