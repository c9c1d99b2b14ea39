# unix_client.py SOCKET OUT: connects to a unix socket served by a process
# outside its tree, then counts into OUT every 20 ms. CRIU cannot dump one
# end of a stream connection (--ext-unix-sk takes only datagram peers): the
# checkpoint's preflight refuses the tree.
import socket
import sys
import time

s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
i = 0
while True:
    i += 1
    with open(sys.argv[2], "a") as f:
        f.write(f"{i}\n")
    time.sleep(0.02)
