"""One PNG chart per benchmark family, drawn from bench/results/*.json with matplotlib.

    .venv/bin/python bench/charts.py [--results bench/results] [--out docs/img]

Writes ``<out>/bench-<family>.png`` for every family whose JSON is there (docs/benchmarks.md
embeds them next to the commands that wrote the JSON) and says which it skipped. Bars are the
p50 of a measure, the thin line on each its p95; the load average the run recorded is in the
title where the JSON has one, since absolute figures on a shared host move by ±30 %.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure

J = dict[str, Any]
COLORS = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3"]


def p(d: J | None, key: str = "p50") -> float:
    """A summary's figure (0 where the measure is missing, e.g. a step that failed)."""
    return float(d[key]) if isinstance(d, dict) and d.get(key) is not None else 0.0


def grouped(ax: Axes, rows: list[str], series: dict[str, list[J | None]], unit: str) -> None:
    """Horizontal bars: one group per row, one bar per series (p50), a whisker to the p95."""
    n = len(series)
    h = 0.8 / n
    for i, (name, values) in enumerate(series.items()):
        ys = [r + i * h - 0.4 + h / 2 for r in range(len(rows))]
        p50s = [p(v) for v in values]
        p95s = [max(p(v, "p95") - p(v), 0) if v and "p95" in v else 0 for v in values]
        ax.barh(ys, p50s, h * 0.9, xerr=[[0] * len(p95s), p95s], color=COLORS[i % len(COLORS)],
                label=name, error_kw={"elinewidth": 0.8, "capsize": 2})  # fmt: skip
        for y, v, up in zip(ys, p50s, p95s, strict=True):
            if v:
                text = f" {v:.0f}" if v >= 100 else f" {v:.3g}"
                ax.text(v + up, y, text, va="center", fontsize=7)
    ax.set_yticks(range(len(rows)), rows, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(unit)
    ax.margins(x=0.12)
    ax.grid(axis="x", alpha=0.3)
    if n > 1:
        ax.legend(fontsize=8, loc="best")


def load_note(d: J) -> str:
    for key in ("loadavg_1m_at_start", "load_start"):
        v = d.get(key, d.get("host", {}).get(key))
        if v is not None:
            return f" (load {v[0] if isinstance(v, list) else v} at start)"
    v = d.get("host", {}).get("loadavg_at_start")
    return f" (load {v[0]} at start)" if v else ""


def figure(rows: int, title: str, cols: int = 1, width: float = 9) -> tuple[Figure, Any]:
    fig, axes = plt.subplots(1, cols, figsize=(width, 0.45 * rows + 1.6), squeeze=False)
    fig.suptitle(title, fontsize=10)
    return fig, axes[0]


def growth(d: J) -> Figure:
    levels = d["levels"]
    xs = [r["live"] for r in levels]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    fig.suptitle(f"Cost growth: one sandhold serve, live idle base sandboxes{load_note(d)}",
                 fontsize=10)  # fmt: skip
    for key, label, c in (("create_ms", "Sandbox.create()", COLORS[0]),
                          ("kill_ms", "kill()", COLORS[2]),
                          ("list_all_ms", "Sandbox.list(), every page", COLORS[1])):  # fmt: skip
        a.plot(xs, [p(r[key]) for r in levels], "o-", color=c, label=f"{label} p50")
        a.plot(xs, [p(r[key], "p95") for r in levels], ":", color=c, label=f"{label} p95")
    floors = (("floor_python3_pass_ms", "floor: python3 -c pass p50 (the load)", "grey"),
              ("floor_bwrap_true_ms", "floor: bwrap --unshare-all true p50", "black"))  # fmt: skip
    for key, label, c in floors:
        if all(r.get(key) for r in levels):
            a.plot(xs, [p(r[key]) for r in levels], "s--", color=c, label=label, lw=0.8)
    a.set_yscale("log")
    a.set_xlabel("live sandboxes")
    a.set_ylabel("ms (log)")
    a.set_title("latency vs live sandboxes", fontsize=9)
    a.grid(alpha=0.3)
    a.legend(fontsize=7)
    mem = [r for r in levels if r.get("memory")]
    mx = [r["memory"]["sandboxes"] for r in mem]
    for key, label, c in (("pss_per_sandbox_mib", "PSS", COLORS[0]),
                          ("uss_per_sandbox_mib", "USS", COLORS[1]),
                          ("cgroup_memory_per_sandbox_mib", "cgroup charge", COLORS[2]),
                          ("rss_per_sandbox_mib", "RSS", COLORS[4])):  # fmt: skip
        b.plot(mx, [r["memory"][key] for r in mem], "o-", color=c, label=label)
    b.set_xscale("log")
    b.set_ylim(bottom=0)
    b.set_xlabel("live sandboxes (log)")
    b.set_ylabel("MiB per sandbox")
    b.set_title("host memory per sandbox vs count", fontsize=9)
    b.grid(alpha=0.3)
    b.legend(fontsize=7)
    fig.tight_layout()
    return fig


def e2b(d: J) -> Figure:
    rows = {
        "Sandbox.create() to ready": "create_to_ready_ms",
        "kill()": "kill_ms",
        'commands.run("true")': "command_run_true_ms",
        "… straight on the agent socket": "command_run_true_direct_agent_ms",
        "files.write + read, 1 KiB": "files_write_read_1kib_ms",
        "pause()": "pause_ms",
        "resume via connect()": "resume_via_connect_ms",
        "pause → connect → run": "pause_resume_run_roundtrip_ms",
        "session: create → run → kill": "session_create_run_kill_ms",
    }
    cc = d.get("concurrent_creates", {})
    fig, (ax,) = figure(len(rows) + 1, f"E2B server through the official SDK ({d.get('sdk', '')})"
                        f"{load_note(d)}")  # fmt: skip
    labels = [*rows, f"create, {cc.get('concurrency')} clients ({cc.get('creates_per_s')}/s)"]
    grouped(ax, labels, {"p50 (bar), p95": [d.get(k) for k in rows.values()]
                         + [cc.get("create_latency_ms")]}, "ms")  # fmt: skip
    fig.tight_layout()
    return fig


def pool(d: J) -> Figure:
    fig, (a, b) = figure(4, f"Pool of {d.get('pool')} base sandboxes vs booting per create"
                         f"{load_note(d)}", cols=2, width=11)  # fmt: skip
    rows = ["Sandbox.create()", "create → first result", "create in a burst"]
    grouped(a, rows, {
        "booted per create": [d.get("boot_create_ms"), d.get("boot_create_to_first_result_ms"),
                              d.get("boot_burst", {}).get("create_latency_ms")],
        "from the pool": [d.get("pool_create_ms"), d.get("pool_create_to_first_result_ms"),
                          d.get("pool_burst", {}).get("create_latency_ms")],
    }, "ms")  # fmt: skip
    burst = [d.get("boot_burst", {}), d.get("pool_burst", {})]
    b.bar(["booted", "pool"], [x.get("creates_per_s", 0) for x in burst], color=COLORS[:2])
    for i, x in enumerate(burst):
        b.text(i, x.get("creates_per_s", 0), f"{x.get('creates_per_s')}", ha="center", va="bottom")
    b.set_ylabel("creates / s")
    b.set_title(f"burst of {burst[1].get('creates')} from {burst[1].get('concurrency')} clients",
                fontsize=9)  # fmt: skip
    fig.tight_layout()
    return fig


def runtime(d: J) -> Figure:
    rows = {
        "floor: python3 -c pass": "floor_python3_pass_ms",
        "floor: bwrap --unshare-all true": "floor_bwrap_true_ms",
        "create → agent ready": "create_to_ready_ms",
        "create → first command": "create_to_first_command_ms",
        "command round trip (/bin/true)": "command_roundtrip_true_ms",
        "command round trip (bash -l -c true)": "command_roundtrip_bash_login_ms",
        "pause": "pause_ms",
        "resume": "resume_ms",
        "kill": "kill_ms",
    }
    idle = d.get("idle") or {}
    fig, (ax,) = figure(len(rows), f"Runtime, in-process (n={d.get('n')}); idle: "
                        f"{idle.get('healthy')} of {idle.get('requested')} healthy, "
                        f"PSS {p(idle.get('pss_per_sandbox_mib'))} MiB each")  # fmt: skip
    grouped(ax, list(rows), {"p50 (bar), p95": [d.get(k) for k in rows.values()]}, "ms")
    fig.tight_layout()
    return fig


def interpreter(d: J) -> Figure:
    rows = {
        "create returned": "sandbox_create_ms",
        "fresh sandbox → first run_code result": "fresh_sandbox_to_first_result_ms",
        "run_code('1+1'), warm context": "warm_run_code_1plus1_rtt_ms",
    }
    fig, (a, b) = figure(3, "code-interpreter-v1: cold boot vs warm (restored checkpoint)",
                         cols=2, width=11)  # fmt: skip
    grouped(a, list(rows), {k: [d.get(k, {}).get(m) for m in rows.values()]
                            for k in ("cold", "warm")}, "ms")  # fmt: skip
    grouped(b, ["idle sandbox PSS"], {k: [d.get(k, {}).get("idle_sandbox_pss_mib")]
                                      for k in ("cold", "warm")}, "MiB")  # fmt: skip
    fig.tight_layout()
    return fig


def gateway(d: J) -> Figure:
    rp = d.get("reclaim_pass", {})
    rows = {"tool call, warm sandbox": "tool_call_warm_ms",
            "first call of a session (create + run)": "first_call_ms",
            "first call after auto-pause (resume + run)": "resume_on_call_ms"}  # fmt: skip
    fig, (ax,) = figure(len(rows) + 1, f"Session gateway ({d.get('provider')} provider, "
                        f"{d.get('store')} store){load_note(d)}")  # fmt: skip
    grouped(ax, [*rows, f"reclaim, per paused sandbox ({rp.get('sandboxes')} in a pass)"],
            {"p50 (bar), p95": [d.get(k) for k in rows.values()]
             + [{"p50": rp.get("per_sandbox_ms")}]}, "ms")  # fmt: skip
    fig.tight_layout()
    return fig


def egress(d: J) -> Figure:
    lat = d.get("latency_per_request", {})
    med = lambda k: {"p50": lat.get(k, {}).get("median_ms"), "p95": lat.get(k, {}).get("p95_ms")}  # noqa: E731
    fig, (a, b) = figure(3, "Egress proxy: direct vs through the proxy", cols=2, width=11)
    grouped(a, ["plain HTTP", "HTTPS tunnelled", "HTTPS + injection"], {
        "direct": [med("http_direct"), med("tunnel_direct"), None],
        "through the proxy": [med("http_proxy"), med("tunnel_proxy"), med("inject_proxy")],
    }, "ms per request (median, p95)")  # fmt: skip
    t = d.get("throughput", {})
    mb = lambda k: {"p50": t.get(k, {}).get("mb_per_s")}  # noqa: E731
    grouped(b, ["1 MiB HTTP", "1 MiB tunnelled"], {
        "direct": [mb("large_1MB_http_direct"), mb("large_1MB_tunnel_direct")],
        "through the proxy": [mb("large_1MB_http_proxy"), mb("large_1MB_tunnel_proxy")],
    }, f"MB/s, {d.get('clients')} clients")  # fmt: skip
    fig.tight_layout()
    return fig


def suspend(d: J) -> Figure:
    kinds = [k for k in ("base", "base_holding_64mib", "code-interpreter-v1") if k in d]
    rows = {"pause (freezer)": "pause_ms", "suspend (criu dump)": "suspend_ms",
            "resume from disk": "resume_ms",
            "resume → first answer": "resume_to_first_answer_ms"}  # fmt: skip
    fig, (ax,) = figure(len(rows) * 2, f"Suspend to disk and resume (n={d.get('n')})"
                        f"{load_note(d)}")  # fmt: skip
    grouped(ax, list(rows), {k: [d[k].get(m) for m in rows.values()] for k in kinds}, "ms")
    fig.tight_layout()
    return fig


def fork(d: J) -> Figure:
    kinds = [k for k in ("base", "code-interpreter-v1") if k in d]
    rows = [("fork x1: call → first answer", "fork_1", "call_to_answer_ms"),
            ("fork x10: call → each first answer", "fork_10", "call_to_answer_ms"),
            ("fork: source's pause", "fork_1", "source_pause_ms"),
            ("fork: one fork's start", "fork_10", "start_ms"),
            ("full snapshot: take", "snapshot_full", "take_ms"),
            ("full snapshot: start → first answer", "snapshot_full", "start_to_first_answer_ms"),
            ("filesystem snapshot: start → first answer", "snapshot_filesystem",
             "start_to_first_answer_ms")]  # fmt: skip
    fig, (ax,) = figure(len(rows) * 2, f"Forks and snapshots (n={d.get('n')}){load_note(d)}")
    grouped(ax, [r[0] for r in rows],
            {k: [d[k].get(g, {}).get(m) for _, g, m in rows] for k in kinds}, "ms")  # fmt: skip
    fig.tight_layout()
    return fig


def templates(d: J) -> Figure:
    b = d.get("build_ms", {})
    rows = {"cold build (0 of 2 steps cached)": "cold", "identical rebuild (2 of 2)": "cached",
            "last step changed (1 of 2)": "last_step_changed"}  # fmt: skip
    fig, (ax,) = figure(len(rows), f"Template builds through the SDK (rounds={d.get('rounds')})")
    grouped(ax, list(rows), {"p50 (bar), p95": [b.get(k) for k in rows.values()]}, "ms")
    fig.tight_layout()
    return fig


def compare(d: J) -> Figure:
    ms = [m for m in d.get("measures", {}).values() if isinstance(m, dict)]
    fig, (ax,) = figure(len(ms) * 0.6, f"Before ÷ after ({d.get('rounds')} rounds): ratio of "
                        "median p50s, after / before")  # fmt: skip
    ys = range(len(ms))
    ratios = [m.get("ratio") or 0 for m in ms]
    ax.barh(ys, ratios, color=[COLORS[3] if r > 1.1 else COLORS[0] for r in ratios])
    ax.axvline(1, color="k", lw=0.8)
    ax.set_yticks(ys, [m.get("label", m.get("key")) for m in ms], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("after / before (1 = unchanged; red: above 1.10)")
    fig.tight_layout()
    return fig


FAMILIES: dict[str, tuple[str, Callable[[J], Figure]]] = {
    "growth": ("growth.json", growth),
    "e2b": ("e2b.json", e2b),
    "pool": ("pool.json", pool),
    "runtime": ("runtime.json", runtime),
    "interpreter": ("interpreter.json", interpreter),
    "gateway": ("gateway.json", gateway),
    "egress": ("egress.json", egress),
    "suspend": ("suspend.json", suspend),
    "fork": ("fork.json", fork),
    "templates": ("templates.json", templates),
    "compare": ("compare.json", compare),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", default="bench/results")
    ap.add_argument("--out", default="docs/img")
    ap.add_argument("families", nargs="*", help=f"any of {', '.join(FAMILIES)} (default: all)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    failed: list[str] = []
    for name in args.families or FAMILIES:
        file, draw = FAMILIES[name]
        src = Path(args.results) / file
        if not src.exists():
            print(f"skipped {name}: no {src}")
            continue
        try:
            fig = draw(json.loads(src.read_text()))
        except (KeyError, TypeError, ValueError, IndexError) as e:  # a JSON of another shape
            failed.append(name)
            print(f"failed {name}: {type(e).__name__}: {e} (its JSON has changed shape?)")
            continue
        fig.savefig(out / f"bench-{name}.png", dpi=100)
        plt.close(fig)
        print(f"wrote {out / f'bench-{name}.png'}")
    if failed:
        raise SystemExit(f"charts failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
