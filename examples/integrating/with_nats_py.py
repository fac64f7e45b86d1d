"""The same as with_the_client.py with nats-py alone: publish a thread's `created` and first
`message` as the `publisher` role, and wait for its placement outcome.

    python examples/integrating/with_nats_py.py THREAD_ID [PROVIDER]

BB_DATA_DIR names the data dir of the `bb serve` to use, as it does for `bb` itself.
"""

import asyncio
import json
import os
import sys
from datetime import UTC, datetime

import nats
from nats.js.api import ConsumerConfig, DeliverPolicy


async def main(thread_id: str, provider: str) -> int:
    data_dir = os.environ.get("BB_DATA_DIR") or os.path.expanduser("~/.local/share/bb")
    # [connect]
    with open(os.path.join(data_dir, "server.json")) as file:
        info = json.load(file)

    async def reconnecting(error: Exception) -> None:
        """nats-py logs each failed reconnect with a traceback by default, every 2 s while the service
        restarts; it reconnects by itself (for good, with max_reconnect_attempts=-1), so say nothing.
        Credentials it refuses still fail nats.connect itself."""

    nc = await nats.connect(
        info["natsUrl"], nkeys_seed=info["credentials"]["publisher"], error_cb=reconnecting, max_reconnect_attempts=-1
    )
    # [/connect]
    try:
        js = nc.jetstream()
        # [outcome]
        # A consumer of its own, made before publishing, of what is stored from now on: the
        # outcome is never missed, and an earlier placement of the thread is not taken for it.
        outcomes = await js.pull_subscribe(
            f"bb.placements.{thread_id}.>",
            stream="BB_PLACEMENTS",
            config=ConsumerConfig(deliver_policy=DeliverPolicy.NEW),
        )
        # [/outcome]
        # [publish]
        now = datetime.now(UTC).isoformat()  # occurredAt: an ISO-8601 time
        created = {
            "type": "created",
            "occurredAt": now,
            "threadId": thread_id,
            "environment": {
                "type": "provider",
                "environmentProviderId": provider,
                "machine": {"type": "existing", "hostId": info["hostId"]},
            },
        }
        await js.publish(f"bb.threads.{thread_id}.created", json.dumps(created).encode())
        message = {"type": "message", "occurredAt": now, "threadId": thread_id, "text": "Tidy up the README"}
        await js.publish(f"bb.threads.{thread_id}.message", json.dumps(message).encode())
        # [/publish]
        # [wait]
        outcome = json.loads((await outcomes.fetch(1, timeout=60))[0].data)
        if outcome["status"] != "ready":  # "error" or "refused"
            print(f"not placed: {outcome['status']}: {outcome['reason']}")
            return 1
        print(f"thread {thread_id} is ready in environment {outcome['environmentId']}")
        # [/wait]
    finally:
        await nc.close()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "personal-workspace")))
