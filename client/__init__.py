"""bb_environments.client: the typed, async client for services that integrate with bb (SPEC
section 8.1, docs/integrating.md). It loads the wire's structs and nats-py, nothing of the service.

    async with await Client.connect() as client:
        await client.spawn("t1", provider="personal-workspace")
        outcome = await client.wait_ready("t1", timeout=60)
"""

from bb_environments.bus.wire.documents import EnvironmentEvent
from bb_environments.bus.wire.placements import PlacementOutcome
from bb_environments.bus.wire.transcript_lines import TranscriptLine
from bb_environments.client.client import Client
from bb_environments.client.errors import (
    ClientError,
    EnvironmentFailed,
    InvalidId,
    PlacementFailed,
    PlacementRefused,
    PlacementTimedOut,
    ServiceNotFound,
    ServiceUnavailable,
)

__all__ = [
    "Client",
    "ClientError",
    "EnvironmentEvent",
    "EnvironmentFailed",
    "InvalidId",
    "PlacementFailed",
    "PlacementOutcome",
    "PlacementRefused",
    "PlacementTimedOut",
    "ServiceNotFound",
    "ServiceUnavailable",
    "TranscriptLine",
]
