"""``dgxmm stop``'s two halves (stoprequest.py): who holds a data directory, and whether a stop
request asks this process to stop its engines; a stale, foreign or oversized request never does."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dgxmm.datadir import DataDirLock
from dgxmm.stoprequest import REQUEST_MAX_BYTES, REQUEST_NAME, NotRunning, holder, request_stop, stop_engines_asked


def test_the_holder_is_the_pid_of_the_lock_and_none_once_released(tmp_path: Path) -> None:
    assert holder(tmp_path / "absent") is None
    lock = DataDirLock.acquire(tmp_path)
    try:
        assert holder(tmp_path) == os.getpid()
    finally:
        lock.release()
    assert holder(tmp_path) is None  # the PID file stays, stale: the lock says nobody holds it
    assert (tmp_path / "dgxmm.lock").read_text().strip() == str(os.getpid())


def test_a_stop_of_nothing_running_says_so_and_writes_nothing(tmp_path: Path) -> None:
    with pytest.raises(NotRunning):
        request_stop(tmp_path, stop_engines=True, timeout_s=1)
    assert not (tmp_path / REQUEST_NAME).exists()


@pytest.mark.parametrize(
    ("request_body", "asked"),
    [
        ({"pid": "self", "stop_engines": True}, True),
        ({"pid": "other", "stop_engines": True}, False),  # for a process that has gone: stale
        ({"pid": "self", "stop_engines": "yes"}, False),
        ({"pid": "self"}, False),
        ([1, 2], False),
        ("not json", False),
        ("x" * (REQUEST_MAX_BYTES + 1), False),
    ],
)
def test_only_a_request_for_this_process_stops_its_engines_and_any_is_removed(
    tmp_path: Path, request_body: object, asked: bool
) -> None:
    if isinstance(request_body, dict):
        pid = {"self": os.getpid(), "other": os.getpid() + 1}
        request_body = {**request_body, **({"pid": pid[request_body["pid"]]} if "pid" in request_body else {})}
    raw = request_body if isinstance(request_body, str) else json.dumps(request_body)
    (tmp_path / REQUEST_NAME).write_text(raw)
    assert stop_engines_asked(tmp_path) is asked
    assert not (tmp_path / REQUEST_NAME).exists()
    assert stop_engines_asked(tmp_path) is False  # none: a plain stop


def test_a_holder_that_does_not_exit_in_time_is_a_timeout_and_keeps_its_request(tmp_path: Path) -> None:
    # A holder that ignores SIGTERM (as a dgxmm stuck in its shutdown would look): it has the
    # lock once it printed "locked".
    code = (
        "import signal, sys, time; from pathlib import Path; from dgxmm.datadir import DataDirLock; "
        "signal.signal(signal.SIGTERM, signal.SIG_IGN); DataDirLock.acquire(Path(sys.argv[1])); "
        "print('locked', flush=True); time.sleep(120)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "locked\n"
        with pytest.raises(TimeoutError, match=re.escape(f"(PID {proc.pid}) is still running after 0.3 s")):
            request_stop(tmp_path, stop_engines=True, timeout_s=0.3)
        assert proc.poll() is None
        assert json.loads((tmp_path / REQUEST_NAME).read_text()) == {"pid": proc.pid, "stop_engines": True}
    finally:
        proc.kill()
        proc.wait()
