"""`--nats-url`: an external NATS whose credentials and TLS the deployment supplies through the environment."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import nkeys
import pytest

from bb_environments.bus.embedded_server import EmbeddedNats
from tests.integration.conftest import Service, service_environment

PASSWORD = "s3cret-password-for-the-test"


def seed_file(path: Path) -> tuple[Path, str]:
    seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
    path.write_bytes(seed)
    path.chmod(0o600)
    return path, nkeys.from_seed(bytearray(seed)).public_key.decode()


def self_signed_certificate(directory: Path) -> tuple[Path, Path]:
    cert, key = directory / "server.pem", directory / "server-key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[dict]:
    """A nats-server configured by its operators: one NKEY user, one password user, TLS required."""
    seed, public_key = seed_file(tmp_path / "deployment.nk")
    cert, key = self_signed_certificate(tmp_path)
    configuration = tmp_path / "nats.conf"
    configuration.write_text(
        json.dumps(
            {
                "tls": {"cert_file": str(cert), "key_file": str(key)},
                "authorization": {"users": [{"nkey": public_key}, {"user": "bb", "password": PASSWORD}]},
            }
        )
    )
    server = EmbeddedNats.start(tmp_path / "external-nats", configuration=configuration)
    try:
        yield {"url": f"tls://127.0.0.1:{server.port}", "seed": seed, "ca": cert}
    finally:
        server.stop()


async def run_service(data_dir: Path, url: str, **credentials: str) -> Service:
    environment = service_environment(data_dir, BB_NATS_URL=url, **credentials)
    service = Service(data_dir, environment)
    context = ssl.create_default_context(cafile=credentials["BB_NATS_CA"])
    service.external_credentials = {
        "tls": context,
        **(
            {"nkeys_seed": credentials["BB_NATS_NKEY"]}
            if "BB_NATS_NKEY" in credentials
            else {"user": credentials["BB_NATS_USER"], "password": credentials["BB_NATS_PASSWORD"]}
        ),
    }
    await service.start()
    return service


async def test_serve_and_the_cli_use_the_deployments_nkey_over_tls(deployment, tmp_path):
    service = await run_service(
        tmp_path / "data", deployment["url"], BB_NATS_NKEY=str(deployment["seed"]), BB_NATS_CA=str(deployment["ca"])
    )
    try:
        spawned = await service.bb(
            "thread", "spawn", "--environment-provider", "personal-workspace", "--wait", "--json"
        )
        assert spawned.returncode == 0 and spawned.json()["status"] == "ready", spawned.stderr
        assert "credentials" not in json.loads((service.data_dir / "server.json").read_text())
    finally:
        await service.stop()


async def test_a_password_from_the_environment_never_reaches_argv_server_json_or_the_log(deployment, tmp_path):
    service = await run_service(
        tmp_path / "data",
        deployment["url"],
        BB_NATS_USER="bb",
        BB_NATS_PASSWORD=PASSWORD,
        BB_NATS_CA=str(deployment["ca"]),
    )
    try:
        listed = await service.bb("environment", "list", "--json")
        assert listed.returncode == 0, listed.stderr
        argv = Path(f"/proc/{service.process.pid}/cmdline").read_bytes().decode()
        assert PASSWORD not in argv
        assert PASSWORD not in (service.data_dir / "server.json").read_text()
        assert PASSWORD not in service.log_tail()
        assert service.info["natsUrl"] == deployment["url"]
    finally:
        await service.stop()


async def test_the_cli_without_the_deployments_credentials_is_refused_in_one_sentence(deployment, tmp_path):
    service = await run_service(
        tmp_path / "data", deployment["url"], BB_NATS_NKEY=str(deployment["seed"]), BB_NATS_CA=str(deployment["ca"])
    )
    try:
        stranger = {k: v for k, v in service.environment.items() if k != "BB_NATS_NKEY"}
        process = subprocess.run(
            [*service.cli(), "environment", "list", "--json"], env=stranger, capture_output=True, text=True, timeout=60
        )
        assert process.returncode == 4, process.stderr
        assert json.loads(process.stdout)["error"]["code"] == "unreachable"
        assert "Authorization Violation" in process.stderr and "Traceback" not in process.stderr
    finally:
        await service.stop()


@pytest.mark.parametrize(
    ("seed", "refused"),
    [
        ("publisher.nk", 'permissions violation for publish to "bb.api.threads.spawn"'),
        ("service.nk", 'permissions violation for subscription to "_inbox.'),
    ],
    ids=["publisher-may-not-spawn", "service-hears-no-answers"],
)
async def test_a_cli_whose_credentials_the_server_refuses_the_call_says_so_at_once(service, seed, refused):
    # Through nats-py, as with any --nats-url: the server tells a refusal to the error callback only,
    # and the request would otherwise wait out its minute.
    environment = {**service.environment, "BB_NATS_NKEY": str(service.data_dir / "credentials" / seed)}
    process = subprocess.run(
        [
            *service.cli(),
            "--nats-url",
            service.info["natsUrl"],
            "thread",
            "spawn",
            "--environment-provider",
            "personal-workspace",
            "--thread-id",
            "t-refused",
            "--json",
        ],
        env=environment,
        capture_output=True,
        text=True,
        timeout=30,
    )

    assert process.returncode == 4, process.stderr
    said = json.loads(process.stdout)["error"]["message"]
    assert refused in said and "docs/security.md" in said, said
    if seed == "publisher.nk":  # the request never left the server: nothing was spawned
        listed = await service.bb("thread", "list", "--json")
        assert [t["threadId"] for t in listed.json()["threads"]] == [], listed.stdout
    else:  # it went out, only its answer is kept back: the user is told it may have been done
        assert "t-refused may have been spawned all the same" in said, said
