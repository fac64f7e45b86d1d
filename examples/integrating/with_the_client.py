"""A service that publishes a thread with bb's typed client, waits until its environment is
ready, prints what the environment did, and archives the thread.

    python examples/integrating/with_the_client.py THREAD_ID

BB_DATA_DIR names the data dir of the `bb serve` to use, as it does for `bb` itself.
"""

import asyncio
import sys

from bb_environments.client import Client, PlacementFailed


async def main(thread_id: str) -> int:
    # [spawn]
    client = await Client.connect()  # the data dir's server.json and the publisher's seed
    try:
        await client.spawn(thread_id, provider="personal-workspace", prompt="Tidy up the README")
        try:
            outcome = await client.wait_ready(thread_id, timeout=60)
        except PlacementFailed as failed:  # refused, or its environment failed: says why
            print(f"not placed: {failed}")
            return 1
        print(f"thread {thread_id} is ready in environment {outcome.environment_id}")
        # [/spawn]
        assert outcome.environment_id is not None  # a ready thread is always on an environment
        # [follow]
        async for event in client.environment_events(outcome.environment_id, follow=False):
            print(f"  v{event.version} {event.type} -> {event.status}")
        async for line in client.transcript(outcome.environment_id):
            print(f"  | {line.text}")
        await client.archive(thread_id)
        # [/follow]
    finally:
        await client.close()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1])))
