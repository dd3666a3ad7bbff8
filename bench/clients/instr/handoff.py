"""One client drives fair hand-offs on a redis-server: a holder releases to a waiter that has
taken its place in line, again and again. Modes: module (SEM.ACQUIREFAIR, SEM.RELEASE: a refused
try, the release, the waiter's try that is granted), script (redsem.lua: a try with LINE that
takes a place, a release that hands over, the waiter's LPOP of its grant, as its BLPOP would),
floor (floor.lua: the same with only a hand-off's bare writes).

    python3 handoff.py PORT MODE N [SCRIPT]     (Python standard library only)
"""
import socket
import sys


class Conn:
    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.buf = b""

    def call(self, *args):
        out = b"*%d\r\n" % len(args)
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            out += b"$%d\r\n%s\r\n" % (len(a), a)
        self.sock.sendall(out)
        return self.read()

    def line(self):
        while b"\r\n" not in self.buf:
            self.buf += self.sock.recv(65536)
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def read(self):
        line = self.line()
        kind, rest = line[:1], line[1:]
        if kind in (b"+", b":"):
            return rest
        if kind == b"-":
            raise RuntimeError(rest.decode())
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            while len(self.buf) < n + 2:
                self.buf += self.sock.recv(65536)
            data, self.buf = self.buf[:n], self.buf[n + 2:]
            return data
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self.read() for _ in range(n)]
        raise RuntimeError(line)


def main():
    port, mode, n = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    script = sys.argv[4] if len(sys.argv) > 4 else None
    r = Conn(port)
    name = "h"
    keys = [name, name + ":owner", name + ":counter", name + ":permits", name + ":limit", name + ":wake"]
    r.call("FLUSHALL")
    if mode == "module":
        r.call("SEM.ACQUIREFAIR", name, 1, 30, "ID", "h0")
        for k in range(n):
            r.call("SEM.ACQUIREFAIR", name, 1, 30, "ID", "h%d" % (k + 1))
            r.call("SEM.RELEASE", name, "h%d" % k)
            r.call("SEM.ACQUIREFAIR", name, 1, 30, "ID", "h%d" % (k + 1))
        return
    text = open(script, "rb").read()
    if mode == "floor":
        sha = r.call("SCRIPT", "LOAD", text)
        r.call("EVALSHA", sha, 3, *keys[:3], "ACQUIRE", "h0", 30000)
        for k in range(n):
            r.call("EVALSHA", sha, 3, *keys[:3], "ACQUIRE", "h%d" % (k + 1), 30000)
            r.call("EVALSHA", sha, 3, *keys[:3], "RELEASE", "h%d" % k)
            r.call("LPOP", "%s:wake:h%d" % (name, k + 1))
        return
    first = text.split(b"\n", 1)
    sha_oom = r.call("SCRIPT", "LOAD", text)
    sha_acq = r.call("SCRIPT", "LOAD", b"#!lua\n" + first[1])
    r.call("EVALSHA", sha_acq, 6, *keys, "ACQUIREFAIR", 1, 30, "ID", "h0")
    for k in range(n):
        r.call("EVALSHA", sha_acq, 6, *keys, "ACQUIREFAIR", 1, 30, "ID", "h%d" % (k + 1), "LINE")
        r.call("EVALSHA", sha_oom, 6, *keys, "RELEASE", "h%d" % k)
        r.call("LPOP", "%s:wake:h%d" % (name, k + 1))


main()
