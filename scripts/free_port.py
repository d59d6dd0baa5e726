#!/usr/bin/env python3
"""Prints a free TCP port on 127.0.0.1 for a server a test starts; `free_port` is the same for Python
callers. The port comes from 10000 up, outside the kernel's ephemeral range, so no outgoing
connection (the gateway's own, to an upstream or a database) can take it between this check and the
server's bind, as a port from `bind(0)` could. Where that range leaves none, the kernel picks one."""

import random
import socket


def ephemeral_range():
    """The kernel's ephemeral port range (32768-60999 where it cannot be read)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as ports:
            low, high = (int(end) for end in ports.read().split()[:2])
            return low, high
    except (OSError, ValueError):
        return 32768, 60999


def free_port(taken=frozenset()):
    """A port free now and not in `taken`."""
    low, high = ephemeral_range()
    start = random.randrange(55536)
    for step in range(55536):
        port = 10000 + (start + step) % 55536
        if low <= port <= high or port in taken:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port not in taken:
            return port


if __name__ == "__main__":
    print(free_port())
