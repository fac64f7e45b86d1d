"""Keeping the thread partitions' mirror mirroring after a node of the cluster is lost.

Stream BB_THREAD_PARTITIONS mirrors BB_THREADS (bus/jetstream.py): its leader reads the source
through a consumer of the server's own on the source's leader. When that node dies or stops, the
mirror hears nothing more, and nats-server makes the consumer again only on its own schedule: a
check every 10 s, and 10 s more after each try that failed (the source still electing its leader).
Measured on a 3-node cluster, the mirror stood still for 12 to over 38 s after the source's leader
was killed (1-2 s with the step-down below), and with it every new thread event (issue 29's nemesis: spawns 30-47 s late). A
step-down of the mirror's leader has the next leader set the consumer up at once.

So the replica that relays the log (one at a time) looks every few seconds: when the mirror is
behind its source and has heard nothing from it for a while, it asks the mirror's leader to step
down, and says so in one line. Nothing is lost meanwhile: the events wait in BB_THREADS, and the
mirror takes them from where it stands.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from nats.errors import Error as NatsError

from bb_environments.bus.health import BusHealth, describe
from bb_environments.bus.jetstream import JetStream
from bb_environments.bus.wire import subjects

log = logging.getLogger(__name__)

CHECK_S = 2.0
STALLED_S = 3.0
"""Silence from the source, while events wait there, that counts as a stall: the mirror's consumer
hears from the source at least every second when it is alive (a message or a heartbeat)."""
NUDGE_EVERY_S = 10.0
"""Room for a new leader to set the mirror up before it is nudged again."""
_NS = 1e9


async def keep_mirroring(js: JetStream, health: BusHealth, may_nudge: Callable[[], bool]) -> None:
    """Until cancelled: step the mirror's leader down when it stalled, while `may_nudge()` (this
    replica holds the relay's lease, so that one replica nudges)."""
    bus = health.retry("watching the thread partitions' mirror")
    nudged_at = -NUDGE_EVERY_S
    while True:
        await asyncio.sleep(CHECK_S)
        if not may_nudge() or time.monotonic() < nudged_at + NUDGE_EVERY_S:
            continue
        try:
            waiting, silent_s = await _stall(js)
        except (TimeoutError, NatsError) as error:
            bus.failed(error)  # a stream without its leader: the next look asks again
            continue
        bus.succeeded()
        if waiting and silent_s > STALLED_S:
            nudged_at = time.monotonic()
            await _step_down(js, waiting, silent_s)


async def _stall(js: JetStream) -> tuple[int, float]:
    """How many events wait in the source past the mirror's last, and how long the mirror has
    heard nothing from the source."""
    source = await js.stream_info(subjects.THREADS_STREAM)
    mirror = await js.stream_info(subjects.THREAD_PARTITIONS_STREAM)
    if mirror.mirror is None:
        return 0, 0.0
    waiting = max(0, source.state.last_seq - mirror.state.last_seq)
    active = mirror.mirror.active
    # The server says -1 (or nothing) when this leader of the mirror never heard from the source.
    return waiting, active / _NS if active is not None and active >= 0 else float("inf")


async def _step_down(js: JetStream, waiting: int, silent_s: float) -> None:
    stream = subjects.THREAD_PARTITIONS_STREAM
    silence = f"for {silent_s:.1f} s" if silent_s != float("inf") else "since its leader was elected"
    log.warning(
        "stream %s heard nothing from %s %s while %d thread events waited there: asking its "
        "leader to step down, so that the next one mirrors it again",
        stream,
        subjects.THREADS_STREAM,
        silence,
        waiting,
    )
    try:
        await js.nc.request(f"{js.api_prefix}.STREAM.LEADER.STEPDOWN.{stream}", b"", timeout=5)
    except (TimeoutError, NatsError) as error:
        log.warning(
            "the step-down of stream %s was not answered (%s); asked again if it still stalls", stream, describe(error)
        )
