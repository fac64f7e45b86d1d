"""A service that reacts to every thread's placement outcome as it comes, until interrupted.

    python examples/integrating/react_to_outcomes.py

It hears each outcome once, in the order they were published, also across a restart of `bb serve`
(it reconnects by itself and goes on after the last outcome it heard).
"""

import asyncio
import contextlib

from bb_environments.client import Client


async def main() -> None:
    # [react]
    async with await Client.connect() as client:
        print("listening", flush=True)
        async for outcome in client.placements():  # every thread's, from now on
            if outcome.status == "ready":
                print(f"{outcome.thread_id}: ready in {outcome.environment_id}", flush=True)
            else:  # "error" or "refused", with the reason in one sentence
                print(f"{outcome.thread_id}: {outcome.status}: {outcome.reason}", flush=True)
    # [/react]


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
