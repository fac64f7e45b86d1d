"""What this host keeps on disk of each environment's create attempts: which it removed, and the
newest it began. Together they keep a create or a cleanup that arrives late from undoing work
the core has moved past.

A create can reach a host after the removal of what it would make: a job delivered again because
its acknowledgement was lost while a NATS node was away (its report long taken, its environment
since removed), or a job queued before its environment was cancelled and removed by a core that
was not waiting for it. Done, it would make a workspace no live environment has. So a removal
first records the attempts it ends (a cleanup the failed attempt and those before it, the
environment's removal every attempt), durably, before it deletes anything; a create of a recorded
attempt is refused.

A cleanup can reach a host after the next attempt began: a replica frozen while it asked, or the
job delivered again, while another replica saw the cleanup done and went on. The core begins an
attempt only once the cleanup of the one before it was done, so such a cleanup is a repeat.
Carried out, it would end the hooks of the attempt now running (their cgroups are the
environment's) and remove a workspace the new attempt may share. So a create records its attempt
as begun before it makes anything, and a cleanup of an older attempt touches nothing.

A kill at any line leaves each record whole or absent, and absent only while nothing was done
yet: the request, delivered again, records it again.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

from bb_environments.providers.host.durable_files import write_durably

EVERY_ATTEMPT = "every"
"""The removal record of an environment whose removal started: no create of it is wanted any more."""
KEPT_FOR_S = 7 * 24 * 3600
"""How long a record is kept: a late request comes within seconds (a redelivery, or the rest of
its host's queue); a week covers an agent away that long with the job still queued."""
FORGET_EVERY_S = 3600


class _Records:
    """One small file per environment in `directory`, forgotten after KEPT_FOR_S."""

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        self._next_forgetting = 0.0

    def read(self, environment_id: str) -> str | None:
        try:
            return self._path(environment_id).read_text()
        except FileNotFoundError:
            return None

    def write(self, environment_id: str, value: str) -> None:
        self._directory.mkdir(parents=True, exist_ok=True)
        self._forget_old()
        write_durably(self._path(environment_id), value.encode())

    def _path(self, environment_id: str) -> Path:
        # The id comes with a request: only a UUID names a file, nothing outside the directory.
        try:
            return self._directory / str(uuid.UUID(environment_id))
        except ValueError:
            raise ValueError(f"the environment id {environment_id!r} is not a UUID") from None

    def _forget_old(self) -> None:
        if time.time() < self._next_forgetting:
            return
        self._next_forgetting = time.time() + FORGET_EVERY_S
        oldest = time.time() - KEPT_FOR_S
        for entry in os.scandir(self._directory):
            try:
                if entry.stat().st_mtime < oldest:
                    Path(entry.path).unlink()
            except FileNotFoundError:
                pass  # forgotten by a removal of another host's environment meanwhile


class RemovedAttempts:
    def __init__(self, directory: Path) -> None:
        self._records = _Records(directory)

    def record(self, environment_id: str, through_attempt: int | None) -> None:
        """No create of `environment_id`'s attempts up to `through_attempt` (None: any) is made again."""
        known = self._records.read(environment_id)
        if known == EVERY_ATTEMPT or (
            through_attempt is not None and known is not None and int(known) >= through_attempt
        ):
            return
        self._records.write(environment_id, EVERY_ATTEMPT if through_attempt is None else str(through_attempt))

    def removed(self, environment_id: str, attempt: int) -> bool:
        known = self._records.read(environment_id)
        return known is not None and (known == EVERY_ATTEMPT or attempt <= int(known))


class BegunAttempts:
    def __init__(self, directory: Path) -> None:
        self._records = _Records(directory)

    def record(self, environment_id: str, attempt: int) -> None:
        """A create of `attempt` begins here. The first attempt supersedes none, so only a later
        one is written: a spawn's create, nearly always the first, costs no write of its own."""
        if attempt > 1 and (self.newest(environment_id) or 0) < attempt:
            self._records.write(environment_id, str(attempt))

    def newest(self, environment_id: str) -> int | None:
        known = self._records.read(environment_id)
        return None if known is None else int(known)

    def superseded(self, environment_id: str, attempt: int) -> bool:
        """Whether a later attempt than `attempt` began here."""
        newest = self.newest(environment_id)
        return newest is not None and newest > attempt
