"""An NKEY user's answer to a NATS server's nonce, for `bb`'s connection to the embedded server
(bus/api_client/blocking_client.py): its public key and its Ed25519 signature of the nonce.

The nkeys package signs with PyNaCl's `nacl.signing`, whose import loads every binding PyNaCl has
(boxes, hashes, password hashing...): about 10 ms, a tenth of a `bb` command's whole run. This
calls the same libsodium functions `nacl.signing` calls (crypto_sign_seed_keypair, crypto_sign)
through PyNaCl's compiled module, which loads in about 1 ms; only the NKEY text encoding is done
here: base32 of two prefix bytes (seed, user), the 32-byte key and a CRC-16/XMODEM, little-endian
(binascii.crc_hqx). tests/unit/test_nkey_signer.py holds both to what nkeys answers.
"""

from __future__ import annotations

import base64
import binascii

from nacl._sodium import ffi, lib

SEED_PREFIX = 18 << 3
"""The first five bits of a seed's first byte: its text starts with 'S'."""
USER_PREFIX = 20 << 3
"""The prefix of a user's keys: a public key 'U...', a user's seed 'SU...'."""
KEY_SIZE = 32
SIGNATURE_SIZE = 64

if lib.sodium_init() < 0:  # 0 at the first call, 1 after: both mean ready
    raise ImportError("libsodium cannot be initialised")


class SeedError(ValueError):
    """The text is not a user's NKEY seed; the message says why, never the text."""


def answer_nonce(seed: bytearray, nonce: bytes) -> tuple[str, str]:
    """The public key of the user whose seed is `seed` (from `user_seed`), and its signature of
    `nonce` in base64, as CONNECT carries them (`nkey`, `sig`)."""
    public = ffi.new("unsigned char[]", KEY_SIZE)
    secret = ffi.new("unsigned char[]", 2 * KEY_SIZE)
    signed = ffi.new("unsigned char[]", SIGNATURE_SIZE + len(nonce))
    try:
        assert len(seed) == KEY_SIZE, "a seed from user_seed"
        if (
            lib.crypto_sign_seed_keypair(public, secret, bytes(seed)) != 0
            or lib.crypto_sign(signed, ffi.NULL, nonce, len(nonce), secret) != 0
        ):
            raise RuntimeError("libsodium could not sign")
        signature = ffi.buffer(signed, SIGNATURE_SIZE)[:]
        return _public_key(ffi.buffer(public, KEY_SIZE)[:]), base64.b64encode(signature).decode()
    finally:
        lib.sodium_memzero(secret, 2 * KEY_SIZE)


def user_seed(text: bytes) -> bytearray:
    """The 32 bytes of the user's seed `text` spells (`SU...`), its prefixes and checksum checked."""
    try:
        decoded = bytearray(base64.b32decode(text + b"=" * (-len(text) % 8)))
    except binascii.Error:
        raise SeedError("not base32") from None
    try:
        if len(decoded) != 2 + KEY_SIZE + 2:
            raise SeedError("not the length of a seed")
        if binascii.crc_hqx(memoryview(decoded)[:-2], 0) != int.from_bytes(decoded[-2:], "little"):
            raise SeedError("its checksum does not match")
        if decoded[0] & 0b11111000 != SEED_PREFIX:
            raise SeedError("not a seed")
        if ((decoded[0] & 0b111) << 5 | decoded[1] >> 3) != USER_PREFIX:
            raise SeedError("not a user's seed")
        return decoded[2:-2]
    finally:
        decoded[:] = bytes(len(decoded))


def _public_key(key: bytes) -> str:
    body = bytes([USER_PREFIX]) + key
    return base64.b32encode(body + binascii.crc_hqx(body, 0).to_bytes(2, "little")).decode().rstrip("=")
