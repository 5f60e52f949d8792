"""One dgxmm per data directory, with two real ``dgxmm serve`` processes."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from conftest import engine_command
from served import Served, until

pytestmark = pytest.mark.hostile  # issue 11's attacks: also run by `pytest -m hostile`


def test_a_second_serve_on_a_live_data_dir_exits_2_and_stops_nothing(tmp_path: Path) -> None:
    first = Served(tmp_path, name="first").start()
    try:
        with first.admin() as admin:
            view = admin.post(
                "/deployments", json={"name": "a", "engine": "command", "memory_gib": 1, "command": engine_command()}
            ).json()
            ready = until(lambda: (v := admin.get(f"/deployments/{view['id']}").json())["state"] == "ready" and v)
            events = admin.get("/events/history", params={"limit": 5000}).json()
        second = Served(tmp_path, name="second", data_dir=first.data_dir).start(wait=False)
        assert second.wait(60) == 2
        lines = second.log().strip().splitlines()
        assert lines == [f"data directory in use: {first.data_dir / 'dgxmm.lock'} is locked by PID {first.pid}"]
        with pytest.raises(httpx.ConnectError):  # it never listened
            httpx.get(second.base + "/api/openapi.json", timeout=2)
        # The first instance and its engine go on as if nothing happened.
        assert httpx.get(ready["base_url"] + "/health", timeout=5).status_code == 200
        with first.admin() as admin:
            after = admin.get(f"/deployments/{view['id']}").json()
            assert (after["state"], after["base_url"], after["state_changed_at"]) == (
                "ready",
                ready["base_url"],
                ready["state_changed_at"],
            )
            assert admin.get("/events/history", params={"limit": 5000}).json() == events
    finally:
        first.stop()
    # Once the first has exited its lock is gone: the data directory serves again.
    third = Served(tmp_path, name="third", data_dir=first.data_dir).start()
    try:
        with third.admin() as admin:
            until(lambda: admin.get(f"/deployments/{view['id']}").json()["state"] == "ready")  # always on
    finally:
        third.stop()


def test_the_lock_holds_when_its_file_is_unlinked(tmp_path: Path) -> None:
    """Unlinking dgxmm.lock used to let a second instance take a new lock and SIGKILL the first
    one's engines: the lock is on the data directory, which a file's removal does not touch."""
    first = Served(tmp_path, name="first").start()
    try:
        with first.admin() as admin:
            view = admin.post(
                "/deployments", json={"name": "a", "engine": "command", "memory_gib": 1, "command": engine_command()}
            ).json()
            ready = until(lambda: (v := admin.get(f"/deployments/{view['id']}").json())["state"] == "ready" and v)
        (first.data_dir / "dgxmm.lock").unlink()
        second = Served(tmp_path, name="second", data_dir=first.data_dir).start(wait=False)
        assert second.wait(60) == 2
        assert "data directory in use" in second.log()
        assert httpx.get(ready["base_url"] + "/health", timeout=5).status_code == 200  # its engine lives on
        with first.admin() as admin:
            assert admin.get(f"/deployments/{view['id']}").json()["state"] == "ready"
    finally:
        first.stop()


def test_a_port_in_use_exits_2_before_touching_anything(tmp_path: Path) -> None:
    first = Served(tmp_path, name="first").start()
    try:
        (tmp_path / "other").mkdir()
        other = Served(tmp_path / "other", name="other", port=first.port)
        other.start(wait=False)
        assert other.wait(60) == 2
        assert other.log().strip().splitlines() == [f"cannot listen on 127.0.0.1:{first.port}: Address already in use"]
        assert not (other.data_dir / "dgxmm.db").exists()
    finally:
        first.stop()
