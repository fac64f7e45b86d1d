"""The asyncio face of the event store: every command runs on one writer thread, off the loop.

Group commit: commands that queue up while the writer is busy run one after another as a batch,
each saving (and committing) its own events as before, so every command sees what the ones before
it wrote and a failing command affects no other. A commit survives the process being killed as
soon as it returns; where the store also promises to survive a power loss (the SQLite store with
BB_EVENT_STORE_SYNC=full, see entrypoints/sqlite_event_store.py), the writer puts the batch on disk
with one sync. Only then does it answer the batch's callers and wake whoever forwards new events
(the relay): nobody hears of an event before it is as durable as promised.

Reads of the notification log (the relay's pages, gap fills, the log's head) run on a reader
thread of their own, on another connection: they see only committed events, and a command never
waits behind a page of them.

On a store that other processes write too (handlers/writers.py), a command whose save conflicted
with another writer's lost a race: nothing of it was written, and it runs again, a few times, each
time on what the store holds then. The application's commands take values only, so each run
starts again from the same arguments.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import queue
import random
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ParamSpec, Protocol, TypeVar, runtime_checkable

from eventsourcing.persistence import RecordConflictError

from bb_environments.domain.hook_operations import RecordedHook
from bb_environments.handlers.application import Environments

log = logging.getLogger(__name__)
T = TypeVar("T")
HookSecrets = Callable[[str, str], Awaitable[dict[str, str]]]
"""(operation id, host id) -> the hook's secrets as its variables."""
P = ParamSpec("P")

# A batch is answered at once; a bound keeps the first caller's wait short under a long queue.
BATCH_LIMIT = 64
# The longest pause before a command that lost a race runs again, doubled after each run it lost (up
# to RETRY_PAUSE_CAP_S): a pause at random keeps two writers deciding on one aggregate at one moment
# from meeting there again, and a doubling one lets a writer whose batch keeps the aggregate busy
# (ten spawns on one host through the other replica, on a starved machine) finish it first.
RETRY_PAUSE_S = 0.005
RETRY_PAUSE_CAP_S = 0.25


class CommandConflicted(RuntimeError):
    """A command lost every race it ran for against other writers of the store; nothing of it was saved."""


@runtime_checkable
class DiskSync(Protocol):
    """An event store whose commits need one more step to survive a power loss."""

    def sync_to_disk(self) -> None: ...


@dataclass
class _Command:
    call: functools.partial[Any]
    loop: asyncio.AbstractEventLoop
    answer: asyncio.Future[Any]


class Store:
    def __init__(self, app: Environments) -> None:
        self.app = app
        self._sync = app.factory.sync_to_disk if isinstance(app.factory, DiskSync) else lambda: None
        self._commands: queue.SimpleQueue[_Command | None] = queue.SimpleQueue()
        self._writer = threading.Thread(target=self._write, name="event-store", daemon=True)
        self._writer.start()
        self._log_reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="event-log-reader")

    async def run(self, call: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run a command on the writer thread; its arguments are checked against `call`'s signature.
        It is answered once its events are durable (run again while it loses races, see above)."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[T] = loop.create_future()
        self._commands.put(_Command(functools.partial(call, *args, **kwargs), loop, answer))
        return await answer

    async def read_log(self, call: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run a read of the notification log (never a command) on the reader thread."""
        return await asyncio.get_running_loop().run_in_executor(
            self._log_reader, functools.partial(call, *args, **kwargs)
        )

    def close(self) -> None:
        self._log_reader.shutdown(wait=True)
        self._commands.put(None)  # after every command queued before it
        self._writer.join()
        self.app.close()

    def _write(self) -> None:
        while True:
            batch = [self._commands.get()]
            while batch[-1] is not None and len(batch) < BATCH_LIMIT and not self._commands.empty():
                batch.append(self._commands.get())
            commands = [command for command in batch if command is not None]
            saves_before = self.app.saves
            outcomes = [
                _attempt(command.call, self.app.writers.command_tries, self.app.log_watch.one_run)
                for command in commands
            ]
            # Whoever forwards new events is woken only once the batch's saves are on disk.
            if self.app.saves != saves_before:
                try:
                    self._sync()
                except OSError as failed:
                    # Written, maybe not on disk: no caller may take it as done.
                    outcomes = [(None, failed)] * len(commands)
                try:
                    self.app.on_saved()
                except Exception:
                    # The saves stand, and their callers are answered: a writer thread that died
                    # here would leave every command queued after it waiting for ever.
                    log.exception("waking whoever forwards the log's new events failed")
            # One wake-up per loop for the whole batch: each call_soon_threadsafe writes to the
            # loop's self-pipe, a system call and a turn of the loop per command otherwise.
            answers: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], Any, BaseException | None]]] = {}
            for command, (result, error) in zip(commands, outcomes):
                answers.setdefault(command.loop, []).append((command.answer, result, error))
            for loop, answered in answers.items():
                with contextlib.suppress(RuntimeError):  # its loop has closed: nobody waits for it
                    loop.call_soon_threadsafe(_answer_all, answered)
            if batch[-1] is None:
                return


def _attempt(
    call: functools.partial[Any], tries: int, one_run: Callable[[], contextlib.AbstractContextManager[None]]
) -> tuple[Any, BaseException | None]:
    """The command's result or error, once it ran without losing a race, or `tries` times; each run
    looks at the log's head afresh (`one_run`, see LogWatch)."""
    run = 1
    while True:
        try:
            with one_run():
                return call(), None
        except RecordConflictError as lost:
            if run == tries:
                command = getattr(call.func, "__name__", "a command")
                conflicted = CommandConflicted(
                    f"{command} lost the race to another writer of the event store {tries} "
                    f"{'time' if tries == 1 else 'times'}, nothing of it was saved: {lost}"
                )
                conflicted.__cause__ = lost
                return None, conflicted
        except Exception as error:
            return None, error
        time.sleep(random.uniform(0, min(RETRY_PAUSE_S * 2 ** (run - 1), RETRY_PAUSE_CAP_S)))
        run += 1


def _answer_all(answered: list[tuple[asyncio.Future[Any], Any, BaseException | None]]) -> None:
    for answer, result, error in answered:
        if answer.done():  # its caller was cancelled; the command ran all the same
            continue
        if error is not None:
            answer.set_exception(error)
        else:
            answer.set_result(result)


class StoreLedger:
    """The host agent's account of hook operations when it runs beside the store (`bb serve`)."""

    def __init__(self, store: Store, hook_secrets: HookSecrets | None = None) -> None:
        """`hook_secrets`: the secrets a hook gets (handlers/secrets.py); None: none."""
        self._store = store
        self._hook_secrets = hook_secrets

    async def hook_secrets(self, operation_id: str, host_id: str) -> dict[str, str]:
        return {} if self._hook_secrets is None else await self._hook_secrets(operation_id, host_id)

    async def recorded_hook(self, operation_id: str) -> RecordedHook | None:
        # On the writer thread: the application's indexes and aggregate cache are the writer's alone,
        # and a step the core recorded before asking the agent is already there.
        return await self._store.run(self._store.app.recorded_hook, operation_id)
