"""The cold start benchmark's samples, its table and its ``--check`` (bench/coldstart.py): the
overhead of each scenario (the client's time to the first byte minus the engine's own part),
and the reference rows the same engine times give for other designs' polling.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from report import pct

CHECK_P50_MS = 200.0  # --check: a figure this far off fails (the targets are 50 and 100 ms)


@dataclass
class Sample:
    total_ms: float  # request sent -> first byte
    engine_ms: float  # the engine's own part
    after_able_ms: float = math.nan  # able to answer -> first byte (starts only)

    @property
    def overhead_ms(self) -> float:
        return self.total_ms - self.engine_ms


@dataclass
class Results:
    rows: dict[str, list[Sample]] = field(default_factory=dict)
    engine_start_s: list[float] = field(default_factory=list)  # every start's launch -> able
    burst: dict[str, Any] = field(default_factory=dict)
    llama_first_answer_ms: list[float] = field(default_factory=list)  # llama-server alone: able -> first byte


def llama_swap(engine_s: float) -> float:
    """ms llama-swap's polling alone adds: a check 250 ms after launch, then every 5 s."""
    seen = 0.25 if engine_s <= 0.25 else 0.25 + 5.0 * math.ceil((engine_s - 0.25) / 5.0)
    return 1e3 * (seen - engine_s)


def fixed_poll(engine_s: float, every_s: float = 0.5) -> float:
    """ms a fixed poll (the first probe at launch, then every ``every_s``) alone adds."""
    return 1e3 * (every_s * math.ceil(engine_s / every_s) - engine_s)


def row(label: str, values: list[float], note: str = "") -> str:
    if not values:
        return f"| {label} | - | - | - | 0 | {note} |"
    return f"| {label} | {pct(values, 50):.0f} | {pct(values, 95):.0f} | {max(values):.0f} | {len(values)} | {note} |"


def report(res: Results) -> str:
    out = ["| overhead (ms) | p50 | p95 | max | runs | engine's own time (p50) |", "|---|---:|---:|---:|---:|---|"]
    for name, samples in res.rows.items():
        engine = f"{pct([s.engine_ms for s in samples], 50):.0f} ms" if samples else "-"
        out.append(row(name, [s.overhead_ms for s in samples], engine))
        after = [s.after_able_ms for s in samples if not math.isnan(s.after_able_ms)]
        if after:
            out.append(row("  of which after able", after, ""))
    b = res.burst
    if b:
        samples = b["samples"]
        out.append(
            row(
                f"burst of {b['requests']} first requests",
                [s.overhead_ms for s in samples],
                f"{pct([s.engine_ms for s in samples], 50):.0f} ms; {b['starts']} start(s), first bytes spread"
                f" over {b['spread_ms']:.0f} ms, {b['ok']} ok, {b['errors']} errors",
            )
        )
        out.append(row("  of which after able", [s.after_able_ms for s in samples], ""))
    if res.llama_first_answer_ms:
        out.append(
            row(
                "reference: llama-server alone, able to its first answer",
                res.llama_first_answer_ms,
                "the engine's part of llama-server's 'after able'",
            )
        )
    if res.engine_start_s:
        out.append(
            row(
                "reference: llama-swap (check at 250 ms, then every 5 s)",
                [llama_swap(t) for t in res.engine_start_s],
                "polling alone, same engine times",
            )
        )
        out.append(
            row(
                "reference: fixed 0.5 s poll (dgxmm before)",
                [fixed_poll(t) for t in res.engine_start_s],
                "polling alone, same engine times",
            )
        )
    return "\n".join(out)


def check(res: Results) -> list[str]:
    """What is off by far (the quick run in CI fails on these, never on the tighter targets)."""
    bad = []
    for name, samples in res.rows.items():
        p50 = pct([s.overhead_ms for s in samples], 50)
        if samples and not p50 <= CHECK_P50_MS:
            bad.append(f"{name}: overhead p50 {p50:.0f} ms > {CHECK_P50_MS:g} ms")
    if res.burst and res.burst["starts"] != 1:
        bad.append(f"burst: {res.burst['starts']} starts instead of 1")
    if res.burst and res.burst["errors"]:
        bad.append(f"burst: {res.burst['errors']} errors ({res.burst['first_error']})")
    return bad
