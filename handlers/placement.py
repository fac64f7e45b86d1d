"""Deciding where a thread's environment will live, before anything is written or touched.

Everything a request can get wrong is found here (unknown provider, malformed inputs, a refused
branch name, a project that is not a repository) and answered with an error that names the field
and what is allowed. The claim is planned here from the provider's profile; the checks that touch
the workspace's host (its filesystem, the provider's own validation) are asked of that host.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from bb_environments.domain.ids import HOST_ID_PATTERN, HOST_ID_RULE, ID_PATTERN, ID_RULE, quoted
from bb_environments.domain.request_errors import InvalidInput, Refused
from bb_environments.handlers.commands import NewEnvironment
from bb_environments.handlers.ports import Hosts, HostUnavailable
from bb_environments.providers.contract import BaseHead, InvalidInputs, PlanRefused, Policy, ProviderMissing
from bb_environments.providers.planning import check_within_roots
from bb_environments.providers.registry import ProviderProfile
from bb_environments.providers.workspace_messages import PlanRequest


@dataclass(frozen=True)
class Placement:
    """Where a thread's new environment will live, decided before anything is written: what
    the application service's claim takes (handlers/thread_use_cases.py)."""

    provider_id: str
    host_id: str
    project_path: str | None
    inputs: Any
    path_key: str
    claimed_path: str | None
    shares_claimed_path: bool = False
    """A live environment of the same provider holding the path takes the thread (see the contract)."""
    planned: bool = True
    """False: placed while the host's agent was away, planned on the host before its create."""
    listening: tuple[int, ...] = ()
    """The ports something listened on on the host when it planned: none is leased (SPEC 11)."""
    base_head: BaseHead | None = None
    """Where a pool's member would be prepared now, when asked (SPEC 10): only one prepared there
    is bound to the thread."""


THREAD_ID = re.compile(ID_PATTERN)
HOST_ID = re.compile(HOST_ID_PATTERN)


def check_thread_id(thread_id: str) -> str:
    if not THREAD_ID.match(thread_id):
        raise InvalidInput(f"thread id {quoted(thread_id)} is not allowed: use {ID_RULE}")
    return thread_id


def check_host_id(host_id: str) -> str:
    if not HOST_ID.match(host_id):
        raise InvalidInput(f"host id {quoted(host_id)} is not allowed: use {HOST_ID_RULE}")
    return host_id


def check_environment_id(text: str) -> UUID:
    try:
        return UUID(text)
    except ValueError:
        raise InvalidInput(f"environment id {quoted(text)} is not a valid id (expected a UUID)") from None


class Placer:
    def __init__(
        self,
        hosts: Hosts,
        host_id: str = "local",
        known_hosts: Callable[[], Awaitable[list[str]]] | None = None,
        project_roots: tuple[str, ...] | None = None,
        *,
        default_host: str | None = None,
        agent_here: bool = True,
    ) -> None:
        """`known_hosts`: the hosts environments may be placed on (default: this service's own);
        `project_roots`: the canonical directories a project must lie in (None: anywhere);
        `default_host`: where a spawn that names no host goes (None: this service's own host, if
        known); `agent_here`: whether the agent of this service's own host runs in it."""
        self._hosts = hosts
        self.host_id = host_id
        self._known_hosts = known_hosts
        self._project_roots = project_roots
        self._default_host = default_host
        self._agent_here = agent_here
        self.pooled: frozenset[tuple[str, str]] = frozenset()
        """The (host, provider) pairs some pool keeps members for (handlers/pool_keeper.py)."""

    def profile(self, provider_id: str) -> ProviderProfile:
        """The profile of a provider of this service's host; an unknown one is refused."""
        profile = self._hosts.profiles().get(provider_id)
        if profile is None:
            raise self._unknown(provider_id)
        return profile

    def pooling_profiles(self) -> list[ProviderProfile]:
        """The providers a warm pool may keep environments of (their policy says so)."""
        return [profile for profile in self._hosts.profiles().values() if profile.policy.pool]

    async def inputs(self, provider_id: str, inputs: Any) -> Any:
        """A request's inputs as the log keeps them: as their provider's type reads them."""
        profile = self.profile(provider_id)
        try:
            return await self._hosts.inputs(profile.id, inputs)
        except InvalidInputs as refused:
            raise InvalidInput(str(refused)) from None

    async def project(self, project_path: str | None, host_id: str) -> str | None:
        """The project path as a placement on `host_id` records it (as given, while the host is away)."""
        try:
            return await self._hosts.host(host_id).canonical_project(host_id, project_path)
        except InvalidInputs as refused:
            raise InvalidInput(str(refused)) from None
        except HostUnavailable:
            return project_path

    async def check_known(self, host_id: str) -> str:
        if host_id == self.host_id and self._agent_here:
            return host_id  # always known: a spawn on the service's own host waits on nobody to say so
        known = await self._known()
        if host_id not in known:
            raise InvalidInput(
                f"host {host_id!r} is not registered; the hosts are: {', '.join(known) or 'none'} "
                "(`bb machine register` adds one)"
            )
        return host_id

    async def default_host(self) -> str:
        """The host of a spawn that names none: BB_DEFAULT_HOST, else this service's own while an
        agent serves it; otherwise the spawn is refused, naming the hosts there are."""
        if self._default_host is not None:
            return self._default_host
        if self._agent_here:
            return self.host_id
        known = await self._known()
        if self.host_id in known:
            return self.host_id
        raise InvalidInput(
            f"the spawn names no host and this service's own host {self.host_id!r} has no agent: "
            f"name one (--host, or the thread event's hostId); the hosts are: {', '.join(known) or 'none'} "
            "(`bb machine register` adds one, BB_DEFAULT_HOST names the one a spawn goes to by default)"
        )

    async def _known(self) -> list[str]:
        return await self._known_hosts() if self._known_hosts else [self.host_id]

    async def place(
        self, thread_id: str, intent: NewEnvironment, project_path: str | None, host_id: str, *, member: bool = False
    ) -> Placement:
        """Where the thread's new environment lives; while its host's agent is away, the plan the
        host makes is left for the environment's first step (its path is claimed then). Where a
        pool of the host and provider is kept, the plan also reads where a member would be
        prepared now, which the binding checks. `member`: place a pool's member (`thread_id` is
        its path key then)."""
        profile = self.profile(intent.provider_id)
        await self.check_known(host_id)
        path_key = _path_key(profile.policy, thread_id, 1, thread_id)
        # One trip to the host: it canonicalises the project and checks it against the roots before
        # git runs in it (whoever holds the publisher seed names the project, and so whose hooks run).
        request = PlanRequest(
            host_id,
            profile.id,
            project_path,
            intent.inputs,
            path_key,
            self._project_roots,
            base_head=(host_id, profile.id) in self.pooled,
            member=member,
        )
        try:
            plan = await self._hosts.host(host_id, profile.id).plan(request)
        except HostUnavailable:
            if member:
                raise
            self._refuse_outside_roots(project_path)
            return Placement(
                provider_id=profile.id,
                host_id=host_id,
                project_path=project_path,
                inputs=intent.inputs,
                path_key=path_key,
                claimed_path=None,
                planned=False,
            )
        except InvalidInputs as refused:
            raise InvalidInput(str(refused)) from None
        except PlanRefused as refused:
            raise Refused(str(refused)) from None
        except ProviderMissing:
            raise self._unknown(profile.id) from None
        # A subdirectory's repository may reach outside; and an agent of an earlier release reads no roots.
        self._refuse_outside_roots(plan.project_path)
        return Placement(
            provider_id=profile.id,
            host_id=host_id,
            project_path=plan.project_path,
            inputs=plan.inputs,
            path_key=path_key,
            claimed_path=plan.claimed_path,
            shares_claimed_path=plan.shares_claimed_path,
            listening=plan.listening,
            base_head=plan.base_head,
        )

    async def next_attempt(
        self,
        provider_id: str,
        thread_id: str,
        attempt: int,
        host_id: str,
        project_path: str | None,
        inputs: Any,
        path_key: str,
    ) -> tuple[str, str | None]:
        """The path key and claimed path of the attempt after `attempt`."""
        profile = self.profile(provider_id)
        next_key = _path_key(profile.policy, thread_id, attempt + 1, path_key)
        try:
            claimed = await self._hosts.host(host_id, profile.id).planned_path(
                PlanRequest(host_id, profile.id, project_path, inputs, next_key)
            )
        except InvalidInputs as refused:
            raise InvalidInput(str(refused)) from None
        return next_key, claimed

    def _refuse_outside_roots(self, project_path: str | None) -> None:
        try:
            check_within_roots(project_path, self._project_roots)
        except InvalidInputs as refused:
            raise InvalidInput(str(refused)) from None

    def _unknown(self, provider_id: str) -> InvalidInput:
        available = ", ".join(self._hosts.profiles()) or "none"
        return InvalidInput(f"unknown environment provider {provider_id!r}; available: {available}")


def _path_key(policy: Policy, thread_id: str, attempt: int, per_thread_key: str) -> str:
    """One key for every attempt of a thread's environment, or one per attempt (the policy's choice)."""
    return per_thread_key if policy.path_keys == "per-thread" else f"{thread_id}-{attempt}"
