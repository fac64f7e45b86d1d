"""The CLI's answer to the server's nonce (bus/api_client/nkey_signer.py) is the one nkeys gives: the same
public key, the same Ed25519 signature; anything that is not a user's seed is refused."""

from __future__ import annotations

import base64
import os

import nkeys
import pytest

from bb_environments.bus.api_client.nkey_signer import SeedError, answer_nonce, user_seed


def test_the_public_key_and_signature_are_those_of_nkeys():
    for _ in range(50):
        seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
        nonce = base64.urlsafe_b64encode(os.urandom(11)).rstrip(b"=")
        expected = nkeys.from_seed(bytearray(seed))
        assert answer_nonce(user_seed(seed), nonce) == (
            expected.public_key.decode(),
            base64.b64encode(expected.sign(nonce)).decode(),
        )


def _flipped(seed: bytes, index: int) -> bytes:
    return seed[:index] + (b"A" if seed[index : index + 1] != b"A" else b"B") + seed[index + 1 :]


@pytest.mark.parametrize(
    "text, why",
    [
        (b"", "not the length of a seed"),
        (b"not base32 at all!", "not base32"),
        (nkeys.encode_seed(bytes(32), nkeys.PREFIX_BYTE_USER)[:-8], "not the length of a seed"),
        (_flipped(nkeys.encode_seed(bytes(range(32)), nkeys.PREFIX_BYTE_USER), 20), "checksum"),
        (nkeys.encode_seed(bytes(32), nkeys.PREFIX_BYTE_ACCOUNT), "not a user's seed"),
        (
            nkeys.from_seed(bytearray(nkeys.encode_seed(bytes(32), nkeys.PREFIX_BYTE_USER))).public_key + b"AAAAA",
            "not the length of a seed",
        ),
    ],
)
def test_what_is_not_a_users_seed_is_refused(text, why):
    with pytest.raises(SeedError, match=why):
        user_seed(text)


def test_a_damaged_seed_file_ends_the_command_naming_the_file_before_any_connection(tmp_path):
    # A hand-edited operator.nk, or a public key written in its place: nothing is sent anywhere.
    from bb_environments.bus.api_client.blocking_client import BlockingApiClient
    from bb_environments.bus.wire.service_errors import ServiceError

    seed_file = tmp_path / "operator.nk"
    seed_file.write_bytes(nkeys.from_seed(bytearray(nkeys.encode_seed(bytes(32), nkeys.PREFIX_BYTE_USER))).public_key)
    with pytest.raises(ServiceError) as refused:
        BlockingApiClient.connect("nats://127.0.0.1:1", str(seed_file), str(tmp_path))
    assert refused.value.code == "unreachable"
    assert f"{seed_file} is not a user's NKEY seed" in str(refused.value)


def test_seeds_are_made_whole_over_what_a_kill_mid_write_left(tmp_path):
    # A first `bb serve` killed while it wrote a seed leaves its temporary file, never a seed cut short.
    from bb_environments.bus.access import Credentials

    credentials = Credentials(tmp_path / "credentials")
    credentials.directory.mkdir()
    (credentials.directory / ".operator.nk.tmp").write_bytes(b"SUA")
    credentials.ensure(["operator", "publisher"])
    assert sorted(path.name for path in credentials.directory.iterdir()) == ["operator.nk", "publisher.nk"]
    for user in ("operator", "publisher"):
        assert credentials.public_key(user).startswith("U")
        assert credentials.seed_file(user).stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("content", [b"", b"SUAdamaged\n"], ids=["empty", "damaged"])
def test_a_damaged_seed_is_named_with_what_to_do(tmp_path, content):
    from bb_environments.bus.access import Credentials, DamagedSeed

    credentials = Credentials(tmp_path)
    credentials.seed_file("subscriber").write_bytes(content)
    with pytest.raises(DamagedSeed, match=f"{credentials.seed_file('subscriber')} holds no valid seed; delete it"):
        credentials.public_key("subscriber")
