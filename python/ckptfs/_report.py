"""``report``: one self-contained HTML page of what ckptfs saves.

The plots are drawn with matplotlib (without pyplot, so the caller's
backend and figures are left alone) and embedded as base64 PNG; the page
loads nothing from anywhere else.
"""
from __future__ import annotations

import base64
import datetime
import html
import io
import os
from collections import OrderedDict
from typing import TYPE_CHECKING, Dict, List, Optional

from ._mounts import PathLike
from ._stats import ROLES, FileStats, Stats, stats as read_stats

if TYPE_CHECKING:  # matplotlib is only needed to draw
    from matplotlib.figure import Figure

ROLE_LABELS = {"weights": "weights", "first_moments": "Adam m (exp_avg)", "second_moments": "Adam v (exp_avg_sq)"}
ROLE_SHORT = {"weights": "w", "first_moments": "m", "second_moments": "v"}  # as `ckptfs stats` prints them
CODEC_LABELS = {"tensor": "tensor codec", "delta": "delta vs base", "ref": "dedup", "lossy": "lossy",
                "zstd": "zstd", "zero": "zero", "raw": "raw"}


def human(n: float) -> str:
    """Bytes as ``1.5 MiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{int(n)} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def series_of(files: Stats) -> "OrderedDict[str, List[FileStats]]":
    """The files grouped by directory (a checkpoint series), each in the
    order it was written (mtime, then name)."""
    groups: Dict[str, List[FileStats]] = {}
    for f in files:
        groups.setdefault(f.directory or ".", []).append(f)
    return OrderedDict((d, sorted(fs, key=lambda f: (f.mtime, f.relpath))) for d, fs in sorted(groups.items()))


def _png(fig: "Figure") -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=96, bbox_inches="tight")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _figure(width: float, height: float) -> "Figure":
    try:
        from matplotlib.figure import Figure
    except ImportError as e:
        raise ImportError("ckptfs.report() draws with matplotlib: install it (pip install 'ckptfs[report]', "
                          "or apt install python3-matplotlib)") from e
    return Figure(figsize=(width, height))


def _mib(n: float) -> float:
    return n / (1 << 20)


def plot_series(groups: "OrderedDict[str, List[FileStats]]") -> "Figure":
    """Cumulative logical against stored bytes per series, and each checkpoint's stored bytes."""
    fig = _figure(11, 4)
    cum, each = fig.subplots(1, 2)
    for i, (name, files) in enumerate(groups.items()):
        color = f"C{i % 10}"
        x = list(range(1, len(files) + 1))
        logical, stored = 0, 0
        cum_l, cum_s = [], []
        for f in files:
            logical += f.logical
            stored += f.stored
            cum_l.append(_mib(logical))
            cum_s.append(_mib(stored))
        cum.plot(x, cum_l, "--", color=color, alpha=0.6, label=f"{name}: logical")
        cum.plot(x, cum_s, "-o", color=color, markersize=3, label=f"{name}: stored")
        each.plot(x, [_mib(f.stored) for f in files], "-o", color=color, markersize=3, label=f"{name}: stored")
        each.plot(x, [_mib(f.logical) for f in files], ":", color=color, alpha=0.6, label=f"{name}: logical")
    cum.set(title="cumulative bytes over the series", xlabel="checkpoint (in write order)", ylabel="MiB")
    each.set(title="bytes of each checkpoint", xlabel="checkpoint (in write order)", ylabel="MiB")
    each.set_ylim(bottom=0)
    cum.set_ylim(bottom=0)
    cum.legend(fontsize=7)
    each.legend(fontsize=7)
    return fig


def plot_ratios(groups: "OrderedDict[str, List[FileStats]]") -> "Figure":
    """logical / stored of every file, coloured by series."""
    files = [(i, f) for i, fs in enumerate(groups.values()) for f in fs]
    fig = _figure(9, 0.8 + 0.22 * len(files))
    ax = fig.subplots()
    y = list(range(len(files)))[::-1]
    ax.barh(y, [f.ratio for _, f in files], color=[f"C{i % 10}" for i, _ in files])
    ax.set_yticks(y)
    ax.set_yticklabels([f.relpath for _, f in files], fontsize=7)
    for yy, (_, f) in zip(y, files):
        ax.text(f.ratio, yy, f" {f.ratio:.2f}x", va="center", fontsize=7)
    ax.axvline(1.0, color="grey", linewidth=0.8)
    ax.set(title="compression ratio per file (logical / stored)", xlabel="ratio")
    ax.margins(x=0.15)
    return fig


def plot_chain(groups: "OrderedDict[str, List[FileStats]]") -> "Figure":
    """Each file as a node, an arrow from the file its delta is against; colour: chain depth."""
    width = max(len(fs) for fs in groups.values())
    fig = _figure(min(14, 2 + 0.9 * width), 1.2 + 1.1 * len(groups))
    ax = fig.subplots()
    where = {}
    for row, (name, files) in enumerate(groups.items()):
        for col, f in enumerate(files):
            where[f.relpath] = (col, -row)
    depth_max = max([f.depth for fs in groups.values() for f in fs] + [1])
    for files in groups.values():
        for f in files:
            if f.base and f.base in where:
                ax.annotate("", xy=where[f.relpath], xytext=where[f.base],
                            arrowprops=dict(arrowstyle="->", color="0.4", shrinkA=7, shrinkB=7,
                                            connectionstyle="arc3,rad=-0.3"))
    xs = [where[f.relpath][0] for fs in groups.values() for f in fs]
    ys = [where[f.relpath][1] for fs in groups.values() for f in fs]
    depths = [f.depth for fs in groups.values() for f in fs]
    dots = ax.scatter(xs, ys, c=depths, cmap="viridis", vmin=0, vmax=depth_max, s=120, zorder=3,
                      edgecolors="black")
    for fs in groups.values():
        for f in fs:
            x, y = where[f.relpath]
            ax.text(x, y - 0.28, f.name, ha="center", va="top", fontsize=6, rotation=20)
    fig.colorbar(dots, ax=ax, label="delta chain depth")
    ax.set_yticks([-r for r in range(len(groups))])
    ax.set_yticklabels(list(groups.keys()), fontsize=8)
    ax.set_xticks(range(width))
    ax.set_xticklabels([str(i + 1) for i in range(width)])
    ax.set_ylim(-len(groups) + 0.4, 0.6)
    ax.set_xlim(-0.7, width - 0.3)
    ax.set(title="delta chain: each arrow points from a checkpoint's base to it", xlabel="checkpoint")
    return fig


def plot_lossy(files: List[FileStats]) -> "Figure":
    """Per lossy file and role: the largest error measured, as a share of its target."""
    fig = _figure(max(6, 1 + 0.6 * len(files)), 4)
    ax = fig.subplots()
    bar = 0.8 / len(ROLES)
    for r, role in enumerate(ROLES):
        xs, hs = [], []
        for i, f in enumerate(files):
            e = f.lossy.roles.get(role) if f.lossy else None
            if e is not None and e.target > 0:
                xs.append(i + (r - 1) * bar)
                hs.append(e.error / e.target)
        ax.bar(xs, hs, width=bar, color=f"C{r}", label=ROLE_LABELS[role])
    ax.axhline(1.0, color="red", linewidth=1, linestyle="--", label="target")
    ax.set_xticks(range(len(files)))
    ax.set_xticklabels([f.relpath for f in files], rotation=30, ha="right", fontsize=7)
    ax.set(title="lossy error per role (largest measured / target)", ylabel="share of the error target")
    ax.set_ylim(0, 1.15)
    ax.legend(fontsize=7)
    return fig


STYLE = """
body { font-family: sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; font-size: 0.85em; margin: 1em 0; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
th { background: #eee; } td.l, th.l { text-align: left; }
img { max-width: 100%; display: block; margin: 1em 0; }
.muted { color: #777; }
"""


def _row(cells: List[str], left: int = 1) -> str:
    return "<tr>" + "".join(f'<td class="l">{c}</td>' if i < left else f"<td>{c}</td>"
                            for i, c in enumerate(cells)) + "</tr>"


def _codec_mix(f: FileStats) -> str:
    if not f.codecs:
        return f.codec
    total = sum(c.raw for c in f.codecs) or 1
    parts = [f"{CODEC_LABELS.get(c.codec, c.codec)} {100 * c.raw / total:.0f}%"
             for c in sorted(f.codecs, key=lambda c: -c.raw) if c.raw]
    return ", ".join(parts) or f.codec


def _lossy_cell(f: FileStats) -> str:
    if f.lossy is None:
        return '<span class="muted">exact</span>'
    errs = "; ".join(f"{ROLE_SHORT[r]} {e.error:.3g} / {e.target:.3g}" for r, e in f.lossy.roles.items())
    return f"fidelity {f.lossy.fidelity:g}: {errs or 'none lossy'}"


def _file_table(groups: "OrderedDict[str, List[FileStats]]") -> str:
    head = ("<tr><th class='l'>file</th><th>state</th><th>logical</th><th>stored</th><th>ratio</th>"
            "<th class='l'>stored as</th><th>depth</th><th class='l'>base</th>"
            "<th class='l'>lossy: error / target (w weights, m, v Adam moments)</th></tr>")
    rows = []
    for files in groups.values():
        for f in files:
            cells = [html.escape(f.relpath), f.state, human(f.logical), human(f.stored), f"{f.ratio:.2f}x",
                     html.escape(_codec_mix(f)), str(f.depth), html.escape(f.base or ("(deleted file)" if f.base_pack
                                                                                     else "-")),
                     _lossy_cell(f)]
            rows.append("<tr>" + "".join(
                f'<td class="l">{c}</td>' if i in (0, 5, 7, 8) else f"<td>{c}</td>" for i, c in enumerate(cells))
                + "</tr>")
    return "<table>" + head + "".join(rows) + "</table>"


def _series_table(groups: "OrderedDict[str, List[FileStats]]") -> str:
    rows = []
    for name, files in groups.items():
        logical = sum(f.logical for f in files)
        stored = sum(f.stored for f in files)
        lossy = {f.lossy.fidelity for f in files if f.lossy}
        mode = "lossy " + ", ".join(f"{x:g}" for x in sorted(lossy)) if lossy else "lossless"
        rows.append(_row([html.escape(name), str(len(files)), human(logical), human(stored),
                          f"{logical / stored:.2f}x" if stored else "-", mode]))
    return ("<table><tr><th class='l'>series (directory)</th><th>files</th><th>logical</th><th>stored</th>"
            "<th>ratio</th><th>mode</th></tr>" + "".join(rows) + "</table>")


def render(st: Stats, title: Optional[str] = None) -> str:
    """The report for ``st`` as an HTML string."""
    groups = series_of(st)
    title = title or f"ckptfs savings: {st.path}"
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
             f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>"]
    when = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    parts.append(f"<p>{len(st)} files under <code>{html.escape(st.path)}</code> (mount "
                 f"<code>{html.escape(st.mountpoint)}</code>, store <code>{html.escape(st.store)}</code>), "
                 f"{when}. <b>{human(st.logical)}</b> logical stored in <b>{human(st.stored)}</b>: "
                 f"<b>{st.ratio:.2f}x</b>." + (f" {len(st.staged)} file(s) are still being sealed: their "
                                               f"stored size is the uncompressed staging copy."
                                               if st.staged else "") + "</p>")
    if not st.files:
        parts.append("<p>No files.</p></body></html>")
        return "".join(parts)
    parts.append("<h2>Series</h2>" + _series_table(groups))
    parts.append("<h2>Stored against logical bytes</h2>")
    parts.append(f"<img alt='stored vs logical bytes' src='{_png(plot_series(groups))}'>")
    parts.append("<h2>Ratio per file</h2>")
    parts.append(f"<img alt='ratio per file' src='{_png(plot_ratios(groups))}'>")
    parts.append("<h2>Delta chain</h2><p>A checkpoint is stored as a delta against a predecessor with the same "
                 "tensors; the depth is the longest chain a read decodes.</p>")
    parts.append(f"<img alt='delta chain' src='{_png(plot_chain(groups))}'>")
    parts.append("<h2>Lossy error per role</h2>")
    if st.lossy:
        parts.append("<p>The largest error measured when each file was sealed, as a share of the bound its "
                     "fidelity sets (docs/SEMANTICS.md, \"Lossy mode\").</p>")
        parts.append(f"<img alt='lossy error per role' src='{_png(plot_lossy(st.lossy))}'>")
    else:
        parts.append("<p class='muted'>No lossy files: everything reads back bit for bit.</p>")
    parts.append("<h2>Files</h2>" + _file_table(groups) + "</body></html>")
    return "".join(parts)


def report(path: PathLike, output: PathLike = "ckptfs-report.html", *, title: Optional[str] = None,
           stats: Optional[Stats] = None) -> str:
    """Writes a self-contained HTML report of the files at or below ``path``
    (inside a ckptfs mount) to ``output`` and returns its path.

    It shows the totals, each directory as a checkpoint series (stored
    against logical bytes over the series, cumulative and per checkpoint),
    the ratio of each file, the delta chain (which file each one is stored
    against, and the chain depth), the lossy error per role against its
    target, and a table of every file. Plots are PNGs embedded in the page
    (matplotlib; ``pip install 'ckptfs[report]'``). Pass ``stats`` to
    report numbers already read (e.g. by :func:`wait_sealed`).
    """
    st = stats if stats is not None else read_stats(path)
    text = render(st, title)
    out = os.fspath(output)
    tmp = out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, out)
    return out
