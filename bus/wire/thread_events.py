"""The inbound thread events (bb.threads.<threadId>.<kind>), as publishers send them.

Anything a publisher sends that is not declared here, or is out of shape, is refused before a
command runs, so it never reaches the log. Sizes are bounded here; `inputs` are checked against
their provider's type before a thread is registered (handlers/threads.py).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

import msgspec

from bb_environments.bus.wire.descriptions import said as _said
from bb_environments.domain.ids import HOST_ID_PATTERN, ID_PATTERN

Id = Annotated[str, msgspec.Meta(pattern=ID_PATTERN)]
HostId = Annotated[str, msgspec.Meta(pattern=HOST_ID_PATTERN)]
PathText = Annotated[str, msgspec.Meta(max_length=4096)]  # PATH_MAX
EnvironmentId = Annotated[str, msgspec.Meta(max_length=64)]  # any form uuid.UUID reads


class Machine(msgspec.Struct, rename="camel", tag_field="type", tag="existing", forbid_unknown_fields=True):
    host_id: HostId | None = None
    """None: the thread's host (its `hostId`, or the service's)."""


class ProviderIntent(msgspec.Struct, rename="camel", tag_field="type", tag="provider", forbid_unknown_fields=True):
    environment_provider_id: Annotated[str, msgspec.Meta(max_length=128)]
    machine: Machine | None = None
    inputs: Any = None


class ExistingIntent(msgspec.Struct, rename="camel", tag_field="type", tag="existing", forbid_unknown_fields=True):
    environment_id: EnvironmentId


EnvironmentIntent = ProviderIntent | ExistingIntent


class InboundThreadEvent(msgspec.Struct, rename="camel", kw_only=True, tag_field="type", forbid_unknown_fields=True):
    thread_id: Annotated[Id, _said("The thread: the same as the subject's `<threadId>`.")]
    occurred_at: Annotated[datetime | None, _said("When it happened, as the publisher says.")] = None


class ThreadCreatedMessage(InboundThreadEvent, kw_only=True, tag="created"):
    """A thread was created. `environment` says where it runs once its first message comes: a new
    environment of a provider (`{"type": "provider", "environmentProviderId", "machine"?, "inputs"?}`)
    or an existing one (`{"type": "existing", "environmentId"}`). The machine's `hostId`, when
    named, is the thread's host (as `hostId` beside it is); a created event that names two
    different hosts is refused, and a host this service does not serve is refused on the thread
    when its first message comes. Without it, a child thread
    (`parentThreadId`) joins its parent's environment where the parent's provider shares with
    children, and otherwise gets a new one as its parent's intent asks."""

    project_path: Annotated[PathText | None, _said("The project the thread works on, on its host.")] = None
    parent_thread_id: Annotated[Id | None, _said("The thread's parent, for a child thread.")] = None
    host_id: Annotated[HostId | None, _said("The host its environment runs on; default: the service's.")] = None
    environment: Annotated[EnvironmentIntent | None, _said("Where the thread runs (see above).")] = None


class ThreadMessageMessage(InboundThreadEvent, kw_only=True, tag="message"):
    """A message in the thread; the first one makes the service provide the thread's environment."""

    text: Annotated[
        str | None,
        msgspec.Meta(description=("For whoever runs the thread's agent; this service reads only that a message came.")),
    ] = None


class ThreadArchivedMessage(InboundThreadEvent, kw_only=True, tag="archived"):
    """The thread was archived: it leaves its environment, which retires once no live thread uses it."""


class ThreadUnarchivedMessage(InboundThreadEvent, kw_only=True, tag="unarchived"):
    """The thread was unarchived: it rejoins its environment if that is still live."""


class MessageCancelledMessage(InboundThreadEvent, kw_only=True, tag="message_cancelled"):
    """The thread's message was cancelled: an environment still being prepared for it alone is
    cancelled."""


InboundThreadMessage = (
    ThreadCreatedMessage
    | ThreadMessageMessage
    | ThreadArchivedMessage
    | ThreadUnarchivedMessage
    | MessageCancelledMessage
)
inbound_decoder = msgspec.json.Decoder(InboundThreadMessage)
