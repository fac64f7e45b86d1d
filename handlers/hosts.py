"""Which `Host` does a host's work: here, the core's own, or the host's agent over the bus.

- here: the host whose agent runs in this process (`bb serve` without `--no-agent`) is served by
  its `LocalHost` directly: its workspaces under its root, its hooks through its guard;
- the core's own: the cloud providers' work (Modal: the resource lives in no host's filesystem)
  is the core's, its data under the core's data dir, whichever host the environment names;
- remote: every other host's work goes to its agent over the bus (`RemoteHost`), queued for it
  however long it is away.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from bb_environments.handlers.ports import Host, ProviderMissing
from bb_environments.providers.planning import decode_inputs
from bb_environments.providers.registry import ProviderProfile, ProviderRegistry


class HostRouter:
    def __init__(
        self,
        registry: ProviderRegistry,
        core: Host,
        remote: Host,
        here: Host | None = None,
        host_here: str | None = None,
    ) -> None:
        """`core`: the host of the core's own (cloud) providers; `here`: the host `host_here`,
        whose agent runs in this process (None: every host's agent is elsewhere)."""
        self._registry = registry
        self._profiles = registry.profiles()
        self._cloud_providers = registry.cloud_ids()
        self._core = core
        self._remote = remote
        self._here = here
        self._host_here = host_here if here is not None else None

    def host(self, host_id: str, provider_id: str | None = None) -> Host:
        if provider_id in self._cloud_providers:
            return self._core
        if host_id == self._host_here and self._here is not None:
            return self._here
        return self._remote

    def profiles(self) -> Mapping[str, ProviderProfile]:
        return self._profiles

    async def inputs(self, provider_id: str, inputs: Any) -> Any:
        provider = self._registry.get(provider_id)
        if provider is None:
            raise ProviderMissing(f"the environment provider {provider_id!r} is not registered")
        return msgspec.to_builtins(decode_inputs(provider, inputs))
