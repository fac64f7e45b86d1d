"""The seams' NATS edge, installed for one test; the world each test builds stays in its tmp_path."""

from __future__ import annotations

import pytest

from tests.fuzz.seams import EdgeOfNats, MicroEndpoints


@pytest.fixture
def edge(monkeypatch: pytest.MonkeyPatch) -> EdgeOfNats:
    # Modal is blocked without credentials, so no example can reach its cloud.
    for name in ("MODAL_TOKEN_ID", "MODAL_TOKEN_SECRET"):
        monkeypatch.delenv(name, raising=False)
    return EdgeOfNats()


@pytest.fixture
def micro(monkeypatch: pytest.MonkeyPatch, edge: EdgeOfNats) -> MicroEndpoints:
    endpoints = MicroEndpoints(edge)
    monkeypatch.setattr("bb_environments.bus.core.api_service.add_service", endpoints.add_service)
    monkeypatch.setattr("bb_environments.bus.agent.host_service.add_service", endpoints.add_service)
    return endpoints
