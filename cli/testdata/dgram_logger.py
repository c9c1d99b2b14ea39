# dgram_logger.py SOCKET OUT: logs as a job logs to /dev/log: a datagram
# socket connected to SOCKET (bound by a process outside the job's tree),
# through which it sends "N" every 20 ms, counting N into OUT as well.
import socket
import sys
import time

s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.connect(sys.argv[1])
i = 0
while True:
    i += 1
    with open(sys.argv[2], "a") as f:
        f.write(f"{i}\n")
    try:
        s.send(str(i).encode())
    except OSError:
        pass  # the reader is slow or gone: a log line lost, as with syslog
    time.sleep(0.02)
