"""The demo's own checks (dgxmm.demo.cold_start): what a newcomer is told when a step cannot go
on, and how the first token of a stream is found. The whole demo against a served dgxmm and a
real llama-server is tests/e2e/test_demo.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import free_port

from dgxmm.demo.cold_start import Demo, DemoError, main, stream
from dgxmm.settings import Settings


def demo(tmp_path: Path, **ondemand: object) -> Demo:
    settings = Settings(server={"port": free_port(), "data_dir": tmp_path / "data"}, ondemand=ondemand)
    return Demo(settings, None)


def test_a_dgxmm_that_does_not_run_is_named_with_what_to_do(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "admin-token").write_text("t\n")
    config = tmp_path / "c.toml"
    config.write_text(f'[server]\nport = {free_port()}\ndata_dir = "{tmp_path / "data"}"\n')
    with pytest.raises(SystemExit) as exit_:
        main(["--config", str(config)])
    message = str(exit_.value.code)
    assert message.startswith("demo: dgxmm does not answer on http://127.0.0.1:") and "make run" in message


def test_no_admin_token_yet_means_dgxmm_never_started(tmp_path: Path) -> None:
    with pytest.raises(DemoError, match="no admin token .* start dgxmm first"):
        demo(tmp_path).token()


def test_a_gateway_the_demo_cannot_call_is_refused_before_anything_is_created(tmp_path: Path) -> None:
    key = tmp_path / "k"
    with pytest.raises(DemoError, match="key_file is not set"):
        demo(tmp_path).key()
    with pytest.raises(DemoError, match="dgxmm creates it on its first start"):
        demo(tmp_path, key_file=key, allowed_cidrs=["127.0.0.1/32"]).key()
    key.write_text("sk-k\n")
    with pytest.raises(DemoError, match="does not admit 127.0.0.1"):
        demo(tmp_path, key_file=key).key()  # "auto" admits nobody outside Docker
    with pytest.raises(DemoError, match="does not admit 127.0.0.1"):
        demo(tmp_path, key_file=key, allowed_cidrs=["127.0.0.2/32"]).key()
    assert demo(tmp_path, key_file=key, allowed_cidrs=["127.0.0.0/8"]).key() == (key, "sk-k")


def test_a_missing_llama_server_points_at_make_llama_server(tmp_path: Path) -> None:
    d = Demo(Settings(engines={"llamacpp_bin": str(tmp_path / "nope")}), None)
    with pytest.raises(DemoError, match="make llama-server"):
        d.check_engine()


def _chunk(delta: dict[str, str]) -> str:
    return "data: " + json.dumps({"choices": [{"delta": delta}]}) + "\n\n"


def test_stream_times_the_first_content_token_not_the_first_chunk() -> None:
    """The role-only chunk an engine may send at once is not a token: the first token is timed
    from the first chunk with content."""
    role, tokens = _chunk({"role": "assistant"}), _chunk({"content": "Hel"}) + _chunk({"content": "lo"})
    script = (
        f"import sys, time; sys.stdout.write({role!r}); sys.stdout.flush(); time.sleep(0.3); "
        f"sys.stdout.write({tokens + 'data: [DONE]' + chr(10)!r})"
    )
    result = stream([sys.executable, "-c", script], "", echo=False)
    assert result.done and result.text == "Hello"
    assert result.first_token_s is not None and result.first_token_s >= 0.3


def test_an_error_answer_has_no_first_token() -> None:
    body = json.dumps({"error": {"message": "x", "type": "server_error", "code": "start_failed"}})
    result = stream([sys.executable, "-c", f"print({body!r})"], "", echo=False)
    assert result.first_token_s is None and not result.done and "start_failed" in result.raw
