"""`bb` starts in a fraction of a second because a command imports only what it runs. A stray import
(the relay, the domain, the Modal provider, aiohttp through nats-py) breaks nothing a test would
see: every command just takes half a second longer again. So these run real commands and look at
the modules their process loaded."""

from __future__ import annotations

import asyncio
import json
import os
import sys

SLOW_TO_IMPORT = (
    "aiohttp",  # nats-py's, for ws:// URLs only
    "modal",
    "eventsourcing.application",
    "eventsourcing.persistence",
    "bb_environments.bus.relay",
    "bb_environments.domain.environment",
    "bb_environments.projections.views",
    "bb_environments.providers.modal_machine",
    "bb_environments.entrypoints.serve",
)

# `bb ARGS`, as the console script runs it, then which of `slow` the process imported, on stderr's
# last line (a None in sys.modules is an import refused, not made).
RUN_AND_REPORT = """
import json, sys
from bb_environments.entrypoints.cli import main

slow = json.loads(sys.argv.pop(1))
sys.argv[0] = "bb"
try:
    main()
finally:
    print(json.dumps([name for name in slow if sys.modules.get(name) is not None]), file=sys.stderr)
"""


async def bb_loading(environment: dict[str, str], slow: tuple[str, ...], *args: str) -> tuple[int, str, list[str]]:
    """Exit code, stdout, and the modules of `slow` that `bb args` imported."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", RUN_AND_REPORT, json.dumps(slow), *args, env=environment,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode is not None
    return process.returncode, out.decode(), json.loads(err.decode().splitlines()[-1])


async def test_environment_list_loads_neither_the_service_nor_modal_nor_aiohttp_nor_rich(service):
    spawned = (await service.bb("thread", "spawn", "--environment-provider", "personal-workspace", "--json")).json()
    await service.wait_for(spawned["environmentId"], "ready")

    code, out, loaded = await bb_loading(service.environment, (*SLOW_TO_IMPORT, "rich"), "environment", "list", "--json")

    assert code == 0
    assert [e["id"] for e in json.loads(out)["environments"]] == [spawned["environmentId"]]
    assert loaded == []  # rich too: JSON output needs no console


async def test_help_loads_not_even_nats(tmp_path):
    environment = {**os.environ, "BB_DATA_DIR": str(tmp_path)}
    code, out, loaded = await bb_loading(environment, (*SLOW_TO_IMPORT, "nats"), "--help")

    assert code == 0
    assert "machine" in out and "modal" in out  # listed without loading their commands
    assert loaded == []
