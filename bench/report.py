"""Statistics and the markdown table of the gateway benchmark.

A shared machine's speed drifts during a run, so throughput is the median over rounds and every
throughput ratio is the median of per-round ratios (the three targets of one round run back to
back); latencies are percentiles over all rounds' samples. A value that could not be measured is
NaN and prints as "-" instead of failing the report.
"""

from __future__ import annotations

import math
from typing import Any

from scenario import EVENTS_PER_STREAM, PACED_DEADLINE, TARGETS


def pct(values: list[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def round_ratio(a: list[float], b: list[float]) -> float:
    """Median of the per-round ratios a[r] / b[r]."""
    return median([x / y for x, y in zip(a, b, strict=False) if y]) if a and b else math.nan


def _f(value: float, digits: int = 2) -> str:
    if math.isnan(value):
        return "-"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"


def _ratio(a: float, b: float, ref: str) -> str:
    if not b or math.isnan(a) or math.isnan(b):
        return "-"
    return f"{a / b:.2f}x {ref}"


def table(results: dict[str, Any], paced_streams: int, idle_rss_kib: dict[str, int]) -> str:
    """One row per metric, one column per target, then the ratios to direct and to nginx."""
    d, n, g = (results[t] for t in TARGETS)
    rows: list[list[str]] = []

    def ratio_row(label: str, key: str, value: str, scale: float = 1.0) -> None:
        """Medians over the rounds; each ratio is the median of per-round ratios."""
        dv, nv, gv = (x[key][value] * scale for x in (d, n, g))
        dr, nr, gr = (x[key]["rounds"] for x in (d, n, g))
        rows.append(
            [
                label,
                _f(dv, 0),
                _f(nv, 0),
                _f(gv, 0),
                f"{round_ratio(nr, dr):.2f}x direct",
                f"{round_ratio(gr, dr):.2f}x direct",
                f"{round_ratio(gr, nr):.2f}x nginx",
            ]
        )

    def latency_rows(label: str, key: str, pct_key: str, scale: float = 1.0) -> None:
        """The latency, then what each proxy adds to direct's (the number the targets are about)."""
        dv, nv, gv = (x[key][pct_key] * scale for x in (d, n, g))
        rows.append(
            [
                f"{label} (ms)",
                _f(dv),
                _f(nv),
                _f(gv),
                _ratio(nv, dv, "direct"),
                _ratio(gv, dv, "direct"),
                _ratio(gv, nv, "nginx"),
            ]
        )
        an, ag = nv - dv, gv - dv
        rows.append(
            [
                "  added vs direct (ms)",
                "0",
                f"{an:+.2f}",
                f"{ag:+.2f}",
                "",
                "",
                _ratio(ag, an, "nginx") if an > 0 and ag > 0 else "-",
            ]
        )

    latency_rows("TTFB p50, c=1", "ttfb_c1", "p50_ms")
    latency_rows("TTFB p99, c=1", "ttfb_c1", "p99_ms")
    latency_rows("TTFB p50, c=64", "ttfb_c64", "p50_ms")
    latency_rows("TTFB p99, c=64", "ttfb_c64", "p99_ms")
    ratio_row("streaming chunks/s, c=16", "stream_c16", "chunks_s")
    ratio_row("  (streams/s, c=16)", "stream_c16", "chunks_s", 1 / EVENTS_PER_STREAM)
    ratio_row("non-streaming req/s, c=16", "plain_c16", "req_s")
    for label, key in (
        ("proxy CPU us per stream, c=16", "stream_c16"),
        ("proxy CPU us per request, c=16", "plain_c16"),
        ("proxy CPU us per stream, c=1", "ttfb_c1"),
    ):
        nv, gv = n[key]["cpu_us_per_req"], g[key]["cpu_us_per_req"]
        rows.append([label, "-", _f(nv, 0), _f(gv, 0), "", "", _ratio(gv, nv, "nginx")])
    rows.append(
        [
            f"paced: streams complete in {PACED_DEADLINE:g} s",
            *(f"{x['paced']['ok']}/{paced_streams}" for x in (d, n, g)),
            "",
            "",
            "",
        ]
    )
    rows.append(["paced: last stream done after (s)", *(_f(x["paced"]["last_done"]) for x in (d, n, g)), "", "", ""])
    latency_rows("paced: inter-chunk p50", "paced", "gap_p50", 1e3)
    latency_rows("paced: inter-chunk p99", "paced", "gap_p99", 1e3)
    latency_rows("paced: TTFB p99", "paced", "ttfb_p99", 1e3)
    rows.append(
        [
            "proxy RSS after start-up (MiB)",
            "-",
            _f(idle_rss_kib["nginx"] / 1024, 1),
            _f(idle_rss_kib["gateway"] / 1024, 1),
            "",
            "",
            "",
        ]
    )
    peak_n, peak_g = n["paced"]["peak_rss_mib"], g["paced"]["peak_rss_mib"]
    rows.append(
        ["paced: proxy peak RSS (MiB)", "-", _f(peak_n, 1), _f(peak_g, 1), "", "", _ratio(peak_g, peak_n, "nginx")]
    )
    rows.append(
        [
            "paced: proxy CPU (s)",
            "-",
            _f(n["paced"]["cpu_s"]),
            _f(g["paced"]["cpu_s"]),
            "",
            "",
            _ratio(g["paced"]["cpu_s"], n["paced"]["cpu_s"], "nginx"),
        ]
    )
    per_chunk = [1e6 * x["paced"]["cpu_s"] / max(1, x["paced"]["ok"] * EVENTS_PER_STREAM) for x in (n, g)]
    rows.append(
        [
            "paced: proxy CPU us per chunk",
            "-",
            _f(per_chunk[0], 1),
            _f(per_chunk[1], 1),
            "",
            "",
            _ratio(per_chunk[1], per_chunk[0], "nginx"),
        ]
    )
    return _markdown(["metric", "direct", "nginx", "gateway", "nginx/direct", "gateway/direct", "gateway/nginx"], rows)


def _markdown(header: list[str], rows: list[list[str]]) -> str:
    """A markdown table padded to aligned columns (readable as plain text too); the first column
    is left-aligned, the numbers right-aligned."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return (
            "| "
            + " | ".join(
                c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
            )
            + " |"
        )

    rule = "|" + "|".join(("-" * (w + 1) + ":") if i else ("-" * (w + 2)) for i, w in enumerate(widths)) + "|"
    return "\n".join([line(header), rule, *(line(r) for r in rows)])


def instrumentation_table(results: dict[str, Any], in_process: dict[str, float]) -> str:
    """The in-process figures, and beside them this gateway against the baseline's, if run."""
    lines = [
        "| median of rounds | gateway | baseline | gateway - baseline (median of per-round differences) |",
        "|---|---:|---:|---:|",
    ]
    labels = {
        "plain": "CPU us per request, non-streaming, c=16",
        "stream": "CPU us per stream, c=16",
        "stream_rate": "streaming chunks/s, c=16",
        "ttfb": "TTFB p50 (ms), c=1",
    }
    for mode, per in results.get("instrumentation", {}).items():
        diffs = [a - b for a, b in zip(per["gateway"], per["bare"], strict=True)]
        digits = 2 if mode == "ttfb" else 0
        lines.append(
            f"| {labels[mode]} | {median(per['gateway']):.{digits}f} | {median(per['bare']):.{digits}f} | "
            f"{median(diffs):+.{digits + 1}f} (rounds: {min(diffs):+.{digits}f} to {max(diffs):+.{digits}f}) |"
        )
    lines = [*lines, ""] if len(lines) > 2 else []  # the A/B rounds ran (--baseline-src)
    lines += ["| in-process, per request | CPU us |", "|---|---:|"]
    lines += [f"| {label} | {us:.2f} |" for label, us in in_process.items()]
    return "\n".join(lines)


def instrumentation_target(results: dict[str, Any], in_process: dict[str, float]) -> tuple[str, bool, str]:
    """Under 10 us of CPU per request, decided by the in-process figure (the end-to-end one is
    shown beside it: on a shared 2-core machine its noise is larger than the cost)."""
    whole = in_process["whole request"]
    value = f"{whole:.2f} us in-process"
    if "instrumentation" in results:
        plain = results["instrumentation"]["plain"]
        end_to_end = median([a - b for a, b in zip(plain["gateway"], plain["bare"], strict=True)])
        value += f"; {end_to_end:+.1f} us against the baseline (non-streaming, median of per-round differences)"
    return "per-request instrumentation < 10 us of CPU", whole < 10, value
