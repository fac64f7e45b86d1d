"""The hosts' transcript lines, moved on to the transcripts everyone reads once the log backs them.

A host's agent may publish its lines only under its own host, on
`bb.hosts.<hostId>.transcripts.<environmentId>` (stream BB_TRANSCRIPT_INTAKE), so the subject says
which host wrote a line. The core keeps a line on `bb.transcripts.<environmentId>` (stream
BB_TRANSCRIPTS) only if the log placed that environment on that host and the line is a transcript
line of that same environment (the read model files a line by the environment it names); anything
else is dropped, with one warning line per batch, and acknowledged with the rest.

Each kept line carries a `Nats-Msg-Id` made of its host and the id its agent gave it (a hook's line
is named by its operation and its place in the output), or else its sequence in the intake: a batch
delivered again after the core died between keeping and acknowledging it is stored once. The host
in the id keeps one host's ids from matching, and so silencing, another host's lines.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from uuid import UUID

import msgspec
from nats.aio.msg import Msg

from bb_environments.bus.core.relay import PUBLISH_TIMEOUT_S, Publisher
from bb_environments.bus.wire import subjects
from bb_environments.bus.wire.transcript_lines import TranscriptLine
from bb_environments.providers.host.crash_points import crash_point

log = logging.getLogger(__name__)

HostsOf = Callable[[list[UUID]], Awaitable[dict[UUID, str]]]
"""The host the log placed each of these environments on, for those it has."""

KNOWN_HOSTS = 10_000
"""Environments whose host is remembered (it never changes); past that the memory starts over."""

_line_decoder = msgspec.json.Decoder(TranscriptLine)


class TranscriptIntake:
    def __init__(self, publisher: Publisher, hosts_of: HostsOf) -> None:
        """`publisher`: an AckedPublisher on the service's connection."""
        self._publisher = publisher
        self._hosts_of = hosts_of
        self._hosts: dict[str, str] = {}  # environment id -> the host the log placed it on

    async def handle_batch(self, messages: list[Msg]) -> None:
        """Keep the batch's lines that the log backs, in order, each once in BB_TRANSCRIPTS; raises
        if the stream did not confirm them all (the batch is then delivered again)."""
        written = [
            (message, subjects.host_of(message.subject), subjects.transcript_environment_of(message.subject))
            for message in messages
        ]
        await self._learn_hosts({environment_id for _, _, environment_id in written})
        acks, dropped = [], []
        for message, host_id, environment_id in written:
            if self._hosts.get(environment_id) != host_id or not _is_line_of(message.data, environment_id):
                dropped.append((host_id, message.metadata.sequence.stream))
                continue
            given = (message.headers or {}).get("Nats-Msg-Id")
            line_id = f"{host_id}:{given}" if given else f"{host_id}#{message.metadata.sequence.stream}"
            acks.append(
                await self._publisher.publish_async(
                    subjects.transcript(environment_id), message.data, {"Nats-Msg-Id": line_id}
                )
            )
        if dropped:
            log.warning(
                "dropped %d transcript line(s) of host(s) %s for environments the log did not place on "
                "their host (intake sequences %d to %d)",
                len(dropped),
                ", ".join(sorted({host_id for host_id, _ in dropped})),
                dropped[0][1],
                dropped[-1][1],
            )
        if acks:
            await asyncio.wait_for(asyncio.gather(*acks), PUBLISH_TIMEOUT_S)
            crash_point("transcript-lines-kept")  # kept, not yet acknowledged in the intake

    async def _learn_hosts(self, environment_ids: Iterable[str]) -> None:
        unknown = {
            uuid: environment_id
            for environment_id in environment_ids
            if environment_id not in self._hosts and (uuid := _canonical(environment_id)) is not None
        }
        if not unknown:
            return
        if len(self._hosts) + len(unknown) > KNOWN_HOSTS:
            self._hosts.clear()
        for uuid, host_id in (await self._hosts_of(list(unknown))).items():
            self._hosts[unknown[uuid]] = host_id


def _canonical(environment_id: str) -> UUID | None:
    """The environment id's UUID, if it is one as the log writes it (the transcript's subject)."""
    try:
        uuid = UUID(environment_id)
    except ValueError:
        return None
    return uuid if str(uuid) == environment_id else None


def _is_line_of(data: bytes, environment_id: str) -> bool:
    try:
        return _line_decoder.decode(data).environment_id == environment_id
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return False
