# unix_server.py SOCKET: accepts connections on a unix socket and holds them.
import os
import socket
import sys
import time

path = sys.argv[1]
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(path)
s.listen(4)
conns = []
while True:
    c, _ = s.accept()
    conns.append(c)
