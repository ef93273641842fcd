#!/usr/bin/env python3
"""Tables over the lossy panel: bench/lossy_accuracy.py's JSON output of
each workload (one file per workload, or one file with several).

First, per workload and method, the total ratio and the final val loss
change against `none`, then the geometric mean of each ckptfs level's ratio
over the workloads and whether it stayed within +1% everywhere. Second,
per workload (issue 41): the oracle (the highest-ratio fixed level,
`lossy=steps:C` or `lossy=EPS`, within +1% final val loss: the runs of
`--oracle` and any fixed level the file holds), the default `-o lossy`
ratio, its share of the oracle and its Δ loss, and the ExCP and
LC-Checkpoint baselines at their best within +1% (over the settings the
file ran: --excp-alpha, --lc-bits).

  python3 bench/lossy_panel_table.py bench/out/panel_A.json bench/out/panel_B.json ...
"""
import json
import math
import re
import sys

FIXED_LEVEL = re.compile(r"^lossy=(steps:)?[0-9.]+(e-?[0-9]+)?$")


def rows_of(paths):
    out = {}
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        for key, res in data["workloads"].items():
            out[key] = res
    return out


def delta_pct(row, base):
    loss = row.get("val_loss")
    return 100 * (loss / base["val_loss"] - 1) if loss is not None and math.isfinite(loss) else math.inf


def summary(res, tolerance=0.01):
    """What the oracle table shows for one workload, from its rows (and its
    oracle runs): {"oracle", "default", "LC-Checkpoint", "ExCP"}, each None
    or {"setting", "ratio", "delta"} (delta in percent); "share" the
    default's ratio over the oracle's. Bests are the highest ratio within
    +tolerance of none's final val loss."""
    rows = [r for r in res["rows"] if r.get("status") == "ok"]
    base = next((r for r in rows if r["method"] == "none"), None)
    if base is None:
        return None
    tried = [r for r in (res.get("oracle") or {}).get("tried", []) if r.get("status") == "ok"]
    point = lambda r: {"setting": r["setting"], "ratio": r["total_ratio"], "delta": delta_pct(r, base)}  # noqa: E731

    def best(points):
        ok = [r for r in points if "total_ratio" in r and delta_pct(r, base) <= 100 * tolerance]
        return point(max(ok, key=lambda r: r["total_ratio"])) if ok else None

    fixed = [r for r in rows + tried if r["method"] == "ckptfs" and FIXED_LEVEL.match(r["setting"])]
    default = next((r for r in rows if r["method"] == "ckptfs" and r["setting"] == "lossy"), None)
    out = {"tolerance": tolerance, "oracle": best(fixed), "default": point(default) if default else None,
           "oracle_searched": "oracle" in res}
    for name in ("ExCP", "LC-Checkpoint"):
        pts = [r for r in rows if r["method"] == name]
        out[name] = best(pts) if pts else None
        out[name + " tried"] = len(pts)
    oracle = res.get("oracle")
    if out["oracle"] and oracle:
        # The best is its ladder's top level and the ladder never crossed the
        # bound: the true oracle may lie higher (shown as ">=").
        out["oracle"]["open"] = any(out["oracle"]["setting"] == levels[-1] and ladder not in oracle["stopped_at"]
                                    for ladder, levels in oracle["ladders"].items())
    out["share"] = (out["default"]["ratio"] / out["oracle"]["ratio"]
                    if out["default"] and out["oracle"] else None)
    return out


def method_table(results, keys):
    settings, cells = [], {}
    for key in keys:
        rows = [r for r in results[key]["rows"] if r.get("status") == "ok"]
        base = next(r for r in rows if r["method"] == "none")
        for r in rows:
            name = f"{r['method']} {r['setting']}".strip() if r["method"] != "none" else "none (lossless mount)"
            if name not in settings:
                settings.append(name)
            cells[(name, key)] = (r.get("total_ratio", 0.0), delta_pct(r, base), r.get("val_acc"))
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


def geo_mean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def fmt_point(p, tried):
    if p is None:
        return "none within bound" if tried else "-"
    return f"{'>=' if p.get('open') else ''}{p['ratio']:.1f}x ({p['setting']}, {p['delta']:+.2f}%)"


def fmt_oracle(s):
    """The oracle cell: its best point, or "not searched" where neither
    --oracle ran nor the file holds a fixed level within the bound."""
    if not s["oracle"] and not s["oracle_searched"]:
        return "not searched"
    return fmt_point(s["oracle"], True) + ("" if s["oracle_searched"] else " (not searched)")


def oracle_table(results, keys):
    sums = {k: summary(results[k]) for k in keys}
    sums = {k: s for k, s in sums.items() if s and (s["oracle"] or s["default"])}
    if not sums:
        return
    tol = 100 * next(iter(sums.values()))["tolerance"]
    print(f"\nOracle: each workload's best fixed level within +{tol:g}% final val loss; the default "
          "`-o lossy` against it; the baselines at their best within the same bound (\"none within bound\": "
          "no setting run was within it; \"-\": not run). An oracle not marked searched is the best of the "
          "fixed levels the file happens to hold; \">=\": the best is its ladder's top level, higher not tried "
          "(a share of it is an upper bound).\n")
    print("| workload | oracle ratio (level, Δ loss) | default `lossy` ratio | share of oracle | default Δ loss "
          "| ExCP best ≤ bound | LC-Checkpoint best ≤ bound |")
    print("|---|---|---|---|---|---|---|")
    for k, s in sums.items():
        d = s["default"]
        oracle = fmt_oracle(s)
        ratio = f"{d['ratio']:.1f}x" if d else "-"
        share = f"{100 * s['share']:.0f}%" if s["share"] else "-"
        delta = f"{d['delta']:+.2f}%" if d else "-"
        print(f"| {k} | {oracle} | {ratio} | {share} | {delta} "
              f"| {fmt_point(s['ExCP'], s['ExCP tried'])} | {fmt_point(s['LC-Checkpoint'], s['LC-Checkpoint tried'])} |")
    ora = [s["oracle"]["ratio"] for s in sums.values() if s["oracle"]]
    dft = [s["default"]["ratio"] for s in sums.values() if s["default"]]
    print(f"| geo-mean | {geo_mean(ora) or 0:.1f}x ({len(ora)} of {len(sums)}) | {geo_mean(dft) or 0:.1f}x "
          f"({len(dft)} of {len(sums)}) | | | | |")


def main():
    results = rows_of(sys.argv[1:])
    keys = sorted(results)
    method_table(results, keys)
    oracle_table(results, keys)


if __name__ == "__main__":
    main()
