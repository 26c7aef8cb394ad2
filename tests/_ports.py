"""A free TCP port for a server a test starts (the browser tests' Jupyter servers, the real ``mlflow server``)."""

from __future__ import annotations

import random
import socket
from pathlib import Path

HOST = "127.0.0.1"


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def free_port() -> int:
    """A TCP port free on loopback right now (the server is told to fail rather than move), chosen below the
    kernel's ephemeral range where there is one: a port the kernel handed out is also the source port of any new
    outgoing connection (a browser's, a kernel's ZMQ sockets'), and one of those took a server's port between this
    check and the server's bind ("port 53339 is already in use", once in a fresh-clone run)."""
    low = _ephemeral_low()
    # the OS's randomness, not the random module's generator: tests seed that (Trainer(seed=0), the doctests), and
    # two suites side by side then drew the same ports; one's mlflow server answered the other's test, then went
    # away under it ("Connection refused", loaded trial 33)
    draw = random.SystemRandom()
    for _ in range(50 if low > 20_000 else 0):
        port = draw.randrange(20_000, low)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((HOST, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]
