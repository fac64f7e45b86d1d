"""The workspaces' sizes on disk (SPEC 11): measured by the agent of each host, off every
command's path, and recorded on the environment.

Each pass asks every host for the sizes of the workspaces this replica drives there that were
not measured in the last `interval_s` (or not since this process started): a workspace settled
after its setup is measured at the first pass after it, then every `interval_s`. The host walks
each tree on a worker thread (providers/host/disk_usage.py); a host away is asked again at the
next pass.

A figure is an event (`DiskMeasured`) rather than a note beside the read model: the disk budget
refuses spawns with it, and every replica must decide alike, after a restart too, from the one
thing they share, the log. The log stays small because a figure within 5% of the recorded one
is not recorded (domain/disk.py): it grows with the changes in a workspace's size, not with the
scans.
"""

from __future__ import annotations

import asyncio
import logging
import time
from uuid import UUID

from bb_environments.handlers.ports import Hosts, HostUnavailable, ProviderMissing, Share
from bb_environments.handlers.store import Store
from bb_environments.providers.workspace_messages import DiskUsageRequest

log = logging.getLogger(__name__)


class DiskScanner:
    def __init__(self, store: Store, hosts: Hosts, share: Share, interval_s: float) -> None:
        self._store = store
        self._app = store.app
        self._hosts = hosts
        self._share = share
        self._interval_s = interval_s
        self._measured_at: dict[UUID, float] = {}  # monotonic time of each workspace's last measure

    async def scan(self) -> None:
        """Measure the workspaces due (see the module) and record each figure worth recording."""
        workspaces = await self._store.run(self._app.measurable_workspaces)
        live = {environment_id for environment_id, *_ in workspaces}
        self._measured_at = {key: at for key, at in self._measured_at.items() if key in live}
        now = time.monotonic()
        due: dict[tuple[str, str], list[tuple[UUID, str]]] = {}
        for environment_id, host_id, provider_id, path in workspaces:
            last = self._measured_at.get(environment_id)
            if self._share.drives(environment_id) and (last is None or now - last >= self._interval_s):
                due.setdefault((host_id, provider_id), []).append((environment_id, path))
        for (host_id, provider_id), environments in due.items():
            try:
                await self._measure(host_id, provider_id, environments)
            except Exception:
                log.exception("measuring workspaces on host %s failed; the next pass tries again", host_id)

    async def _measure(self, host_id: str, provider_id: str, environments: list[tuple[UUID, str]]) -> None:
        """One request per workspace, each well within a query's time even for a large tree, and
        the host's new figures recorded in one save. A host that stops answering ends its pass:
        the one it did not answer for goes last at the next (it counts as measured now)."""
        host = self._hosts.host(host_id, provider_id)
        figures = []
        try:
            for environment_id, path in environments:
                self._measured_at[environment_id] = time.monotonic()
                usage = await host.disk_usage(DiskUsageRequest(host_id, [(provider_id, path)]))
                # One left out (removed meanwhile, or a cloud provider's) is asked about again when due.
                if path in usage.bytes:
                    figures.append((environment_id, path, usage.bytes[path]))
        except (HostUnavailable, ProviderMissing) as away:
            log.debug("measuring workspaces on host %s waits: %s", host_id, away)
        if figures:
            await self._store.run(self._app.record_disk_usage, figures)


async def measure_forever(scanner: DiskScanner, tick_s: float) -> None:
    """A pass every `tick_s`; a pass that fails is logged and the next one tries again."""
    while True:
        try:
            await scanner.scan()
        except Exception:
            log.exception("measuring the workspaces' sizes failed; the next pass tries again")
        await asyncio.sleep(tick_s)
