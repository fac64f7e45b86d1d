"""Which TCP ports something listens on on this machine: what a block of ports leased to a new
environment must not hold (SPEC 11). Asked with every plan, on the host the plan is for, since the
core may run on another machine.

Read from the kernel's socket tables (/proc/net/tcp and tcp6), which lists every listener of every
user without connecting to any; a machine without them (not Linux) reports none.
"""

from __future__ import annotations

from pathlib import Path

_TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))
_LISTEN = "0A"  # the state column's value for a listening socket


def listening_ports(tables: tuple[Path, ...] = _TABLES) -> tuple[int, ...]:
    ports: set[int] = set()
    for table in tables:
        try:
            lines = table.read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            columns = line.split()
            if len(columns) > 3 and columns[3] == _LISTEN:
                ports.add(int(columns[1].rsplit(":", 1)[1], 16))
    return tuple(sorted(ports))
