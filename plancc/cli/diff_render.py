"""`plancc diff` reports for people, read in ten seconds: a terminal report (`render_text`) and a CI comment
(`render_markdown`) of the same shape, both from the JSON-able report `plancc.api.diff` returns (nothing is
re-read):

1. the verdict, and what fails the check;
2. what changed: rows per dataset, each setting by name with both values, datasets added or reweighted, the
   plan's membership churn, the eval plan;
3. what it does to training: samples, tokens, updates, label tokens and each dataset's label share, old and new;
4. regressions, each with why it counts;
5. details (folded in markdown), trimmed to what changed: example rows, quality metrics that moved beyond noise,
   changed fingerprints. Every metric of every stage is in `--format json`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from plancc.core.numbers import format_number
from plancc.review.diff_rules import rows_summary

MAX_DETAIL_ROWS = 200  # keeps the CI comment far below GitHub's 65,536-character limit (with --rows)


@dataclass
class Shape:
    """The report's parts in reading order; items use `code` marks and arrows (markdown), stripped for text."""

    verdict: str
    failing: list[str]
    changed: list[str] = field(default_factory=list)
    training_title: str = "Training"
    training: list[tuple[str, str, str, str]] = field(default_factory=list)  # what, old, new, change
    training_line: str | None = None  # instead of the table when nothing moved
    regressions: list[str] = field(default_factory=list)
    details: list[tuple[str, list[str]]] = field(default_factory=list)  # (title, lines)


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _value(v: Any) -> str:
    if isinstance(v, list):
        return ",".join(str(x) for x in v) if v else "(none)"
    return "(none)" if v is None else format_number(v)


def _dataset_item(d: dict[str, Any], recipe: bool) -> str | None:
    name, st = f"`{d['name']}`", d["status"]
    if st in ("added", "removed"):
        side = d["new"] if st == "added" else d["old"]
        return f"dataset {name} {st} ({side['retained']:,} samples)"
    if st not in ("content_changed", "rederived"):
        return None
    counts = f"{d['old']['retained']:,} → {d['new']['retained']:,} samples"
    rows = rows_summary(d["rows"]) if d["rows"] else "content changed"
    what = f"{name} rows" if recipe else "rows"
    if st == "rederived":
        return f"{what}: {rows} by the settings changed, the source being unchanged ({counts})"
    return f"{what}: {rows} ({counts})"


def _setting_item(c: dict[str, Any]) -> str:
    where = f"`{c['dataset']}`: " if c["dataset"] else ""
    kind = f" ({c['kind']})" if c["kind"] in ("masks", "mix") else ""
    return f"{where}`{c['setting']}` {_value(c['old'])} → {_value(c['new'])}{kind}"


def _churn_item(report: dict[str, Any]) -> str | None:
    compared = [c for c in report["churn"] if c["status"] == "compared" and c["first_differing_microbatch"] is not None]
    only = [c for c in report["churn"] if c["status"] != "compared"]
    parts = [f"epoch {c['epoch']} only in the {c['status'][:3]} plan" for c in only]
    if compared:
        n = len(compared)
        upd = sum(c["update_changed_share"] for c in compared) / n
        rank = sum(c["rank_changed_share"] for c in compared) / n
        same = sum(c["identical_microbatch_share"] for c in compared) / n
        which = f"epoch {compared[0]['epoch']}" if n == 1 else f"{n} epochs, mean"
        parts.insert(0, f"{_pct(upd)} of samples in another update, {_pct(rank)} on another rank, {_pct(same)} of "
                        f"microbatches identical ({which}; first difference at microbatch "
                        f"{compared[0]['first_differing_microbatch']})")
    return "membership: " + "; ".join(parts) if parts else None


def changed_items(report: dict[str, Any]) -> list[str]:
    """What changed, one item each: rows per dataset, datasets, settings, notes, membership, eval."""
    recipe = len(report["datasets"]) > 1 or any(d["old"] and "role" in d["old"] for d in report["datasets"])
    items = [i for d in report["datasets"] if (i := _dataset_item(d, recipe))]
    items += [_setting_item(c) for c in report["config"]]
    if report["changes"]["config"] and not report["config"]:
        items.append("the config fingerprint changed (no setting differs by name)")
    items += report.get("notes", [])
    if (churn := _churn_item(report)) is not None:
        items.append(churn)
    ev = report["eval"]
    if ev["changed"]:
        where = {"old_only": " (only the old plan has one)", "new_only": " (only the new plan has one)"}
        sizes = ", ".join(f"{s['metric']} {_value(s['old'])} → {_value(s['new'])}" for s in ev["sizes"])
        items.append(f"eval plan{where.get(ev['status'], '')}: held-out samples +{ev['added_samples']} "
                     f"-{ev['removed_samples']}" + (f"; {sizes}" if sizes else ""))
    if report["changes"]["plancc"]:
        fp = {f["name"]: f for f in report["fingerprints"]}
        items.append(f"plancc {_value(fp['plancc']['old'])} → {_value(fp['plancc']['new'])}")
    return items


def _change(a: Any, b: Any) -> str:
    if a is None or b is None or a == b:
        return "" if a == b else "n/a"
    delta = b - a
    rel = f" ({100 * delta / a:+.1f}%)" if a else ""
    return f"{format_number(delta, signed=True)}{rel}"


def training_table(report: dict[str, Any]) -> tuple[str, list[tuple[str, str, str, str]], str | None]:
    """(title, rows, line): the totals old vs new, or one line when none moved."""
    t = report["training"]
    ep = t["epochs"]
    title = f"Training ({ep['old']} epoch{'s' if ep['old'] != 1 else ''})" if ep["old"] == ep["new"] else \
        f"Training ({ep['old']} → {ep['new']} epochs)"
    keys = (("samples", "samples"), ("tokens", "tokens"), ("updates", "updates"), ("label_tokens", "label tokens"))
    rows = [(label, format_number(t[k]["old"]), format_number(t[k]["new"]), _change(t[k]["old"], t[k]["new"]))
            for k, label in keys]
    shares = [s for s in t["label_shares"] if s["old"] is None or s["new"] is None
              or abs(s["new"] - s["old"]) >= 0.0005]
    rows += [(f"label share `{s['dataset']}`", "-" if s["old"] is None else _pct(s["old"]),
              "-" if s["new"] is None else _pct(s["new"]),
              "" if s["old"] is None or s["new"] is None else f"{100 * (s['new'] - s['old']):+.1f} pt")
             for s in shares]
    if not shares and all(t[k]["old"] == t[k]["new"] for k, _ in keys):
        totals = ", ".join(f"{label} {format_number(t[k]['old'])}" for k, label in keys)
        return title, [], f"unchanged: {totals}"
    return title, rows, None


def _refs(rows: list[dict[str, Any]], total: int, edited: bool = False) -> str:
    """Named rows, the file said once per run of rows from it, consecutive rows as a range (`rows 3-7`); an
    edited row that moved says where it was (and stands alone)."""
    runs: list[list[Any]] = []  # [file, first row, last row, was]
    for r in rows:
        o = r.get("old") if edited else None
        was = None if o is None or (o.get("file"), o["row"]) == (r.get("file"), r["row"]) else o
        if runs and was is None and runs[-1][3] is None and runs[-1][0] == r.get("file") and runs[-1][2] + 1 == r["row"]:
            runs[-1][2] = r["row"]
        else:
            runs.append([r.get("file"), r["row"], r["row"], was])
    shown, last = [], None
    for file, a, b, was in runs:
        text = ("" if file is None or file == last else f"{file} ") + (f"row {a}" if a == b else f"rows {a}-{b}")
        last = file
        if was is not None:
            text += f" (was {was['file'] + ' ' if was.get('file') and was['file'] != file else ''}row {was['row']})"
        shown.append(text)
    more = total - len(rows)
    return ", ".join(shown) + (f" … (+{more:,} more)" if more > 0 else "")


def row_details(report: dict[str, Any]) -> tuple[str, list[str]] | None:
    """The changed rows of each dataset, named (the first ten of each kind, or all with --rows)."""
    lines, total = [], 0
    for d in report["datasets"]:
        rows = d["rows"]
        if not rows:
            continue
        for kind in ("edited", "added", "removed"):
            if rows[kind]:
                total += rows[kind]
                lines.append(f"`{d['name']}` {kind}: {_refs(rows['examples'][kind], rows[kind], kind == 'edited')}")
    if not lines:
        return None
    listed = any(d["rows"] and d["rows"].get("listed") == "all" for d in report["datasets"])
    return f"Rows: {total:,} changed" + ("" if listed else " (examples; `--rows` lists all)"), lines


def quality_details(report: dict[str, Any]) -> tuple[str, list[str]] | None:
    """The quality metrics that moved beyond noise, per epoch."""
    q = report.get("quality", [])
    if not q:
        return None
    lines = [f"epoch {m['epoch']} `{m['metric']}` {format_number(m['old'])} → {format_number(m['new'])} "
             f"({format_number(m['delta'], signed=True)}, {'worse' if m['worse'] else 'better'}; noise up to "
             f"{m['allowed']:.3g})" for m in q]
    return "Quality metrics beyond noise (after stage)", lines


def fingerprint_details(report: dict[str, Any]) -> tuple[str, list[str]] | None:
    """The fingerprints that changed (plan epochs counted, not listed)."""
    fps = [f for f in report["fingerprints"] if f["changed"]]
    if not fps:
        return None
    short = [f"{f['name']} `{_short(f['old'])}` → `{_short(f['new'])}`" for f in fps if not f["name"].startswith("plan[")]
    epochs = [f for f in fps if f["name"].startswith("plan[")]
    if epochs:
        short.append(f"plan: {len(epochs)} epoch(s) changed")
    return "Fingerprints", short


def _short(fp: Any) -> str:
    return str(fp)[:12] if isinstance(fp, str) and len(fp) > 12 else format_number(fp)


def verdict(report: dict[str, Any]) -> str:
    """One line: identical, or which kinds of change there are."""
    if report["identical"]:
        return "plans are identical (dataset, metadata, config and every epoch's plan fingerprint match)"
    ch = report["changes"]
    kinds = [name for key, name in (("data", "data"), ("masks", "masks"), ("config", "settings"), ("plan", "plan"),
                                    ("eval", "eval plan"), ("plancc", "plancc version")) if ch.get(key)]
    if (ch["rows"] or ch["dataset"]) and not ch["data"]:
        kinds.insert(0, "samples")
    if not kinds:
        return ("plans differ only in the metadata fingerprint: the same samples in the same plan, made by a "
                "tokenizer or template recorded differently (see below)")
    line = "plans differ: " + ", ".join(kinds)
    if report["regressions"]:
        line += f"; {len(report['regressions'])} metric regression(s)"
    return line


def shape(report: dict[str, Any], failed: list[str] | None) -> Shape:
    """The report's parts (module docstring), for either renderer."""
    s = Shape(verdict(report), list(failed or []))
    if report["identical"]:
        return s
    s.changed = changed_items(report)
    s.training_title, s.training, s.training_line = training_table(report)
    s.regressions = [f"epoch {r['epoch']}: {r['why']}" for r in report["regressions"]]
    s.details = [d for d in (row_details(report), quality_details(report), fingerprint_details(report)) if d]
    return s


def _plain(text: str) -> str:
    return text.replace("`", "").replace("→", "->").replace("…", "...")


def render_text(report: dict[str, Any], failed: list[str] | None = None) -> str:
    """The terminal report: the same parts as the markdown, in the same order, nothing folded."""
    s = shape(report, failed)
    lines = [f"old: {report['old']}", f"new: {report['new']}", s.verdict]
    if s.failing:
        lines.append("FAILED: " + "; ".join(s.failing))
    if s.changed:
        lines += ["changed:", *(f"  - {i}" for i in s.changed)]
    if s.training_line:
        lines.append(f"{s.training_title.lower()}: {s.training_line}")
    elif s.training:
        width = max(len(a) for a, *_ in s.training)
        lines += [f"{s.training_title.lower()}:", f"  {'':<{width}}{'old':>14}{'new':>14}  change"]
        lines += [f"  {a:<{width}}{b:>14}{c:>14}  {d}".rstrip() for a, b, c, d in s.training]
    if s.regressions:
        lines += [f"regressions (tolerance {report['tolerance']:g}):", *(f"  - {r}" for r in s.regressions)]
    for title, body in s.details:
        lines += [f"{title.lower()}:", *(f"  {b}" for b in body[:MAX_DETAIL_ROWS])]
        if len(body) > MAX_DETAIL_ROWS:
            lines.append(f"  ... {len(body) - MAX_DETAIL_ROWS} more in --format json")
    return _plain("\n".join(lines)) + "\n"


def render_markdown(report: dict[str, Any], failed: list[str] | None = None) -> str:
    """A CI comment: verdict and what fails first, then what changed and what it does to training, details
    folded. No paths, no times."""
    s = shape(report, failed)
    icon = "✅" if report["identical"] else ("❌" if s.failing else "⚠️")
    out = ["### plancc plan diff", "", f"{icon} {s.verdict}"]
    if s.failing:
        out += ["", "**Failing:** " + "; ".join(s.failing)]
    if s.changed:
        out += ["", "**Changed**", *(f"- {i}" for i in s.changed)]
    if s.training_line:
        out += ["", f"**{s.training_title}**: {s.training_line}"]
    elif s.training:
        out += ["", f"**{s.training_title}**", "", "| | old | new | change |", "|---|---:|---:|---:|",
                *(f"| {a} | {b} | {c} | {d} |" for a, b, c, d in s.training)]
    if s.regressions:
        out += ["", f"**Regressions** (tolerance {report['tolerance']:g})", *(f"- {r}" for r in s.regressions)]
    for title, body in s.details:
        more = len(body) - MAX_DETAIL_ROWS
        out += ["", f"<details><summary>{title}</summary>", "", *(f"- {b}" for b in body[:MAX_DETAIL_ROWS])]
        if more > 0:
            out.append(f"- … {more} more in `plancc diff --format json`")
        out += ["", "</details>"]
    return "\n".join(out) + "\n"
