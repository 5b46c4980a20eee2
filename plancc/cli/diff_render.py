"""`plancc diff` reports for people: a terminal summary (`render_text`) and a compact CI comment
(`render_markdown`), both from the JSON-able report `plancc.api.diff` returns (nothing is re-read).

The markdown stays far below GitHub's comment limit: metric details are cut at `MAX_DETAIL_ROWS` rows, and
`--format json` has them all.
"""

from __future__ import annotations

from typing import Any

from plancc.core.numbers import format_number

MAX_DETAIL_ROWS = 200  # keeps the CI comment far below GitHub's 65,536-character limit
# metrics shown in the compact summaries (all changed metrics are in the JSON report)
SUMMARY_METRICS = ("batches", "updates", "label_cv", "update_label_cv", "packing_efficiency", "padding_ratio",
                   "max_naive_weight_skew")


def _delta(v: Any) -> str:
    return format_number(v, signed=True)


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _short(fp: Any) -> str:
    return str(fp)[:12] if isinstance(fp, str) and len(fp) > 12 else format_number(fp)


def summary_line(report: dict[str, Any]) -> str:
    """One line: identical, or which of config, dataset, metadata and plan changed (and how many
    regressions)."""
    if report["identical"]:
        return "plans are identical (dataset, metadata, config and every epoch's plan fingerprint match)"
    ch = report["changes"]
    what = [k for k in ("config", "dataset", "metadata", "plan", "eval") if ch.get(k)]
    line = f"plans differ: {', '.join(what)} changed"
    if ch["config"] and report["config"]:
        line += " (settings: " + ", ".join(c["setting"] for c in report["config"]) + ")"
    if report["regressions"]:
        line += f"; {len(report['regressions'])} metric regression(s)"
    return line


def _after_rows(report: dict[str, Any]) -> list[tuple[int, str, Any, Any]]:
    """(epoch, metric, old, new) of the summary metrics at the after stage, changed or not (from the report)."""
    out = []
    for entry in report["metrics"]:
        if entry["stage"] != "after" or entry["status"] != "both":
            continue
        for c in entry["changes"]:
            if c["metric"] in SUMMARY_METRICS:
                out.append((entry["epoch"], c["metric"], c["old"], c["new"]))
    order = {m: i for i, m in enumerate(SUMMARY_METRICS)}
    return sorted(out, key=lambda r: (r[0], order[r[1]]))


def _mix(side: dict[str, Any] | None) -> str:
    if side is None:
        return "-"
    mix = f"repeat {side['repeat']:g}x" if side.get("repeat") is not None else f"weight {side['weight']:g}"
    return f"{side['role']}, {mix}, {side['retained']:,} samples"


def dataset_lines(report: dict[str, Any]) -> list[str]:
    """A recipe's changed datasets: name, what changed, old -> new mix."""
    changed = [d for d in report.get("datasets", []) if d["status"] != "unchanged"]
    if not changed:
        return []
    return ["dataset changes:", *(f"  {d['name']}: {d['status'].replace('_', ' ')} ({_mix(d['old'])} -> "
                                  f"{_mix(d['new'])})" for d in changed)]


def render_text(report: dict[str, Any], failed: list[str] | None = None) -> str:
    """The terminal report: changes, fingerprints, metric deltas, regressions, churn and what failed."""
    lines = [f"old: {report['old']}", f"new: {report['new']}", summary_line(report)]
    if report["config"]:
        lines.append("config changes:")
        lines += [f"  {c['setting']}: {format_number(c['old'])} -> {format_number(c['new'])}" for c in report["config"]]
    lines += dataset_lines(report)
    changed_fp = [f for f in report["fingerprints"] if f["changed"]]
    if changed_fp:
        lines.append("fingerprint changes:")
        lines += [f"  {f['name']}: {_short(f['old'])} -> {_short(f['new'])}" for f in changed_fp]
    metric_lines = []
    for entry in report["metrics"]:
        if entry["status"] != "both":
            metric_lines.append(f"  epoch {entry['epoch']} {entry['stage']}: only in {entry['status'][:3]}")
            continue
        for c in entry["changes"]:
            metric_lines.append(f"  epoch {entry['epoch']} {entry['stage']:<8} {c['metric']:<28} "
                                f"{format_number(c['old']):>12} -> {format_number(c['new']):<12} ({_delta(c['delta'])})")
    if metric_lines:
        lines.append("metric deltas (epoch, stage, metric, old -> new):")
        lines += metric_lines
    if report["regressions"]:
        lines.append(f"metric regressions (tolerance {report['tolerance']}):")
        lines += [f"  epoch {r['epoch']} {r['metric']}: {format_number(r['old'])} -> {format_number(r['new'])} "
                  f"(worse by {abs(r['delta']):.4g}, allowed {r['allowed']:.4g})" for r in report["regressions"]]
    churn_lines = []
    for c in report["churn"]:
        if c["status"] != "compared":
            churn_lines.append(f"  epoch {c['epoch']}: only in {c['status'][:3]} plan")
            continue
        if c["first_differing_microbatch"] is None:
            continue
        line = (f"  epoch {c['epoch']}: update changed {_pct(c['update_changed_share'])}, rank changed "
                f"{_pct(c['rank_changed_share'])} of {c['common_samples']} common samples; microbatches identical "
                f"{c['identical_microbatches']}/{max(c['microbatches_old'], c['microbatches_new'])} "
                f"({_pct(c['identical_microbatch_share'])}); first differing microbatch "
                f"{c['first_differing_microbatch']}")
        if c["added_samples"] or c["removed_samples"]:
            line += f"; samples +{c['added_samples']} -{c['removed_samples']}"
        churn_lines.append(line)
        fd = c["first_difference"]
        for side in ("old", "new"):
            d = fd[side] if fd else None
            churn_lines.append(f"    {side}: " + ("(none)" if d is None else
                               f"update {d['update']} rank {d['rank']}, {d['samples']} samples, ids "
                               f"{_ids(d['sample_ids'], d['samples'])}"))
    if churn_lines:
        lines.append("membership churn:")
        lines += churn_lines
    lines += _eval_lines(report["eval"])
    if failed:
        lines.append("FAILED: " + "; ".join(failed))
    return "\n".join(lines) + "\n"


def _eval_lines(ev: dict[str, Any]) -> list[str]:
    """The eval plan's changes: which plan has one, size deltas, held-out samples added and removed."""
    if not ev["changed"]:
        return []
    where = {"old_only": " (only the old plan has one)", "new_only": " (only the new plan has one)"}
    lines = [f"eval plan changed{where.get(ev['status'], '')}: held-out samples +{ev['added_samples']} "
             f"-{ev['removed_samples']}"]
    return lines + [f"  {s['metric']:<28} {format_number(s['old']):>12} -> {format_number(s['new']):<12} "
                    f"({_delta(s['delta'])})" for s in ev["sizes"]]


def _ids(rows: list[list[int]], total: int) -> str:
    shown = sum(len(r) for r in rows)
    text = " | ".join(",".join(str(i) for i in r) for r in rows)
    return f"[{text}{' ...' if shown < total else ''}]"


def render_markdown(report: dict[str, Any], failed: list[str] | None = None) -> str:
    """A compact CI comment: one verdict line, one table of what moved, the rest folded. No paths, no times."""
    out = ["### plancc plan diff", ""]
    icon = "✅" if report["identical"] else ("❌" if failed else "⚠️")
    out.append(f"{icon} {summary_line(report)}")
    if failed:
        out.append("")
        out.append("**Failing:** " + "; ".join(failed))
    if report["identical"]:
        return "\n".join(out) + "\n"
    out.append("")
    rows: list[tuple[str, str, str, str]] = []
    for c in report["config"]:
        rows.append(("setting", f"`{c['setting']}`", format_number(c["old"]), format_number(c["new"])))
    for d in report.get("datasets", []):
        if d["status"] != "unchanged":
            rows.append(("dataset", f"`{d['name']}` {d['status'].replace('_', ' ')}", _mix(d["old"]), _mix(d["new"])))
    for f in report["fingerprints"]:
        if f["changed"] and f["name"] in ("dataset", "metadata", "plancc", "schema"):
            rows.append(("fingerprint", f["name"], f"`{_short(f['old'])}`", f"`{_short(f['new'])}`"))
    plan_changed = [f for f in report["fingerprints"] if f["changed"] and f["name"].startswith("plan[")]
    if plan_changed:
        rows.append(("fingerprint", "plan", f"{len(plan_changed)} epoch(s) changed", ""))
    for e, metric, a, b in _after_rows(report):
        delta = (b - a) if a is not None and b is not None else None
        rows.append((f"epoch {e}", metric, format_number(a), f"{format_number(b)} ({_delta(delta)})"))
    for c in report["churn"]:
        if c["status"] != "compared":
            rows.append((f"epoch {c['epoch']}", "epoch", "present" if c["status"] == "old_only" else "absent",
                         "present" if c["status"] == "new_only" else "absent"))
        elif c["first_differing_microbatch"] is not None:
            rows.append((f"epoch {c['epoch']}", "churn", "",
                         f"update {_pct(c['update_changed_share'])}, rank {_pct(c['rank_changed_share'])}, "
                         f"identical microbatches {_pct(c['identical_microbatch_share'])}, first diff "
                         f"#{c['first_differing_microbatch']}"))
    ev = report["eval"]
    if ev["changed"]:
        rows.append(("eval", "held-out samples", "", f"+{ev['added_samples']} -{ev['removed_samples']}"))
        rows += [("eval", s["metric"], format_number(s["old"]), f"{format_number(s['new'])} ({_delta(s['delta'])})")
                 for s in ev["sizes"]]
    if rows:
        out.append("| where | what | old | new |")
        out.append("|---|---|---|---|")
        out += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    if report["regressions"]:
        out.append("")
        out.append(f"**Regressions** (tolerance {report['tolerance']}): " + ", ".join(
            f"{r['metric']} epoch {r['epoch']} {format_number(r['old'])} → {format_number(r['new'])}" for r in report["regressions"]))
    detail = []
    for entry in report["metrics"]:
        if entry["status"] == "both" and entry["changes"]:
            detail += [f"| {entry['epoch']} | {entry['stage']} | {c['metric']} | {format_number(c['old'])} | {format_number(c['new'])} "
                       f"| {_delta(c['delta'])} |" for c in entry["changes"]]
    if detail:
        more = len(detail) - MAX_DETAIL_ROWS
        summary = "All metric deltas" if more <= 0 else f"Metric deltas (first {MAX_DETAIL_ROWS} of {len(detail)})"
        out += ["", f"<details><summary>{summary}</summary>", "",
                "| epoch | stage | metric | old | new | Δ |", "|---|---|---|---|---|---|", *detail[:MAX_DETAIL_ROWS]]
        if more > 0:
            out.append(f"\n{more} more in `plancc diff --format json`")
        out += ["", "</details>"]
    return "\n".join(out) + "\n"
