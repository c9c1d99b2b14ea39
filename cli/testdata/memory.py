# memory.py OUT MIB: holds MIB MiB of memory (half random, half zeros) and
# appends a counter to OUT every 20 ms.
import os
import sys
import time

out, mib = sys.argv[1], int(sys.argv[2])
half = (mib << 20) // 2
data = bytearray(os.urandom(half)) + bytearray(half)
for i in range(0, len(data), 4096):
    data[i] |= 1  # touch every page so all of it is resident
i = 0
while True:
    i += 1
    with open(out, "a") as f:
        f.write(f"{i}\n")
    time.sleep(0.02)
