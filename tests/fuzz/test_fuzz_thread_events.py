"""Fuzz: whatever arrives on bb.threads.>, the consumer's handler refuses it in one log line or
acts on it; it never raises, never logs content, and a refusal writes nothing.

The seam is `ThreadEventConsumer.handle`, exactly what `bb serve`'s consumer calls for each message,
with the real thread handlers over an SQLite event store seeded with threads and environments
the hostile ids aim at. A `created` event that is accepted is followed by the thread's first
message, as a publisher would send it: that is when its hostile values meet placement.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import msgspec
from hypothesis import example, given

from bb_environments.bus.core.thread_consumer import ThreadEventConsumer
from bb_environments.bus.wire import subjects
from bb_environments.bus.wire.thread_events import inbound_decoder
from bb_environments.providers.registry import ProviderRegistry
from tests.fuzz.seams import LogLines, ServiceWorld, fuzz_settings, one_sentence, working_directory
from tests.fuzz.strategies import CANARY, thread_events

REFUSED = ("refused a thread event on ", "ignored a message for unknown thread ")


def decodes(data: bytes) -> bool:
    try:
        inbound_decoder.decode(data)
    except (msgspec.DecodeError, RecursionError):
        return False
    return True


def created(thread_id: str, **fields: object) -> tuple[str, bytes]:
    return f"bb.threads.{thread_id}.created", json.dumps({"type": "created", "threadId": thread_id, **fields}).encode()


def stored(subject: str) -> str:
    """The subject as the consumer reads it from its partition (which partition does not matter here)."""
    return subjects.thread_partition(0).removesuffix(">") + subject.removeprefix("bb.threads.")


class HeardRefusals:
    """The placements port of the consumer, keeping the reasons it would tell the publisher."""

    def __init__(self) -> None:
        self.reasons: list[str] = []

    async def refused_at_edge(self, subject_thread_id: str, reason: str, refused: object) -> None:
        self.reasons.append(reason)


def test_no_thread_event_crashes_the_consumer_or_is_written_when_refused(tmp_path: Path, micro, edge) -> None:
    world = ServiceWorld(tmp_path, ProviderRegistry.from_entry_points(), micro, edge)
    seeded = world.seeded
    plain, _, line_break = seeded.project_dirs
    cwd_before, seeded_files = working_directory(), world.files()

    def handled(subject: str, data: bytes) -> LogLines:
        """The lines the consumer logged for one message, each checked: one line, no content, no error."""
        heard = HeardRefusals()
        consumer = ThreadEventConsumer(world.threads, heard, world.provisioner)  # type: ignore[arg-type]
        with LogLines().installed() as logs:
            world.run(consumer.handle(world.nats.message(stored(subject), data)))
            world.settle()
        assert not [r for r in logs.records if r.levelno >= logging.ERROR], logs.lines()
        for line in logs.lines():
            assert one_sentence(line) and CANARY not in line, line
        # What the publisher hears of a refusal carries none of its event either.
        for reason in heard.reasons:
            assert one_sentence(reason) and CANARY not in reason, reason
        return logs

    @fuzz_settings()
    @given(
        thread_events(seeded.thread_ids, (seeded.ready_environment, seeded.removed_environment), seeded.project_dirs)
    )
    # Found by this test: a field name with a line break forged a log line; a project path with a
    # NUL raised ValueError out of the consumer, one with a line break split a refusal in two.
    @example(("bb.threads.t1.archived", b'{"type": "archived", "threadId": "t1", "t1\\n": "CANARY-7f3a"}'))
    @example(
        created(
            "nul",
            projectPath=plain + "\x00",
            environment={"type": "provider", "environmentProviderId": "project-checkout"},
        )
    )
    @example(
        created(
            "newline", projectPath=line_break, environment={"type": "provider", "environmentProviderId": "git-worktree"}
        )
    )
    def check(event: tuple[str, bytes]) -> None:
        subject, data = event
        head = world.head()
        refusals = [line for line in handled(subject, data).lines() if line.startswith(REFUSED)]
        assert len(refusals) <= 1, refusals
        if refusals:
            assert refusals[0].split(": ", 1)[-1].strip(), refusals[0]  # it says why
            assert world.head() == head, "a refused event was written"
        else:
            assert decodes(data), "an event the decoder refuses was acted on"
            if world.head() != head and subject.endswith(".created"):
                thread_id = subject.split(".")[2]
                first_message = {"type": "message", "threadId": thread_id}
                handled(f"bb.threads.{thread_id}.message", msgspec.json.encode(first_message))
        world.check_what_was_kept(head, seeded_files)

    try:
        check()
        assert working_directory() == cwd_before
        assert not list(world.markers.iterdir()), "a hook ran"
    finally:
        world.close()
