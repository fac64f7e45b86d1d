"""docs/security.md gives deployments the permission sets the embedded server enforces, kept in step."""

from __future__ import annotations

import re
from pathlib import Path

from bb_environments.bus.access import deployment_configuration, host_user_block


def test_the_documented_nats_configuration_is_the_one_the_code_enforces():
    text = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text()
    blocks = re.findall(r"```json\n(\{\n  \"authorization\".*?)\n```", text, flags=re.S)
    assert blocks == [host_user_block("HOST_ID", "<public NKEY of host-HOST_ID>"), deployment_configuration()], (
        "regenerate the blocks with bus.access.deployment_configuration() and host_user_block()"
    )
