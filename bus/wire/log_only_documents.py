"""The documents of the log's thread, claim and host facts, as msgspec structs: stored in the log
and exported with it, never re-published (only the service reads `bb.log.>`).

They are documents like the environment events (bus/wire/documents.py), and under the same rule:
the bytes of a stored fact stay the same, so a field is never renamed or moved, and a new one is
added last.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any
from uuid import UUID

import msgspec

from bb_environments.bus.wire.descriptions import said as _said
from bb_environments.bus.wire.documents import Document, LeasedPorts, Slug


class ThreadEvent(Document):
    thread_id: Annotated[str, msgspec.Meta(description="The thread's id, as its publisher named it.")]
    version: Annotated[int, msgspec.Meta(description="The thread's version after this event (gap-free).")]


class ThreadRegisteredDocument(ThreadEvent, kw_only=True, tag="thread_registered"):
    """A thread became known to the service (its `created` event, or `bb thread spawn`), with its
    project, parent and host."""

    project_path: Annotated[str | None, _said("The thread's project, or null.")]
    parent_thread_id: Annotated[str | None, _said("The thread's parent, or null.")]
    host_id: Annotated[str, _said("The host its environment runs on.")]


class ThreadEnvironmentAssignedDocument(ThreadEvent, kw_only=True, tag="thread_environment_assigned"):
    """The thread got environment `environmentId` (a new one, or one it joined)."""

    environment_id: Annotated[str, _said("The environment the thread uses now.")]


class ThreadEnvironmentRequestedDocument(ThreadEvent, kw_only=True, tag="thread_environment_requested"):
    """The thread's first message asked for an environment; recorded before one is given, so a crash
    cannot lose the request."""


class ThreadEnvironmentLeftDocument(ThreadEvent, kw_only=True, tag="thread_environment_left"):
    """The thread no longer uses environment `environmentId` (its message was cancelled, or it was
    unarchived after the environment ended)."""

    environment_id: Annotated[str, _said("The environment the thread left.")]


class ThreadRefusedDocument(ThreadEvent, kw_only=True, tag="thread_refused"):
    """The thread's request for an environment was refused (`message`: a blocked provider, a claimed
    path, ...); `bb thread list` shows it as `refusal`."""

    message: Annotated[str, _said("Why the thread got no environment, in one sentence.")]


class ThreadArchivedDocument(ThreadEvent, kw_only=True, tag="thread_archived"):
    """The thread was archived; its environment retires once no live thread uses it."""


class ThreadUnarchivedDocument(ThreadEvent, kw_only=True, tag="thread_unarchived"):
    """The thread was unarchived; it rejoins its environment if that is still live."""


class ClaimEvent(Document):
    claim_id: Annotated[str, msgspec.Meta(description="The claim's id (a UUID derived from the host and the path).")]
    version: Annotated[int, msgspec.Meta(description="The claim's version after this event (gap-free).")]
    host_id: Annotated[str, msgspec.Meta(description="The host the path is on.")]
    path: Annotated[str, msgspec.Meta(description="The claimed path, in canonical form (symlinks resolved).")]
    environment_id: Annotated[str | None, msgspec.Meta(description="The environment taking or giving up the path.")]


class ClaimTakenDocument(ClaimEvent, kw_only=True, tag="claim_taken"):
    """A path (its canonical form) on a host was claimed for environment `environmentId`, in the
    transaction of that environment's `claimed` (or of a retry on a new path)."""


class ClaimRetakenDocument(ClaimEvent, kw_only=True, tag="claim_retaken"):
    """A released path was claimed again, by environment `environmentId`."""


class ClaimReleasedDocument(ClaimEvent, kw_only=True, tag="claim_released"):
    """Environment `environmentId` gave the path up: in the transaction of its `removed`, or of
    handing the path to the environment that replaces it."""


class HostClaimsEvent(Document):
    host_id: Annotated[str, msgspec.Meta(description="The host whose claims these are.")]
    version: Annotated[int, msgspec.Meta(description="The version of the host's claims after this event (gap-free).")]


class HostLease(msgspec.Struct, frozen=True):
    """What one environment holds on its host besides its path."""

    slug: Slug
    ports: LeasedPorts


class HostClaimsStartedDocument(HostClaimsEvent, kw_only=True, tag="host_claims_started"):
    """A store that several core replicas may write began to keep the host's live claims together,
    so that the claims on one host are decided one at a time: in the transaction of the first claim
    taken or released there, holding the claims live until then."""

    held: Annotated[
        dict[str, UUID],
        msgspec.Meta(
            description="Each path (canonical form) held on the host until then, with the environment holding it."
        ),
    ]
    leases: (
        Annotated[
            dict[str, HostLease] | None,
            msgspec.Meta(
                description="Each live environment's lease on the host until then, by environment id; left out by a "
                "release before leases."
            ),
        ]
        | msgspec.UnsetType
    ) = msgspec.UNSET


class HostClaimsHeldDocument(HostClaimsEvent, kw_only=True, tag="host_claims_held"):
    """Environment `environmentId` holds the path on the host now: in the transaction of its
    `claim_taken` or `claim_retaken` (on a store that several core replicas may write)."""

    path: Annotated[str, msgspec.Meta(description="The claimed path, in canonical form (symlinks resolved).")]
    environment_id: Annotated[str, msgspec.Meta(description="The environment holding the path.")]


class HostClaimsReleasedDocument(HostClaimsEvent, kw_only=True, tag="host_claims_released"):
    """Environment `environmentId` no longer holds the path on the host: in the transaction of its
    `claim_released` (on a store that several core replicas may write)."""

    path: Annotated[str, msgspec.Meta(description="The released path, in canonical form (symlinks resolved).")]
    environment_id: Annotated[str, msgspec.Meta(description="The environment that held the path.")]


class HostClaimsLeasedDocument(HostClaimsEvent, kw_only=True, tag="host_claims_leased"):
    """Environment `environmentId` holds this slug and block of ports on the host now: in the
    transaction of its `claimed` (or `planned`), on a store that several core replicas may write,
    so that two replicas never lease one slug or overlapping blocks on one host."""

    environment_id: Annotated[str, msgspec.Meta(description="The environment holding the lease.")]
    slug: Slug
    ports: LeasedPorts


class HostClaimsLeaseEndedDocument(HostClaimsEvent, kw_only=True, tag="host_claims_lease_ended"):
    """Environment `environmentId` no longer holds a slug or ports on the host: in the transaction of
    its `removed` (on a store that several core replicas may write)."""

    environment_id: Annotated[str, msgspec.Meta(description="The environment that held the lease.")]


class RegisteredHostEvent(Document):
    host_id: Annotated[str, msgspec.Meta(description="The registered host's id.")]
    version: Annotated[
        int, msgspec.Meta(description="The version of the host's registration after this event (gap-free).")
    ]


AgentPublicKey = Annotated[
    str, _said("The public NKEY of the seed the host's agent connects with (the seed itself is never recorded).")
]


class HostRegisteredDocument(RegisteredHostEvent, kw_only=True, tag="host_registered"):
    """`bb machine register` registered the host: environments may be placed on it, and its agent
    connects with the seed of `publicKey`. Also recorded when a service starts on a data dir whose
    seed file of a host the log does not know was made by an earlier release."""

    public_key: AgentPublicKey


class HostCredentialsRotatedDocument(RegisteredHostEvent, kw_only=True, tag="host_credentials_rotated"):
    """`bb machine register --rotate` replaced the seed of the host's agent: the old one is refused."""

    public_key: AgentPublicKey


class HostRemovedDocument(RegisteredHostEvent, kw_only=True, tag="host_removed"):
    """`bb machine remove` removed the host, which no environment that is not removed lived on: its
    seed is refused, and nothing may be placed on it until it is registered again."""


class HostRegisteredAgainDocument(RegisteredHostEvent, kw_only=True, tag="host_registered_again"):
    """`bb machine register` registered a removed host again, with a new seed."""

    public_key: AgentPublicKey


class PoolEvent(Document):
    pool_id: Annotated[str, msgspec.Meta(description="The pool's id (`bb pool list`).")]
    version: Annotated[int, msgspec.Meta(description="The pool's version after this event (gap-free).")]


PoolMember = Annotated[str, msgspec.Meta(description="The member: an environment's id.")]


class PoolSetDocument(PoolEvent, kw_only=True, tag="pool_set"):
    """`bb pool set` kept a pool for a new key: `size` ready members on the host, of the project,
    the provider and the inputs (compared without a new branch's `name`)."""

    host_id: Annotated[str, msgspec.Meta(description="The host its members live on.")]
    project_path: Annotated[str | None, msgspec.Meta(description="The project (canonical), or null.")]
    provider_id: Annotated[str, msgspec.Meta(description="The provider of its members.")]
    inputs: Annotated[
        Any,
        msgspec.Meta(
            description="The inputs its members are prepared from; a thread's request matches them apart from a new branch's `name`."
        ),
    ]
    size: Annotated[int, msgspec.Meta(description="How many ready members it keeps.")]


class PoolResizedDocument(PoolEvent, kw_only=True, tag="pool_resized"):
    """`bb pool set` gave the pool a new size (0 drains it: its members are removed)."""

    size: Annotated[int, msgspec.Meta(description="How many ready members it keeps now.")]


class PoolBaseSeenDocument(PoolEvent, kw_only=True, tag="pool_base_seen"):
    """The pool's host read a new head of the base: members prepared on another are stale (removed
    and replaced), and a thread is bound only to a member prepared on the head its placement read."""

    base_commit: Annotated[str, msgspec.Meta(description="The base's head commit.")]
    setup_hash: Annotated[
        str | None, msgspec.Meta(description="The sha256 of `.bb-env-setup.sh` at that commit, or null: none there.")
    ]


class PoolMemberAddedDocument(PoolEvent, kw_only=True, tag="pool_member_added"):
    """A member was claimed for the pool (its `claimed`, with `poolId`, is in the same transaction)."""

    environment_id: PoolMember


class PoolMemberLeftDocument(PoolEvent, kw_only=True, tag="pool_member_left"):
    """The member no longer counts in the pool: `bound` to a thread, or dropped (`stale`: prepared on
    another base, or failed; `surplus`: beyond the size) and removed."""

    environment_id: PoolMember
    why: Annotated[str, msgspec.Meta(description="`bound`, `stale` or `surplus`.")]


class PoolMemberPooledDocument(PoolEvent, kw_only=True, tag="pool_member_pooled"):
    """A member's setup succeeded: the pool's failures in a row start again from 0."""

    environment_id: PoolMember


class PoolMemberFailedDocument(PoolEvent, kw_only=True, tag="pool_member_failed"):
    """A member's create or setup failed (it is removed and replaced while the pool is not paused)."""

    environment_id: PoolMember
    message: Annotated[str, msgspec.Meta(description="What went wrong, in one sentence.")]


class PoolPausedDocument(PoolEvent, kw_only=True, tag="pool_paused"):
    """BB_POOL_MAX_FAILURES member setups failed in a row: the pool prepares nothing until
    `bb pool resume` (threads get cold environments meanwhile)."""

    reason: Annotated[str, msgspec.Meta(description="Why, in one sentence.")]
    at: Annotated[datetime, msgspec.Meta(description="When it paused.")]


class PoolResumedDocument(PoolEvent, kw_only=True, tag="pool_resumed"):
    """`bb pool resume` lifted the pause: the pool prepares members again, its failures from 0."""


class PoolListEvent(Document):
    version: Annotated[int, msgspec.Meta(description="The list's version after this event (gap-free).")]


class PoolListStartedDocument(PoolListEvent, kw_only=True, tag="pool_list_started"):
    """The first `bb pool set` started the list of pools."""


class PoolListAddedDocument(PoolListEvent, kw_only=True, tag="pool_list_added"):
    """A pool was set for a new key: `bb pool list` and the refill read it from now on."""

    pool_id: Annotated[str, msgspec.Meta(description="The pool's id.")]


class ProjectSecretsEvent(Document):
    project_secrets_id: Annotated[
        str, msgspec.Meta(description="The id of the project's secrets (a UUID derived from the project's path).")
    ]
    version: Annotated[
        int, msgspec.Meta(description="The version of the project's secrets after this event (gap-free).")
    ]
    project_path: Annotated[str, _said("The project, in canonical form (symlinks resolved).")]


SecretName = Annotated[str, _said("The secret's name: the variable the project's hooks get it as.")]


class ProjectSecretsStartedDocument(ProjectSecretsEvent, kw_only=True, tag="project_secrets_started"):
    """The project's first secret is about to be set: its secrets are recorded from here on."""


class SecretSetDocument(ProjectSecretsEvent, kw_only=True, tag="secret_set"):
    """`bb secret set` gave the secret `name` a value, which the project's setup and teardown hooks
    get from now on. The value is never recorded, here or anywhere but the service's secret store."""

    name: SecretName


class SecretRemovedDocument(ProjectSecretsEvent, kw_only=True, tag="secret_removed"):
    """`bb secret remove` removed the secret `name`: the project's hooks no longer get it."""

    name: SecretName
