"""The providers this service knows: every entry point in group `bb.environment_providers`, and
what each declares of itself for the core (its profile) and for `bb providers` (its description)."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from importlib.metadata import EntryPoint, entry_points
from typing import Any

import msgspec

from bb_environments.providers.contract import (
    Availability,
    EnvironmentProvider,
    Policy,
    ProjectContext,
    Requires,
    is_pausable,
    runs_in_the_cloud,
)

ENTRY_POINT_GROUP = "bb.environment_providers"
log = logging.getLogger(__name__)


class ProviderProfile(msgspec.Struct, frozen=True, rename="camel"):
    """What a host's provider declares once, for the core to decide with instead of its code: how
    its environments are shared and retired, what it requires, its inputs' JSON Schema."""

    id: str
    display_name: str
    requires: Requires
    inputs: dict[str, Any] | None
    policy: Policy
    pausable: bool


# A provider as `bb providers` shows it: its profile and whether it can create now. (A comment: a
# docstring would become the published schema's description.)
class ProviderDescription(msgspec.Struct, rename="camel"):
    id: str
    display_name: str
    requires: Requires
    inputs: dict[str, Any] | None
    policy: Policy
    availability: Availability

    @classmethod
    def of(cls, profile: ProviderProfile, availability: Availability) -> ProviderDescription:
        return cls(profile.id, profile.display_name, profile.requires, profile.inputs, profile.policy, availability)


def inputs_schema(provider: EnvironmentProvider) -> dict[str, Any] | None:
    return msgspec.json.schema(provider.inputs_type) if provider.inputs_type is not None else None


class ProviderRegistry:
    def __init__(self, providers: Iterable[EnvironmentProvider]) -> None:
        self._providers = {p.id: p for p in providers}

    @classmethod
    def from_entry_points(cls, extra: Iterable[str] = ()) -> ProviderRegistry:
        """Every installed provider, plus `module:Class` references (a provider under development)."""
        references = [(e.name, e.value) for e in entry_points(group=ENTRY_POINT_GROUP)]
        references += [(reference, reference) for reference in extra]
        loaded = []
        for name, reference in references:
            try:
                loaded.append(EntryPoint(name, reference, ENTRY_POINT_GROUP).load()())
            except Exception:
                log.exception("provider %s could not be loaded; it is left out", name)
        return cls(loaded)

    def get(self, provider_id: str) -> EnvironmentProvider | None:
        return self._providers.get(provider_id)

    def ids(self) -> list[str]:
        return sorted(self._providers)

    def cloud_ids(self) -> frozenset[str]:
        """The providers the core calls itself, wherever their environments' hosts are."""
        return frozenset(i for i, p in self._providers.items() if runs_in_the_cloud(p))

    def profiles(self) -> dict[str, ProviderProfile]:
        """Each provider's profile, by id in id order."""
        return {
            p.id: ProviderProfile(
                id=p.id,
                display_name=p.display_name,
                requires=p.requires,
                inputs=inputs_schema(p),
                policy=p.policy,
                pausable=is_pausable(p),
            )
            for p in (self._providers[i] for i in self.ids())
        }


def safe_availability(provider: EnvironmentProvider, context: ProjectContext) -> Availability:
    try:
        answer = provider.availability(context)
    except Exception as error:
        return Availability("blocked", f"could not determine availability: {error}")
    if not isinstance(answer, Availability):
        return Availability("blocked", "the provider returned an invalid availability result")
    return answer
