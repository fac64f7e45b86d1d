"""The workspaces' sizes on disk (SPEC 11): measured by the agent of each host, off every
command's path, and recorded on the environment.

A new workspace is measured soon after its setup settled (succeeded, failed or found no script):
the provisioning tells `measure_soon`, and a pass over the workspaces told of in the last
`SETTLING_S` measures them together, so that a burst of new environments costs one pass per host
and one save, rather than a pass and a save per setup while the others start. Then every
`BB_DISK_SCAN_INTERVAL_S` a scan asks each host for the size of every workspace this replica
drives there that has settled; a figure missed after setup (the host away, a replica's restart)
is taken at the next scan. The host walks each tree on a worker thread
(providers/host/disk_usage.py).

A figure is an event (`DiskMeasured`) rather than a note beside the read model: the disk budget
refuses spawns with it, and every replica must decide alike, after a restart too, from the one
thing they share, the log. The log stays small because a figure within 5% of the recorded one
is not recorded (domain/disk.py): it grows with the changes in a workspace's size, not with the
scans.
"""

from __future__ import annotations

import asyncio
import logging
from uuid import UUID

from bb_environments.handlers.ports import Hosts, HostUnavailable, ProviderMissing, Share
from bb_environments.handlers.store import Store
from bb_environments.providers.workspace_messages import DiskUsageRequest

log = logging.getLogger(__name__)

SETTLING_S = 2.0
"""How long after a setup settles its workspace waits to be measured, with the others settling then."""


class DiskScanner:
    def __init__(self, store: Store, hosts: Hosts, share: Share) -> None:
        self._store = store
        self._app = store.app
        self._hosts = hosts
        self._share = share
        self._settled: set[UUID] = set()
        self._told = asyncio.Event()

    def measure_soon(self, environment_id: UUID) -> None:
        """The environment's setup has settled: its workspace is measured at the next pass."""
        self._settled.add(environment_id)
        self._told.set()

    async def measure_settled_forever(self, settling_s: float = SETTLING_S) -> None:
        """A pass over the workspaces whose setup settled, `settling_s` after the first of them
        was told; one that fails is logged, and the periodic scan measures them later."""
        while True:
            await self._told.wait()
            await asyncio.sleep(settling_s)
            self._told.clear()
            settled, self._settled = self._settled, set()
            try:
                await self.scan(among=settled)
            except Exception:
                log.exception("measuring the new workspaces failed; the next scan measures them")

    async def scan(self, among: set[UUID] | None = None) -> None:
        """Measure the workspaces (see the module), or those of `among`, and record each figure
        worth recording."""
        by_host: dict[tuple[str, str], list[tuple[UUID, str]]] = {}
        measurable = await self._store.run(self._app.measurable_workspaces, among)
        for environment_id, host_id, provider_id, path in measurable:
            if self._share.drives(environment_id):
                by_host.setdefault((host_id, provider_id), []).append((environment_id, path))
        for (host_id, provider_id), environments in by_host.items():
            try:
                await self._measure(host_id, provider_id, environments)
            except Exception:
                log.exception("measuring workspaces on host %s failed; the next scan tries again", host_id)

    async def _measure(self, host_id: str, provider_id: str, environments: list[tuple[UUID, str]]) -> None:
        """One request per workspace, each well within a query's time even for a large tree, and
        the host's new figures recorded in one save. A host that stops answering ends its part of
        the scan."""
        host = self._hosts.host(host_id, provider_id)
        figures = []
        try:
            for environment_id, path in environments:
                usage = await host.disk_usage(DiskUsageRequest(host_id, [(provider_id, path)]))
                # One left out (removed meanwhile, or a cloud provider's) has no figure this time.
                if path in usage.bytes:
                    figures.append((environment_id, path, usage.bytes[path]))
        except (HostUnavailable, ProviderMissing) as away:
            log.debug("measuring workspaces on host %s waits: %s", host_id, away)
        if figures:
            await self._store.run(self._app.record_disk_usage, figures)


async def measure_forever(scanner: DiskScanner, interval_s: float) -> None:
    """A scan every `interval_s`, the first one `interval_s` after the start; a scan that fails is
    logged and the next one tries again."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            await scanner.scan()
        except Exception:
            log.exception("measuring the workspaces' sizes failed; the next scan tries again")
