"""A subscriber (the `subscriber` role): hears each environment get ready, and reads every
environment event with a durable consumer of its own, which keeps its place while it is away.

    python examples/integrating/subscriber.py COUNT

Once it has heard COUNT environments get ready, it prints what the durable consumer reads and leaves.
BB_DATA_DIR names the data dir of the `bb serve` to use, as it does for `bb` itself.
"""

import asyncio
import json
import os
import sys

import nats
from nats.aio.msg import Msg


async def main(count: int) -> None:
    data_dir = os.environ.get("BB_DATA_DIR") or os.path.expanduser("~/.local/share/bb")
    with open(os.path.join(data_dir, "server.json")) as file:
        info = json.load(file)

    heard: asyncio.Queue[str] = asyncio.Queue()

    async def on_ready(message: Msg) -> None:
        await heard.put(json.loads(message.data)["environmentId"])

    # [ready]
    async def reconnecting(error: Exception) -> None:
        """nats-py logs each failed reconnect with a traceback by default, every 2 s while the service
        restarts; it reconnects by itself (for good, with max_reconnect_attempts=-1), so say nothing.
        Credentials it refuses still fail nats.connect itself."""

    nc = await nats.connect(
        info["natsUrl"], nkeys_seed=info["credentials"]["subscriber"], error_cb=reconnecting, max_reconnect_attempts=-1
    )
    await nc.subscribe("bb.environments.*.ready", cb=on_ready)  # each readiness once
    # [/ready]
    try:
        print("listening", flush=True)
        for _ in range(count):
            print(f"ready: {await heard.get()}", flush=True)
        # [durable]
        js = nc.jetstream()
        audit = await js.pull_subscribe("bb.log.environment.>", durable="audit", stream="BB_ENVIRONMENTS")
        for message in await audit.fetch(100, timeout=5):
            event = json.loads(message.data)
            print(f"audit: {event['environmentId']} v{event['version']} {event['type']}")
            await message.ack()
        # [/durable]
    finally:
        await nc.close()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
