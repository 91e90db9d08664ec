"""The build report: what was built, what failed and why, how fast each engine runs on each target.

`write_report(rows, out)` writes `report.html` (self-contained: CSS inline, plots embedded as PNG data URIs),
`summary.md` (for a GitHub job summary) and one `latency-<model>-<component>.png` per component.
"""

from __future__ import annotations

import base64
import html
import io
import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from enginefarm.cache.artifacts import read_index, read_manifest
from enginefarm.cache.records import Benchmark
from enginefarm.cache.stores.base import Store
from enginefarm.errors import ConfigError

log = logging.getLogger(__name__)


@dataclass
class Row:
    model: str
    component: str
    precision: str
    target: str
    status: str  # built | failed | missing
    reason: str = ""
    key: str = ""
    p50_ms: float | None = None
    p90_ms: float | None = None
    load_ms: float | None = None
    min_cosine: float | None = None
    min_psnr: float | None = None
    decided_by: str = ""
    computes_in: str = ""
    build_s: float | None = None
    size: int = 0
    stored_size: int = 0
    device: str = ""
    peak_rss_mb: float | None = None  # the job's peak, measured in the processes that did the work
    stages: tuple = ()  # time and peak memory per stage: ({"stage", "seconds", "peak_rss_mb"}, ...)
    version: str = ""  # the model version (a recipe's model.version)
    spread: float | None = None  # the benchmark's IQR / median
    runs: int | None = None

    @property
    def ref(self) -> str:
        return f"{self.model}/{self.component}" + (f" v{self.version}" if self.version else "")


def collect(
    store: Store,
    reports: Iterable[Path] = (),
    expected: Iterable[dict[str, str]] = (),
    models: Iterable[str] | None = None,
) -> list[Row]:
    """Rows for every stored artifact, every failed job in `reports` (JSON from `enginefarm build --report`),
    and every `expected` job (model, component, precision, target) that is neither."""
    rows: dict[tuple[str, str, str, str], Row] = {}
    for model in models if models is not None else store.list_models():
        for key in read_index(store, model).entries:
            manifest = read_manifest(store, key)
            if manifest is None:
                continue
            bench = Benchmark.from_dict(manifest.benchmarks[0]) if manifest.benchmarks else None
            checks = manifest.validation.get("checks", [])
            row = Row(
                manifest.model,
                manifest.component,
                manifest.precision,
                manifest.target,
                "built",
                key=key,
                p50_ms=bench.p50_ms if bench else None,
                p90_ms=bench.p90_ms if bench else None,
                load_ms=bench.load_ms if bench else None,
                min_cosine=manifest.validation.get("min_cosine"),
                min_psnr=manifest.validation.get("min_psnr"),
                decided_by=", ".join(sorted({c.get("decided_by", "") for c in checks})),
                computes_in=manifest.validation.get("compute_precision", ""),
                build_s=manifest.provenance.get("build_seconds"),
                size=sum(f.size for f in manifest.files),
                stored_size=sum(f.stored_size for f in manifest.files),
                device=bench.device_class if bench else "",
                peak_rss_mb=manifest.provenance.get("peak_rss_mb"),
                stages=tuple(manifest.provenance.get("stages", ())),
                version=manifest.model_version,
                spread=bench.spread if bench else None,
                runs=bench.runs if bench else None,
            )
            ident = (row.model, row.component, row.precision, row.target)
            if ident not in rows or _newer_or_faster(row, rows[ident]):
                rows[ident] = row
    for path in reports:
        try:
            results = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(
                f"cannot read build report {path}: {exc}", hint="pass the JSON files `enginefarm build --report` wrote"
            ) from None
        for result in results:
            if "model" not in result:
                continue
            ident = (result["model"], result["component"], result["precision"], result["target"])
            built = rows.get(ident)
            if (
                result.get("status") == "built"
                and built is not None
                and built.key == result.get("key")
                and result.get("stages")
            ):
                built.stages, built.peak_rss_mb = (
                    tuple(result["stages"]),
                    result.get("peak_rss_mb"),
                )  # the report adds publish
            if result.get("status") != "failed":
                continue
            if ident not in rows:
                rows[ident] = Row(
                    *ident,
                    status="failed",
                    reason=result.get("reason", ""),
                    key=result.get("key") or "",
                    build_s=result.get("seconds"),
                    peak_rss_mb=result.get("peak_rss_mb"),
                    stages=tuple(result.get("stages") or ()),
                )
    for job in expected:
        ident = (job["model"], job["component"], job["precision"], job["target"])
        rows.setdefault(ident, Row(*ident, status="missing", reason=job.get("why", "not built yet")))
    return sorted(rows.values(), key=lambda r: (r.model, r.component, r.precision, r.target))


def _newer_or_faster(row: Row, other: Row) -> bool:
    """One row per model, component, precision and target: the newest model version, then the fastest."""
    from enginefarm.cache.versions import version_key

    if version_key(row.version) != version_key(other.version):
        return version_key(row.version) > version_key(other.version)
    return (other.p50_ms or 1e18) > (row.p50_ms or 1e18)


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        log.warning(message)


def latency_png(rows: list[Row]) -> bytes | None:
    """Horizontal bars of p50 latency (whiskers to p90) per target and precision, for one component."""
    timed = sorted(((r.p50_ms, r) for r in rows if r.p50_ms is not None), key=lambda pair: pair[0])
    if not timed:
        return None
    try:
        import matplotlib
    except ImportError:
        _warn_once(
            "latency charts need matplotlib: pip install 'enginefarm[report]' (the report is written without them)"
        )
        return None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measured = [r for _, r in timed]
    labels = [f"{r.target} {r.precision}" for r in measured]
    p50 = [p for p, _ in timed]
    spread = [max(0.0, (r.p90_ms or p) - p) for p, r in timed]
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(measured) + 1.2), dpi=110)
    colors = ["#2e7d32" if i == 0 else "#5c6bc0" for i in range(len(measured))]
    ax.barh(labels, p50, xerr=[[0] * len(spread), spread], color=colors, capsize=3)
    for y, (value, extra) in enumerate(zip(p50, spread, strict=True)):
        ax.text(value + extra, y, f"  {_fmt(value)} ms", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("latency, ms (bar: p50, whisker: p90)")
    ax.set_title(f"{measured[0].ref}: latency by target (lower is better)", fontsize=10)
    ax.margins(x=0.25)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return buffer.getvalue()


def _fmt(value: Any, spec: str = "", unit: str = "") -> str:
    if value is None:
        return "–"
    if not spec:  # human-friendly: 1834, 12.5, 0.313
        spec = ".0f" if abs(value) >= 100 else ".1f" if abs(value) >= 10 else ".3g"
    return f"{value:{spec}}{unit}"


def _spread(r: Row) -> str:
    """The benchmark's IQR / median and its repetitions (records from before spreads were kept show the runs only)."""
    runs = f" ({r.runs})" if r.runs else ""
    return f"{100 * r.spread:.1f}%{runs}" if r.spread is not None else (runs.strip() or "–")


def _mb(size: int) -> str:
    return f"{size / 2**20:.2f}"


def _stages(row: Row) -> str:
    return " · ".join(f"{s['stage']} {s['seconds']:.0f} s / {s['peak_rss_mb']:.0f} MB" for s in row.stages) or "–"


CSS = """body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222}h1{font-size:20px}
h2{font-size:16px;margin-top:28px}table{border-collapse:collapse;margin:8px 0}
td,th{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f3f3f3}.built{background:#e8f5e9}.failed{background:#ffebee}.missing{background:#f5f5f5;color:#777}
.num{text-align:right;font-variant-numeric:tabular-nums}.small{font-size:12px;color:#555}
.counts span{margin-right:12px;padding:2px 8px}
.pictures{display:flex;flex-wrap:wrap;gap:12px}.pictures figure{margin:0;border:1px solid #ccc;padding:6px}
.pictures img{width:192px;height:192px;image-rendering:pixelated;margin:0 4px 4px 0}
.pictures figcaption{max-width:392px}"""


def write_report(rows: list[Row], out: Path, title: str = "enginefarm build report", pictures=()) -> dict[str, int]:
    """`pictures`: builder/report_pictures.py's renders, shown in their own section (already written under `out`)."""
    out.mkdir(parents=True, exist_ok=True)
    counts = {status: sum(r.status == status for r in rows) for status in ("built", "failed", "missing")}
    targets = sorted({r.target for r in rows})
    refs = sorted({(r.model, r.component, r.precision) for r in rows})
    cell = {(r.model, r.component, r.precision, r.target): r for r in rows}
    built = [r for r in rows if r.status == "built"]

    parts = [
        "<!doctype html><html><head><meta "
        f"charset='utf-8'><title>{html.escape(title)}</title><style>{CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1><p class='counts'><span class='built'>built: {counts['built']}</span><span "
        f"class='failed'>failed: {counts['failed']}</span><span class='missing'>missing: "
        f"{counts['missing']}</span></p>",
        "<h2>Status</h2><table><tr><th>component</th><th>precision</th>",
    ]
    md = [
        f"# {title}",
        "",
        f"built **{counts['built']}**, failed **{counts['failed']}**, missing **{counts['missing']}**",
        "",
        "## Status",
        "",
        "| component | precision | " + " | ".join(targets) + " |",
        "|---|---|" + "---|" * len(targets),
    ]
    parts += [f"<th>{html.escape(t)}</th>" for t in targets] + ["</tr>"]
    for model, component, precision in refs:
        parts.append(f"<tr><td>{html.escape(model)}/{html.escape(component)}</td><td>{precision}</td>")
        md_cells = []
        for target in targets:
            r = cell.get((model, component, precision, target))
            if r is None:
                parts.append("<td></td>")
                md_cells.append("")
            elif r.status == "built":
                version = f" v{r.version}" if r.version else ""
                parts.append(f"<td class='built'>built{html.escape(version)} · p50 {_fmt(r.p50_ms, unit=' ms')}</td>")
                md_cells.append(f"✅{version} {_fmt(r.p50_ms, unit=' ms')}")
            else:
                mark = "❌" if r.status == "failed" else "⬜"
                parts.append(
                    f"<td class='{r.status}'><b>{r.status}</b><div "
                    f"class='small'>{html.escape(r.reason[:300])}</div></td>"
                )
                md_cells.append(f"{mark} {r.status}: {r.reason[:120].replace('|', '/')}")
        parts.append("</tr>")
        md.append(f"| {model}/{component} | {precision} | " + " | ".join(md_cells) + " |")
    parts.append("</table>")
    if pictures:  # right under the status: what a precision costs in the image is what a reviewer looks for first
        picture_parts, picture_md = _pictures_section(pictures)
        parts += picture_parts
        md += picture_md

    parts.append("<h2>Latency</h2>")
    md += [
        "",
        "## Latency and validation",
        "",
        "| artifact | target | precision | computes in | p50 ms | spread (runs) | p90 ms | load ms | min cosine | min "
        "PSNR dB |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for model, component in sorted({(r.model, r.component) for r in built}):
        png = latency_png([r for r in built if (r.model, r.component) == (model, component)])
        if png:
            (out / f"latency-{model}-{component}.png").write_bytes(png)
            parts.append(
                f"<img alt='latency of {html.escape(model)}/{html.escape(component)}' "
                f"src='data:image/png;base64,{base64.b64encode(png).decode()}'>"
            )
    parts.append(
        "<h2>Validation and benchmarks</h2><table><tr><th>artifact</th><th>target</th><th>precision</th><th>computes "
        "in</th><th>p50 ms</th><th>spread (runs)</th><th>p90 ms</th><th>load ms</th><th>min cosine</th><th>min PSNR "
        "dB</th><th>decided by</th><th>measured on</th></tr>"
    )
    for r in built:
        parts.append(
            f"<tr><td>{html.escape(r.ref)} <span class='small'>{r.key[:12]}</span></td>"
            f"<td>{r.target}</td><td>{r.precision}</td><td>{r.computes_in}</td>"
            f"<td class='num'>{_fmt(r.p50_ms)}</td><td class='num'>{_spread(r)}</td>"
            f"<td class='num'>{_fmt(r.p90_ms)}</td><td class='num'>{_fmt(r.load_ms, '.0f')}</td>"
            f"<td class='num'>{_fmt(r.min_cosine, '.8f')}</td><td class='num'>{_fmt(r.min_psnr, '.1f')}</td>"
            f"<td>{html.escape(r.decided_by)}</td><td>{html.escape(r.device)}</td></tr>"
        )
        md.append(
            f"| {r.ref} `{r.key[:12]}` | {r.target} | {r.precision} | {r.computes_in} | {_fmt(r.p50_ms)} | "
            f"{_spread(r)} | {_fmt(r.p90_ms)} | {_fmt(r.load_ms, '.0f')} | {_fmt(r.min_cosine, '.8f')} | "
            f"{_fmt(r.min_psnr, '.1f')} |"
        )
    parts.append(
        "</table><h2>Build times and sizes</h2><table><tr><th>artifact</th><th>target</th><th>precision</th><th>build "
        "s</th><th>size MiB</th><th>stored MiB</th><th>stored / size</th><th>peak RSS MB</th><th>per stage: time / "
        "peak RSS</th></tr>"
    )
    md += [
        "",
        "## Build times and sizes",
        "",
        "| artifact | target | precision | build s | size MiB | stored MiB | stored / size | peak RSS MB | per stage |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in built:
        ratio = f"{r.stored_size / r.size:.3f}" if r.size else "–"
        parts.append(
            f"<tr><td>{html.escape(r.ref)}</td><td>{r.target}</td><td>{r.precision}</td><td "
            f"class='num'>{_fmt(r.build_s, '.1f')}</td><td class='num'>{_mb(r.size)}</td><td "
            f"class='num'>{_mb(r.stored_size)}</td><td class='num'>{ratio}</td><td "
            f"class='num'>{_fmt(r.peak_rss_mb, '.0f')}</td><td class='small'>{html.escape(_stages(r))}</td></tr>"
        )
        md.append(
            f"| {r.ref} | {r.target} | {r.precision} | {_fmt(r.build_s, '.1f')} | {_mb(r.size)} | "
            f"{_mb(r.stored_size)} | {ratio} | {_fmt(r.peak_rss_mb, '.0f')} | {_stages(r)} |"
        )
    parts.append("</table></body></html>")
    (out / "report.html").write_text("".join(parts), encoding="utf-8")
    (out / "summary.md").write_text("\n".join(md) + "\n", encoding="utf-8")
    return counts


def _pictures_section(pictures) -> tuple[list[str], list[str]]:
    """Per model, one figure per backend × precision: the image, its difference from the reference (×10), numbers."""
    parts, md = (
        ["<h2>Pictures</h2>"],
        [
            "",
            "## Pictures",
            "",
            "| model | target | precision | max abs | mean abs | PSNR dB | ms/step |",
            "|---|---|---|---|---|---|---|",
        ],
    )
    for p in pictures:
        parts.append(
            f"<h3>{html.escape(p.model)} v{html.escape(p.version)}</h3><p class='small'>“{html.escape(p.prompt)}”, "
            f"seed {p.seed}, {p.steps} steps, {p.size}×{p.size}; differences against "
            f"{html.escape(p.reference or 'nothing rendered')}, shown ×10</p><div class='pictures'>"
        )
        for r in p.renders:
            numbers = (
                "reference"
                if r.diff is None
                else f"max abs {r.max_abs:.4f} · mean {r.mean_abs:.5f} · PSNR {_fmt(r.psnr_db, '.1f')} dB"
            )
            diff = (
                ""
                if r.diff is None
                else f"<img alt='difference of {html.escape(r.target)} {r.precision}' src='{_data_uri(r.diff)}'>"
            )
            parts.append(
                f"<figure><img alt='{html.escape(p.model)} on {html.escape(r.target)} {r.precision}' "
                f"src='{_data_uri(r.image)}'>{diff}<figcaption><b>{html.escape(r.target)} "
                f"{r.precision}</b><br>{numbers}<br>{r.ms_per_step:.0f} ms/step</figcaption></figure>"
            )
            md.append(
                f"| {p.model} | {r.target} | {r.precision} | {r.max_abs:.4f} | {r.mean_abs:.5f} | "
                f"{_fmt(r.psnr_db, '.1f')} | {r.ms_per_step:.0f} |"
            )
        parts.append("</div>")
        parts += [f"<p class='small'>not rendered: {html.escape(why)}</p>" for why in p.skipped]
    return parts, md


def _data_uri(png: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode()
