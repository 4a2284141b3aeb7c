"""report.html and the plots of a capacity run: what an operator reads at a glance.

One self-contained HTML file (the PNGs embedded as data: URIs, no script, no external style) with the
settings, the knee, the per-level table and three plots against concurrency — throughput, time to first
token, inter-token latency — each with the knee marked. The same PNGs are written beside it.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path

# (file, title, y label, [(results.json field, legend)])
PLOTS = [
    ("throughput.png", "Throughput", "requests/s",
     [("request_throughput_rps", "requests/s")]),
    ("ttft.png", "Time to first token", "ms",
     [("ttft_p50_ms", "p50"), ("ttft_p99_ms", "p99")]),
    ("itl.png", "Inter-token latency", "ms",
     [("itl_p50_ms", "p50"), ("itl_p99_ms", "p99")]),
]
TABLE = [  # (field, header, format)
    ("concurrency", "concurrency", "{:g}"),
    ("requests", "requests", "{:d}"),
    ("errors", "errors", "{:d}"),
    ("request_throughput_rps", "req/s", "{:.2f}"),
    ("output_token_throughput_tps", "output tok/s", "{:.0f}"),
    ("ttft_p50_ms", "TTFT p50 ms", "{:.0f}"),
    ("ttft_p99_ms", "TTFT p99 ms", "{:.0f}"),
    ("itl_p50_ms", "ITL p50 ms", "{:.1f}"),
    ("itl_p99_ms", "ITL p99 ms", "{:.1f}"),
    ("latency_p50_ms", "latency p50 ms", "{:.0f}"),
    ("latency_p99_ms", "latency p99 ms", "{:.0f}"),
]


def plot(results: dict, directory: Path) -> list[Path]:
    """The PNGs of `results` in `directory`; a plot without any value (e.g. TTFT of a run without streaming)
    is left out."""
    import matplotlib

    matplotlib.use("Agg")  # no display on a server; also what makes it safe in a test
    import matplotlib.pyplot as plt

    levels = sorted(results["levels"], key=lambda lv: lv["concurrency"])
    knee = (results.get("knee") or {}).get("concurrency")
    written = []
    for name, title, ylabel, series in PLOTS:
        drawn = False
        fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=100)
        for field, legend in series:
            points = [(lv["concurrency"], lv[field]) for lv in levels if lv.get(field) is not None]
            if points:
                ax.plot(*zip(*points, strict=True), marker="o", label=legend)
                drawn = True
        if not drawn:
            plt.close(fig)
            continue
        if name == "throughput.png" and knee is not None:
            # the two fitted lines the knee comes from (knee.py)
            slope, plateau = results["knee"]["slope_rps_per_caller"], results["knee"]["plateau_rps"]
            top = max(lv["concurrency"] for lv in levels)
            ax.plot([0, knee], [0, slope * knee], ":", color="grey", label="fit")
            ax.plot([knee, top], [plateau, plateau], ":", color="grey")
        if knee is not None:
            ax.axvline(knee, color="crimson", linestyle="--", label=f"knee ≈ {knee:.1f}")
        ax.set_title(title)
        ax.set_xlabel("concurrency (callers)")
        ax.set_ylabel(ylabel)
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize="small")
        fig.tight_layout()
        path = directory / name
        fig.savefig(path, format="png")
        plt.close(fig)
        written.append(path)
    return written


def _cell(value, fmt: str) -> str:
    if value is None:
        return "—"
    try:
        return fmt.format(value)
    except (ValueError, TypeError):
        return html.escape(str(value))


def write_html(results: dict, pngs: list[Path], path: Path):
    s = results["settings"]
    knee = results.get("knee") or {}
    settings = [
        ("target", s["url"]), ("model", s["model"]), ("label", s.get("label") or ""),
        ("levels (concurrency)", ", ".join(f"{c:g}" for c in s["levels"])),
        ("per level", f"{s['requests_per_level']} requests" if s.get("requests_per_level")
         else f"{s['duration_s']:g} s"),
        ("workload", ", ".join(f"{k}={v}" for k, v in s["workload"].items())),
        ("load generator", f"aiperf {s['aiperf_version']} ({s['aiperf']})"),
        ("started / finished", f"{results['started']} / {results['finished']}"),
    ]
    if knee.get("concurrency") is not None:
        verdict = (f"<b>{knee['concurrency']:.1f}</b> concurrent requests "
                   f"(plateau {knee['plateau_rps']:.2f} req/s, {knee['slope_rps_per_caller']:.3f} req/s per caller "
                   f"below it)")
    else:
        verdict = f"none within the sweep: {html.escape(knee.get('reason', ''))}"
    rows = "\n".join(
        "<tr>" + "".join(f"<td>{_cell(lv.get(field), fmt)}</td>" for field, _, fmt in TABLE) + "</tr>"
        for lv in sorted(results["levels"], key=lambda lv: lv["concurrency"]))
    images = "\n".join(
        f'<img alt="{p.stem}" src="data:image/png;base64,{base64.b64encode(p.read_bytes()).decode()}">'
        for p in pngs)
    errors = [f"concurrency {lv['concurrency']:g}: {html.escape(e)}" for lv in results["levels"]
              for e in lv.get("error_examples") or []]
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>Capacity: {html.escape(s['model'])} at {html.escape(s['url'])}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; margin: 1em 0; }}
td, th {{ border: 1px solid #bbb; padding: 0.25em 0.6em; text-align: right; }}
table.settings td {{ text-align: left; }}
img {{ margin: 0.5em 1em 0.5em 0; }}
.knee {{ font-size: 1.2em; }}
</style></head><body>
<h1>Capacity: {html.escape(s['model'])}</h1>
<p class="knee">Knee: {verdict}</p>
<p>{html.escape(knee.get('definition', ''))}.</p>
<h2>Settings</h2>
<table class="settings">{''.join(f'<tr><th>{k}</th><td>{html.escape(str(v))}</td></tr>' for k, v in settings)}</table>
<h2>Per level</h2>
<table><tr>{''.join(f'<th>{h}</th>' for _, h, _ in TABLE)}</tr>
{rows}</table>
{('<h2>Errors</h2><ul>' + ''.join(f'<li>{e}</li>' for e in errors) + '</ul>') if errors else ''}
<h2>Plots</h2>
{images}
<p>Numbers are aiperf's own (its raw exports per level are in raw/); throughput is completed requests per second
over each level's run.</p>
</body></html>
"""
    path.write_text(page, encoding="utf-8")
