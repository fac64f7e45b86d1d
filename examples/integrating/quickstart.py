"""README's example: a service asks for a git worktree of a project for a thread, waits until it
is ready, and archives the thread when it is done with it.

    python examples/integrating/quickstart.py THREAD_ID PROJECT

BB_DATA_DIR names the data dir of the `bb serve` to use, as it does for `bb` itself.
"""

import asyncio
import sys

from bb_environments.client import Client


async def main(thread_id: str, project: str) -> None:
    # [quickstart]
    async with await Client.connect() as client:  # finds `bb serve` through its data dir's server.json
        await client.spawn(thread_id, provider="git-worktree", project=project, prompt="Fix the failing test")
        outcome = await client.wait_ready(thread_id, timeout=120)  # raises, saying why, if refused or failed
        print(f"thread {thread_id} is ready in environment {outcome.environment_id}")
        await client.archive(thread_id)  # done: the environment retires once its grace has passed
    # [/quickstart]


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
