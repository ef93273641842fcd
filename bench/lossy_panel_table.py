#!/usr/bin/env python3
"""One table over the issue-18 panel: bench/lossy_accuracy.py's JSON output
of each workload (one file per workload, or one file with several), per
workload and method the total ratio and the final val loss change against
`none`, then the geometric mean of each ckptfs level's ratio over the
workloads and whether it stayed within +1% everywhere.

  python3 bench/lossy_panel_table.py bench/out/panel_A.json bench/out/panel_B.json ...
"""
import json
import math
import sys


def rows_of(paths):
    out = {}
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        for key, res in data["workloads"].items():
            out[key] = res
    return out


def main():
    results = rows_of(sys.argv[1:])
    keys = sorted(results)
    settings = []
    cells = {}
    for key in keys:
        rows = [r for r in results[key]["rows"] if r.get("status") == "ok"]
        base = next(r for r in rows if r["method"] == "none")
        for r in rows:
            name = f"{r['method']} {r['setting']}".strip() if r["method"] != "none" else "none (lossless mount)"
            if name not in settings:
                settings.append(name)
            loss = r["val_loss"]
            delta = 100 * (loss / base["val_loss"] - 1) if loss is not None and math.isfinite(loss) else math.inf
            cells[(name, key)] = (r.get("total_ratio", 0.0), delta, r.get("val_acc"))
    head = "| method | " + " | ".join(f"{k}: ratio / Δ loss" for k in keys) + " | geo-mean ratio | worst Δ |"
    print(head)
    print("|" + "---|" * (len(keys) + 3))
    for name in settings:
        got = [cells.get((name, k)) for k in keys]
        parts = [((f"{c[0]:.1f}x" if c[0] > 0 else "-") + f" / {c[1]:+.2f}%" + (f" ({100 * c[2]:.1f}% acc)" if c[2] is not None else ""))
                 if c else "-" for c in got]
        present = [c for c in got if c]
        # Controls (jitter, --m-controls) store nothing: no ratio to average.
        ratios = [c[0] for c in present if c[0] > 0]
        geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios)) if ratios else 0
        worst = max(c[1] for c in present) if present else math.nan
        geo_text = f"{geo:.1f}x" if ratios else "-"
        print(f"| {name} | " + " | ".join(parts) + f" | {geo_text} | {worst:+.2f}% |")


if __name__ == "__main__":
    main()
