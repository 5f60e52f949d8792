"""The ``hub`` fixture: a started ``FakeHub``, closed after the test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from hub.server import FakeHub


@pytest.fixture(name="hub")
def hub_fixture() -> Iterator[FakeHub]:
    server = FakeHub().start()
    try:
        yield server
    finally:
        server.close()
