#!/usr/bin/env python3
"""Deliberate bugs in the on-demand controller and the engine pool, each applied to a copy of the tree: the fast
deterministic tests must fail for every one of them (the mutant is "killed").

    python scripts/mutants.py [--only NAME ...] [--random]

Each mutant (the tables are scripts/mutants_controller.py, mutants_owner.py, mutants_oom.py, mutants_deploy.py and mutants_gateway.py) is a
list of exact text replacements; a replacement whose text is not found exactly
once is an error (the mutant no longer matches the code and must be updated with it). The copy
is run first without any mutant (it must pass), then once per mutant. The table names the tests
that failed; every one of them is deterministic (gated or table-driven, no random seeds). With
``--random`` the seeded random race test and the soak run too, for information.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

DETERMINISTIC = [
    "tests/unit/test_decide.py",
    "tests/unit/test_placement.py",
    "tests/unit/test_decide_attempt.py",
    "tests/unit/test_oomretry.py",
    "tests/unit/test_oomlines.py",
    "tests/unit/test_controller_oom.py",
    "tests/unit/test_upstream_reuse.py",
    "tests/unit/test_engine_answer_ends.py",
    "tests/unit/test_liveness.py",
    "tests/unit/test_forward_errors.py",
    "tests/unit/test_deployer.py",
    "tests/unit/test_controller.py",
    "tests/unit/test_controller_mode.py",
    "tests/unit/test_controller_races.py",
    "tests/unit/test_controller_steps.py",
    "tests/unit/test_controller_wakeups.py",
    "tests/unit/test_controller_owner.py",
    "tests/unit/test_controller_prefetch.py",
    "tests/unit/test_controller_planned.py",
    "tests/unit/test_controller_sleep.py",
    "tests/unit/test_preparation.py",
    "tests/unit/test_modelstore.py::test_a_hub_that_stalls_in_the_middle_of_a_file_fails_after_one_stall_timeout_and_resumes_when_pulled_again",
    "tests/unit/test_turns.py",
    "tests/unit/test_controller_turns.py",
    "tests/unit/test_priority.py",
    "tests/unit/test_reqpriority.py",
    "tests/unit/test_start_load.py",
    "tests/unit/test_store_unwritable.py",
    # (a tmpfs, as root; the one test that needs no engine: the others take longer than a mutant's 5 s)
    "tests/integration/test_full_disk.py::test_a_refused_change_leaves_the_store_unwritable_until_there_is_room",
    "tests/unit/test_keys.py",
    "tests/unit/test_callerkeys.py",
    "tests/unit/test_quota.py",
    "tests/unit/test_ratelimit.py",
    "tests/unit/test_refusals.py",
    "tests/unit/test_guard.py",
    "tests/integration/test_gateway_checks.py",
    "tests/unit/test_live_status.py",
    "tests/unit/test_status.py",
    "tests/unit/test_names.py",
    "tests/unit/test_controller_swaps.py",
    "tests/integration/test_router.py",
    "tests/integration/test_measured_memory.py::test_a_start_during_the_search_for_leftovers_is_not_one",
]
RANDOM = [
    "tests/unit/test_controller_races.py::test_random_interleavings_reach_both_precheck_outcomes",
    "tests/unit/test_controller_soak.py",
]
RANDOM_IDS = ("test_random_interleavings", "test_soak")


sys.path.insert(0, str(Path(__file__).resolve().parent))  # (the mutant tables beside this script)

from mutant import Mutant  # noqa: E402
from mutants_controller import MUTANTS as CONTROLLER_MUTANTS  # noqa: E402
from mutants_deploy import MUTANTS as DEPLOY_MUTANTS  # noqa: E402
from mutants_gateway import MUTANTS as GATEWAY_MUTANTS  # noqa: E402
from mutants_oom import MUTANTS as OOM_MUTANTS  # noqa: E402
from mutants_owner import MUTANTS as OWNER_MUTANTS  # noqa: E402

MUTANTS = [*CONTROLLER_MUTANTS, *OWNER_MUTANTS, *OOM_MUTANTS, *DEPLOY_MUTANTS, *GATEWAY_MUTANTS]


def copy_tree(dest: Path) -> None:
    for part in ("src", "tests", "pyproject.toml"):
        source = ROOT / part
        if source.is_dir():
            shutil.copytree(source, dest / part, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(source, dest / part)


def apply(tree: Path, mutant: Mutant) -> None:
    for file, old, new in mutant.edits:
        path = tree / file
        text = path.read_text()
        if text.count(old) != 1:
            raise SystemExit(f"mutant {mutant.name} does not apply to {file} ({text.count(old)} matches): update it")
        path.write_text(text.replace(old, new))


REPORTER = """import json
import os

import pytest

LIMITS = json.loads(os.environ.get("DGXMM_MUTANT_LIMITS") or "{}")


def pytest_collection_modifyitems(items):
    # one limit per test over the modules' own (longer) timeout marks: what the test took in the
    # unmutated copy, with room, or the default for a test the unmutated copy did not time
    for item in items:
        limit = LIMITS.get(item.nodeid, float(os.environ["DGXMM_MUTANT_TIMEOUT"]))
        item.add_marker(pytest.mark.timeout(limit), append=False)


def pytest_runtest_logreport(report):
    if report.failed:
        with open(os.environ["DGXMM_MUTANT_FAILURES"], "a") as out:
            out.write(report.nodeid + "\\n")
    elif report.when == "call":
        with open(os.environ["DGXMM_MUTANT_FAILURES"] + ".times", "a") as out:
            out.write(f"{report.duration} {report.nodeid}\\n")
"""


def limits_from(times: Path, default_s: float) -> dict[str, float]:
    """Each test's limit in a mutant's run: the default (a lost wake-up must not hang the run), or
    four times what it took in the unmutated copy plus 5 s when that was longer: an integration
    test on a loaded 2-core machine takes more than the default without any mutant."""
    limits = {}
    for line in times.read_text().splitlines():
        seconds, nodeid = line.split(" ", 1)
        limits[nodeid] = max(default_s, 4 * float(seconds) + 5)
    return limits


def run_tests(
    tree: Path, tests: list[str], deselect: tuple[str, ...], timeout_s: float, limits: dict[str, float]
) -> tuple[int, list[str]]:
    """Run the tests in the copy; returns pytest's exit code and the failed test ids, recorded by
    a small plugin as each test ends (a mutant may crash pytest's own report at the end). A
    mutant that loses a wake-up makes tests hang: the per-test timeout ends them (the
    deterministic tests take well under a second each)."""
    (tree / "mutant_report.py").write_text(REPORTER)
    failures = tree / "failures.txt"
    failures.write_text("")
    (tree / "failures.txt.times").write_text("")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(str(tree / p) for p in ("src", "tests", "")),
        "PYTHONDONTWRITEBYTECODE": "1",
        "DGXMM_MUTANT_FAILURES": str(failures),
        "DGXMM_MUTANT_TIMEOUT": str(timeout_s),
        "DGXMM_MUTANT_LIMITS": json.dumps(limits),
    }
    args = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "mutant_report",
        "--rootdir",
        str(tree),
        *tests,
    ]
    if deselect:
        args += ["-k", " and ".join(f"not {name}" for name in deselect)]
    try:
        code = subprocess.run(args, cwd=tree, env=env, capture_output=True, check=False, timeout=900).returncode
    except subprocess.TimeoutExpired:
        code = -1
    return code, sorted(set(failures.read_text().split()))


def check_import(tree: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    out = subprocess.run(
        [sys.executable, "-c", "import dgxmm; print(dgxmm.__file__)"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not out.startswith(str(tree)):
        raise SystemExit(f"the copy's dgxmm is not the one imported ({out})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", help="mutant names to run (default: all)")
    parser.add_argument("--random", action="store_true", help="also run the seeded random tests")
    opts = parser.parse_args()
    chosen = [m for m in MUTANTS if not opts.only or m.name in opts.only]
    tests = DETERMINISTIC + (RANDOM if opts.random else [])
    deselect = () if opts.random else RANDOM_IDS
    timeout_s = 120 if opts.random else 5
    rows = []
    with tempfile.TemporaryDirectory(prefix="dgxmm-mutants-") as tmp:
        control = Path(tmp) / "control"
        copy_tree(control)
        check_import(control)
        # (the unmutated copy has the modules' own limits: it must pass, and it times every test)
        code, failed = run_tests(control, tests, deselect, 120, {})
        if code != 0:
            print("the unmutated copy fails:", *failed, sep="\n  ")
            return 2
        limits = limits_from(control / "failures.txt.times", timeout_s)
        for mutant in chosen:
            tree = Path(tmp) / mutant.name
            copy_tree(tree)
            apply(tree, mutant)
            started = time.monotonic()
            code, failed = run_tests(tree, tests, deselect, timeout_s, limits)
            rows.append((mutant, code != 0, failed, time.monotonic() - started))
            print(f"{mutant.name}: {'killed' if code else 'SURVIVED'} ({len(failed)} failing)", file=sys.stderr)
            shutil.rmtree(tree)
    print_table(rows)
    return 0 if all(killed for _, killed, _, _ in rows) else 1


def print_table(rows: list[tuple[Mutant, bool, list[str], float]]) -> None:
    width = max(len(m.name) for m, *_ in rows)
    print(f"\n{'mutant':<{width}}  result    failing  time   bug / killed by")
    for mutant, killed, failed, seconds in rows:
        result = "killed" if killed else "SURVIVED"
        print(f"{mutant.name:<{width}}  {result:<8}  {len(failed):>7}  {seconds:4.0f}s  {mutant.bug}")
        for test in failed[:6]:
            print(f"{'':<{width}}  {'':<8}  {'':>7}  {'':>5}  - {test.split('/')[-1]}")
        if len(failed) > 6:
            print(f"{'':<{width}}  {'':<8}  {'':>7}  {'':>5}  ... and {len(failed) - 6} more")
    survived = [m.name for m, killed, *_ in rows if not killed]
    print(
        f"\n{len(rows) - len(survived)} of {len(rows)} mutants killed" + (f"; survived: {survived}" if survived else "")
    )


if __name__ == "__main__":
    sys.exit(main())
