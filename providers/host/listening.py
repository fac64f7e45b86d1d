"""Which TCP ports something listens on on this machine: what a block of ports leased to a new
environment must not hold (SPEC 11). Asked with every plan, on the host the plan is for, since the
core may run on another machine.

Read from the kernel's socket tables (/proc/net/tcp and tcp6), which lists every listener of every
user without connecting to any; a machine without them (not Linux) reports none. The kernel writes
a line for every socket of the machine, listening or not, so a burst of plans shares one read
(`ListeningPorts`) instead of each making its own: read per plan, it was most of a burst's CPU.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
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


FRESH_S = 0.5
"""How long one read of the tables answers the plans that ask after it. A listener started within
that time of the read is missed, as one started just after the plan would be anyway."""


class ListeningPorts:
    """The listening ports as of a read at most FRESH_S old, shared by the plans asking meanwhile."""

    def __init__(
        self,
        read: Callable[[], tuple[int, ...]] = listening_ports,
        fresh_s: float = FRESH_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._read = read
        self._fresh_s = fresh_s
        self._clock = clock
        self._reading: asyncio.Future[tuple[int, ...]] | None = None
        self._read_at = 0.0

    async def now(self) -> tuple[int, ...]:
        if self._reading is None or self._clock() - self._read_at > self._fresh_s:
            self._read_at = self._clock()
            self._reading = asyncio.ensure_future(asyncio.to_thread(self._read))
        return await asyncio.shield(self._reading)
