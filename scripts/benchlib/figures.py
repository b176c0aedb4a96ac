"""What a workload reports, and how: figures against baselines with goals, the standard
measures of every run (wall, latencies, CPU per request, peak RSS, downloads, errors), the
table, the JSON file and the latency plot."""

from __future__ import annotations

import importlib
import json
import math
import os
import sys
import textwrap
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by linear interpolation between the closest ranks; NaN if empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


@dataclass(frozen=True)
class Goal:
    """A target on a figure's ratio to its baseline, or on its value itself."""

    on: Literal["ratio", "value"]
    op: Literal["<=", ">=", "<", "=="]
    target: float
    text: str = ""  # how the issue states it, when that reads better than the comparison

    def met(self, value: float, ratio: float | None) -> bool:
        x = ratio if self.on == "ratio" else value
        if x is None or math.isnan(x):
            return False
        if self.op == "<=":
            return x <= self.target
        if self.op == ">=":
            return x >= self.target
        if self.op == "<":
            return x < self.target
        return x == self.target

    def describe(self, unit: str) -> str:
        if self.text:
            return self.text
        if self.on == "ratio":
            return f"ratio {self.op} {self.target:g}x"
        return f"{self.op} {self.target:g} {unit}"


@dataclass
class Figure:
    workload: str
    metric: str
    value: float
    baseline: float
    baseline_name: str
    unit: str
    goal: Goal | None = None

    @property
    def ratio(self) -> float | None:
        if self.baseline:
            return self.value / self.baseline
        return 1.0 if self.value == self.baseline else None

    @property
    def goal_met(self) -> bool | None:
        return None if self.goal is None else self.goal.met(self.value, self.ratio)

    def to_json(self) -> dict[str, Any]:
        return {
            "workload": self.workload,
            "metric": self.metric,
            "value": _finite(self.value),
            "baseline": _finite(self.baseline),
            "baseline_name": self.baseline_name,
            "unit": self.unit,
            "ratio": _finite(self.ratio),
            "goal": self.goal.describe(self.unit) if self.goal else None,
            "goal_target": self.goal.target if self.goal else None,
            "goal_on": self.goal.on if self.goal else None,
            "goal_met": self.goal_met,
        }


@dataclass
class Measure:
    """The figures every workload reports for each thing it ran (the agent, a baseline)."""

    name: str
    wall_s: float = 0.0
    requests: int = 0
    latencies_s: list[float] = field(default_factory=list, repr=False)
    cpu_s: float | None = None  # of the serving process, read from /proc (client left out)
    peak_rss_bytes: int | None = None  # of the serving process (VmHWM)
    downloads: int | None = None  # counted at the source (the package server's GETs)
    extractions: int | None = None  # the agent's own count (CacheStats.extractions)
    errors: int = 0

    def add(self, other: Measure) -> None:
        """Pool another round of the same thing into this one."""
        self.wall_s += other.wall_s
        self.requests += other.requests
        self.latencies_s += other.latencies_s
        self.cpu_s = _add(self.cpu_s, other.cpu_s)
        if other.peak_rss_bytes is not None:
            self.peak_rss_bytes = max(self.peak_rss_bytes or 0, other.peak_rss_bytes)
        self.downloads = _add(self.downloads, other.downloads)
        self.extractions = _add(self.extractions, other.extractions)
        self.errors += other.errors

    def summary(self) -> dict[str, Any]:
        lat = self.latencies_s
        cpu_per = self.cpu_s / self.requests if self.cpu_s is not None and self.requests else None
        return {
            "name": self.name,
            "wall_s": self.wall_s,
            "requests": self.requests,
            "p50_ms": _finite(percentile(lat, 0.5) * 1000) if lat else None,
            "p99_ms": _finite(percentile(lat, 0.99) * 1000) if lat else None,
            "max_ms": max(lat) * 1000 if lat else None,
            "cpu_s": self.cpu_s,
            "cpu_s_per_request": cpu_per,
            "cpu_ms_per_request": cpu_per * 1000 if cpu_per is not None else None,
            "peak_rss_mb": self.peak_rss_bytes / 2**20 if self.peak_rss_bytes else None,
            "downloads": self.downloads,
            "extractions": self.extractions,
            "errors": self.errors,
        }


@dataclass
class WorkloadResult:
    name: str
    figures: list[Figure] = field(default_factory=list)
    measures: list[Measure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    disk_probe_files_per_s: float | None = None
    load_average: float | None = None  # the machine's 1-minute load when the workload began
    seconds: float = 0.0  # how long the workload took, setup included

    def figure(self, *args: Any, **kwargs: Any) -> Figure:
        fig = Figure(self.name, *args, **kwargs)
        self.figures.append(fig)
        return fig


def labelled_misses(rows: Sequence[Figure], why: Callable[[Figure], str]) -> list[str]:
    """Each missed goal among ``rows``, labelled: ``EXPECTED miss: <metric>: <why>`` when
    ``why(figure)`` knows a reason, else ``UNEXPECTED miss: <metric>`` (a scenario's oracle)."""
    out = []
    for f in rows:
        if f.goal_met:
            continue
        reason = why(f)
        out.append(
            f"EXPECTED miss: {f.metric}: {reason}" if reason else f"UNEXPECTED miss: {f.metric}"
        )
    return out


# -- the table -------------------------------------------------------------------------------


def fmt(x: float | None, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    a = abs(x)
    if a >= 10_000:
        return f"{x:,.0f}"
    if a >= 100:
        return f"{x:.1f}"
    if a >= 1 or a == 0:
        return f"{x:.2f}"
    return f"{x:.{digits}g}"


def table(results: list[WorkloadResult]) -> str:
    w = max([14, *(len(r.name) + 1 for r in results)])  # the peer run's names are longer
    figures = [f for r in results for f in r.figures]
    # a figure in bytes (the shared-wheels disk) is wider than 11: the columns grow to fit
    v = max([11, *(len(fmt(x)) + 2 for f in figures for x in (f.value, f.baseline))])
    head = (
        f"{'WORKLOAD':<{w}}{'METRIC (unit)':<62}{'VALUE':>{v}}{'BASELINE':>{v}}{'RATIO':>8}  GOAL"
    )
    lines = [head, "-" * len(head)]
    for result in results:
        for f in result.figures:
            ratio = f"{f.ratio:.2f}x" if f.ratio is not None else "-"
            goal = ""
            if f.goal is not None:
                goal = f"{f.goal.describe(f.unit)}: {'met' if f.goal_met else 'MISSED'}"
            metric = f"{f.metric} ({f.unit})"
            lines.append(
                f"{result.name:<{w}}{metric:<62}{fmt(f.value):>{v}}{fmt(f.baseline):>{v}}"
                f"{ratio:>8}  {goal}"
            )
            lines.append(f"{'':<16}baseline: {f.baseline_name}")
        if result.measures:
            lines.append(
                f"{'':<16}{'run (pooled over rounds)':<32}{'wall s':>8}{'reqs':>7}{'p50 ms':>8}"
                f"{'p99 ms':>8}{'max ms':>8}{'cpu ms/req':>11}{'RSS MB':>8}"
                f"{'dl':>5}{'ext':>5}{'err':>5}"
            )
            for m in result.measures:
                s = m.summary()
                dl = "-" if s["downloads"] is None else str(s["downloads"])
                ext = "-" if s["extractions"] is None else str(s["extractions"])
                lines.append(
                    f"{'':<16}{m.name[:31]:<32}{fmt(s['wall_s']):>8}{s['requests']:>7}"
                    f"{fmt(s['p50_ms']):>8}{fmt(s['p99_ms']):>8}{fmt(s['max_ms']):>8}"
                    f"{fmt(s['cpu_ms_per_request']):>11}{fmt(s['peak_rss_mb']):>8}"
                    f"{dl:>5}{ext:>5}{s['errors']:>5}"
                )
        for note in result.notes:
            lines += textwrap.wrap(
                f"note: {note}", 112, initial_indent=" " * 16, subsequent_indent=" " * 22
            )
        if result.disk_probe_files_per_s is not None:
            lines.append(
                f"{'':<16}machine: file creation {result.disk_probe_files_per_s:,.0f} files/s "
                f"next to the cache; load average {fmt(result.load_average)} at the start; "
                f"{result.seconds:.0f}s"
            )
        lines.append("")
    met = [f for r in results for f in r.figures if f.goal is not None and f.goal_met]
    missed = [f for r in results for f in r.figures if f.goal is not None and not f.goal_met]
    lines.append(f"goals: {len(met)} met, {len(missed)} missed")
    for f in missed:
        lines.append(f"  missed: {f.workload}: {f.metric}")
    return "\n".join(lines)


# -- the JSON file -----------------------------------------------------------------------------


def write_json(path: Path, results: list[WorkloadResult], meta: dict[str, Any]) -> None:
    workloads = {
        r.name: {
            "figures": [f.to_json() for f in r.figures],
            "measures": [m.summary() for m in r.measures],
            "notes": r.notes,
            "disk_probe_files_per_s": r.disk_probe_files_per_s,
            "load_average": r.load_average,
            "seconds": r.seconds,
        }
        for r in results
    }
    doc = {
        "meta": {
            "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            **meta,
        },
        "workloads": workloads,
        "figures": [f.to_json() for r in results for f in r.figures],
    }
    path.write_text(json.dumps(doc, indent=2, allow_nan=False) + "\n")


def _finite(x: float | None) -> float | None:
    return None if x is None or math.isnan(x) or math.isinf(x) else x


def _add(a: Any, b: Any) -> Any:
    if a is None:
        return b
    if b is None:
        return a
    return a + b


# -- the plot ------------------------------------------------------------------------------------


_NO_MATPLOTLIB = (
    "--plot needs matplotlib, which is not a dependency of the agent: "
    "pip install -e '.[bench]' (or pip install matplotlib)"
)


def plot_unavailable() -> str:
    """Why --plot cannot work here ("" if it can): checked before the run, not after it."""
    try:
        importlib.import_module("matplotlib")
    except ImportError:
        return _NO_MATPLOTLIB
    return ""


def plot(path: Path, results: list[WorkloadResult]) -> str:
    """Write the latency distributions (one panel per workload with requests) as a PNG; return
    an error message instead if matplotlib is not installed."""
    try:  # imported by name: matplotlib is an optional extra, absent where the checks run
        matplotlib: Any = importlib.import_module("matplotlib")
        matplotlib.use("Agg")
        plt: Any = importlib.import_module("matplotlib.pyplot")
        ticker: Any = importlib.import_module("matplotlib.ticker")
    except ImportError:
        return _NO_MATPLOTLIB
    panels = [r for r in results if any(len(m.latencies_s) >= 2 for m in r.measures)]
    if not panels:
        return "--plot: no workload measured latencies"
    cols = 2
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(12, 3.6 * rows), squeeze=False)
    for ax, result in zip(axes.flat, panels, strict=False):
        for m in result.measures:
            xs = sorted(x * 1000 for x in m.latencies_s)
            if len(xs) == 1:  # a single timing (one cold create): a line
                ax.axvline(xs[0], linestyle="--", color="gray", label=f"{m.name} (n=1)")
            elif xs:
                ys = [(i + 1) / len(xs) for i in range(len(xs))]
                ax.step(xs, ys, where="post", label=f"{m.name} (n={len(xs)})")
        ax.set_xscale("log")
        plain = ticker.FuncFormatter(lambda x, _: f"{x:g}")
        ax.xaxis.set_major_formatter(plain)
        low, high = ax.get_xlim()
        # within a decade there is at most one major tick: label the minor ones too
        ax.xaxis.set_minor_formatter(plain if high < 10 * low else ticker.NullFormatter())
        ax.set_xlabel("latency (ms, log)")
        ax.set_ylabel("fraction of requests")
        ax.set_title(result.name)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    fig.suptitle("runtime-env agent: latency distributions (CDF), agent vs baselines")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return ""
