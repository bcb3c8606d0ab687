"""What a test can see of other processes, read from /proc (Linux): children, command lines, CPU
time, whether a process still runs, and which of them hold a TCP connection on a port."""

from __future__ import annotations

import os
from pathlib import Path

PROC = Path("/proc")
_ESTABLISHED = "01"


def children(pid: int) -> list[int]:
    found: list[int] = []
    for task in (PROC / str(pid) / "task").glob("*/children"):
        try:
            found.extend(int(child) for child in task.read_text().split())
        except OSError:
            continue
    return found


def descendants(pid: int) -> list[int]:
    found = children(pid)
    index = 0
    while index < len(found):
        found.extend(children(found[index]))
        index += 1
    return found


def cmdline(pid: int) -> str:
    try:
        return (PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name, in parentheses, may hold spaces: the fields after it are split.
    return raw[raw.rindex(")") + 2 :].split()


def running(pid: int) -> bool:
    """Alive and not a zombie waiting to be reaped."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] != "Z"


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of the process (0 once it is gone)."""
    fields = _stat_fields(pid)
    if fields is None:
        return 0.0
    ticks = int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    return ticks / os.sysconf("SC_CLK_TCK")


def _socket_inodes(pid: int) -> set[str]:
    inodes: set[str] = set()
    try:
        links = list((PROC / str(pid) / "fd").iterdir())
    except OSError:
        return inodes
    for link in links:
        try:
            target = os.readlink(link)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def holds_connection_on(pid: int, port: int, peer_port: int | None = None) -> bool:
    """Whether the process has an established TCP connection whose local port is ``port`` (and,
    given ``peer_port``, whose other end is that port: which server process took one client's
    connection)."""
    inodes = _socket_inodes(pid)
    for table in ("tcp", "tcp6"):
        try:
            lines = (PROC / str(pid) / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            remote_port = int(fields[2].rsplit(":", 1)[1], 16)
            if (
                local_port == port
                and (peer_port is None or remote_port == peer_port)
                and fields[3] == _ESTABLISHED
                and fields[9] in inodes
            ):
                return True
    return False
