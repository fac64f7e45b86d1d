"""`bb` starts in a fraction of a second because a command imports only what it runs. A stray import
(the relay, the domain, the Modal provider, aiohttp through nats-py, asyncio) breaks nothing a test
would see: every command just takes half a second longer again. So these run real commands and look
at the modules their process loaded."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from uuid import uuid4

# What a command that only sends requests to the embedded server goes without (bus/api_client/blocking_client.py):
# asyncio and nats-py are most of a `bb` process's run time; logging and ssl only the serve or a
# TLS URL needs; nkeys loads all of PyNaCl to sign a nonce (bus/api_client/nkey_signer.py signs it with
# PyNaCl's libsodium alone); the socket module builds enums of every constant of _socket, hashlib
# loads OpenSSL, and eventsourcing is the service's. (Nor pathlib, from a wheel; this venv's editable
# finder loads it at every start.)
NOT_FOR_REQUESTS = (
    "asyncio",
    "nats",
    "ssl",
    "logging",
    "subprocess",
    "nkeys",
    "nacl.signing",
    "socket",
    "hashlib",
    "eventsourcing",
)

SLOW_TO_IMPORT = (
    "aiohttp",  # nats-py's, for ws:// URLs only
    "modal",
    "eventsourcing.application",
    "eventsourcing.persistence",
    "bb_environments.bus.core.relay",
    "bb_environments.domain.environment",
    "bb_environments.projections.views",
    "bb_environments.providers.modal_machine",
    "bb_environments.entrypoints.serve",
)

# `bb ARGS`, as the console script runs it, then which of `slow` the process imported, on stderr's
# last line (a None in sys.modules is an import refused, not made).
RUN_AND_REPORT = """
import json, sys
from bb_environments.entrypoints.bb import main

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
        sys.executable,
        "-c",
        RUN_AND_REPORT,
        json.dumps(slow),
        *args,
        env=environment,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode is not None
    return process.returncode, out.decode(), json.loads(err.decode().splitlines()[-1])


async def test_environment_list_loads_neither_the_service_nor_modal_nor_nats_nor_rich(service):
    spawned = (await service.bb("thread", "spawn", "--environment-provider", "personal-workspace", "--json")).json()
    await service.wait_for(spawned["environmentId"], "ready")
    slow = (*SLOW_TO_IMPORT, *NOT_FOR_REQUESTS, "rich")  # rich too: JSON output needs no console

    code, out, loaded = await bb_loading(service.environment, slow, "environment", "list", "--json")
    assert code == 0
    (listed,) = json.loads(out)["environments"]
    assert listed["id"] == spawned["environmentId"]
    assert loaded == []

    # For a person too: the table is plain columns (cli/support.py, print_table), without rich.
    code, out, loaded = await bb_loading(service.environment, slow, "environment", "list")
    assert code == 0
    header, row = out.splitlines()
    assert header.split() == ["ID", "STATUS", "SLUG", "THREADS", "DISK"]
    environment_id, status, slug, threads, disk = row.split()
    assert (environment_id, status) == (spawned["environmentId"], "ready")
    assert disk == "-" or disk[0].isdigit(), disk  # measured a moment after its setup settled
    assert listed["slug"].endswith(slug.lstrip("…")) and threads.rstrip("…") in spawned["threadId"]
    assert loaded == []

    code, out, loaded = await bb_loading(
        service.environment, slow, "environment", "show", spawned["environmentId"], "--json"
    )
    assert code == 0 and json.loads(out)["status"] == "ready"
    assert loaded == []

    # A refusal, as the service words it (on stderr through rich, as every error).
    code, out, loaded = await bb_loading(service.environment, slow[:-1], "environment", "show", str(uuid4()), "--json")
    assert code == 3 and json.loads(out)["error"]["code"] == "not_found"
    assert loaded == []


async def test_help_loads_not_even_nats(tmp_path):
    environment = {**os.environ, "BB_DATA_DIR": str(tmp_path)}
    code, out, loaded = await bb_loading(environment, (*SLOW_TO_IMPORT, "nats"), "--help")

    assert code == 0
    assert "machine" in out and "modal" in out  # listed without loading their commands
    assert loaded == []
