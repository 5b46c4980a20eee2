"""The short summaries `compile` and `scan` print: a few lines under 80 columns; full tables are `inspect metrics`.

Each summary is a list of `label: value` lines built from the manifest's JSON (`Manifest.to_json`) / the scan
record's (`ScanRecord.to_json`). Fields other parts of plancc
may or may not record (drop counts, tokenizer and chat template names) are read with a fallback, so a summary of
an older plan still renders; a new line is one more entry in `_sample_lines` or `compile_summary`.
"""

from __future__ import annotations

from typing import Any

PAIRED = ("preference", "axolotl_preference")  # the formats whose rows are pairs (two sequences a row)
MAX_EPOCH_ROWS = 4  # more epochs: the first ones, then a pointer to `inspect metrics`


def _count(info: dict[str, Any], key: str, *fallbacks: str) -> int:
    """`info[key]` (a number or `{"count": n}`), else the sum of the fallback keys' counts, else 0."""
    keys = (key,) if key in info else fallbacks
    total = 0
    for k in keys:
        v = info.get(k)
        total += int(v["count"] if isinstance(v, dict) else v or 0)
    return total


def _name(value: Any) -> str | None:
    """A tokenizer/template entry recorded as a name, or as `{"name": ..., "fingerprint": ...}`."""
    if isinstance(value, dict):
        name, fp = value.get("name"), value.get("fingerprint")
        return f"{name} ({str(fp)[:12]})" if name and fp else name
    return str(value) if value else None


def _share(n: int, of: int) -> str:
    return f" ({100 * n / of:.1f}%)" if n and of else ""


def _sample_lines(report: dict[str, Any], kept: int, paired: bool = False) -> list[str]:
    """samples kept/dropped/truncated (preference pairs: counted as pairs), then tokenizer and template: the lines
    a scan and a compile share."""
    dropped = _count(report, "dropped_samples", "dropped_long", "dropped_all_masked")
    truncated = _count(report, "truncated_samples", "truncated")
    # the scan counts rows: a pair's two completions kept together (`paired`: a plan of pairs, a recipe's too)
    pairs = paired or report.get("format") in PAIRED
    kept = kept // 2 if pairs else kept
    total = kept + dropped
    lines = [f"{'pairs  ' if pairs else 'samples'}    {kept:,} kept, {dropped:,} dropped{_share(dropped, total)}, "
             f"{truncated:,} truncated"]
    tok = report.get("tokenizer")
    if isinstance(tok, str):  # a scan report names it and keeps its fingerprint beside
        tok = {"name": tok, "fingerprint": report.get("tokenizer_fingerprint")}
    tokenizer = _name(tok) or "none recorded (compiled from a samples table)"
    template = _name(report.get("chat_template"))
    fmt = report.get("format")
    lines.append(f"tokenizer  {tokenizer}" + (f", format {fmt}" if fmt else ""))
    if template:
        lines.append(f"template   {template}")
    shaped = report.get("text_format") or {}
    if "separator" in shaped:
        lines.append(f"joined     prompt + {shaped['separator']!r} + completion (--separator)")
    return lines


def _eval_lines(ev: dict[str, Any] | None, size: Any, recipe: dict[str, Any] | None) -> list[str]:
    """The eval plan's line: held-out samples (never trained on), why (a recipe's eval datasets, `--val-set-size`),
    their targets and microbatches."""
    if ev is None:
        return []
    evals = any(d["role"] == "eval" for d in (recipe or {}).get("datasets", []))
    why = ", ".join([*(["eval datasets"] if evals else []), *([f"--val-set-size {size}"] if size else [])])
    held = f"{ev['pairs']:,} pairs ({ev['samples']:,} samples)" if "pairs" in ev else f"{ev['samples']:,} samples"
    return [f"eval       {held} held out ({why}), {ev['label_count']:,} targets in "
            f"{ev['batches']:,} microbatches ({ev['batches_per_rank']:,} per rank)"]


def _dataset_lines(recipe: dict[str, Any] | None) -> list[str]:
    """A recipe's datasets: role and mix, what its scan kept and dropped, and its share of epoch 0 after planning."""
    if not recipe:
        return []
    after = {m["dataset"]: m for m in recipe.get("metrics", []) if m["epoch"] == 0 and m["stage"] == "after"}
    lines = []
    for d in recipe["datasets"]:
        mix = f"repeat {d['repeat']:g}x" if "repeat" in d else f"weight {d['weight']:g}"
        row = after.get(d["name"])
        per, unit = (2, "pairs") if "pairs" in d else (1, "samples")  # preference datasets count pairs
        share = (f"; epoch 0: {row.get('pairs', row['samples'] // per):,} {unit}, "
                 f"{100 * row['label_share']:.1f}% of label tokens"
                 if row and d["role"] == "train" else "")
        lines.append(f"dataset    {d['name']} ({d['role']}, {mix if d['role'] == 'train' else 'not trained on'}): "
                     f"{d['retained'] // per:,} {'pairs ' if per == 2 else ''}kept, {d['dropped_samples']:,} dropped, "
                     f"{d['truncated_samples']:,} truncated{share}")
    return lines


# the two CVs of a compile's epoch rows: what balancing evens out for each kind of data (docs/preference.md)
CV_COLUMNS = {"sft": (("label CV", "label_cv"), ("update CV", "update_label_cv")),
              "preference": (("pair CV", "pair_cv"), ("update pair CV", "update_pair_cv")),
              "unpaired_preference": (("label CV", "label_cv"), ("desirable CV", "update_desirable_cv"))}


def compile_summary(output: str, manifest: dict[str, Any], metrics: list[dict[str, Any]]) -> list[str]:
    """Lines for `plancc compile`: where, samples, tokenizer, template, layout, then one row per epoch."""
    s = manifest["settings"]
    by = {(m["epoch"], m["stage"]): m for m in metrics}
    kind = manifest.get("data_kind", "sft")
    lines = [f"plan       {output}", *_sample_lines(manifest["scan"], int(manifest["samples"]), kind == "preference"),
             f"layout     {s['mode']}, {s['micro_batch_size']} x "
             f"{'pairs of 2 x ' if kind == 'preference' else ''}{s['sequence_len']} tokens, world {s['world_size']} "
             f"x accum {s['grad_accum']}, {len(manifest['epochs'])} epoch(s)",
             *_eval_lines(manifest.get("eval"), s.get("val_set_size"), manifest.get("recipe")),
             *_dataset_lines(manifest.get("recipe")),
             f"epoch  microbatches  updates  {CV_COLUMNS[kind][0][0]:<13}  {CV_COLUMNS[kind][1][0]:<13}  "
             "efficiency"]
    for e in manifest["epochs"][:MAX_EPOCH_ROWS]:
        before, after = by[(e["epoch"], "before")], by[(e["epoch"], "after")]
        cvs = "  ".join(f"{before[name]:.3f} → {after[name]:.3f}" for _, name in CV_COLUMNS[kind])
        lines.append(f"{e['epoch']:<5}  {after['batches']:>12,}  {after['updates']:>7,}  {cvs}  "
                     f"{after['packing_efficiency']:>10.4f}")
    more = len(manifest["epochs"]) - MAX_EPOCH_ROWS
    if more > 0:
        lines.append(f"… {more} more epoch(s)")
    lines.append(f"metrics    plancc inspect metrics {output}")
    return lines


def scan_summary(output: str, report: dict[str, Any]) -> list[str]:
    """Lines for `plancc scan` and `plancc merge`: where, rows read, samples, tokenizer, template."""
    part = report.get("part")
    where = f" (part: rows {part['lo']:,}..{part['hi'] - 1:,} of {part['rows']:,})" if part else (
        f" (merged from {len(report['merged_from'])} parts)" if report.get("merged_from") else "")
    return [f"scan       {output}, {report['rows_read']:,} rows read{where}",
            *_sample_lines(report, int(report["retained"])),
            "next       plancc merge PART_DIR... -o SCAN_DIR (every part of the source)" if part else
            f"next       plancc compile {output} -o PLAN_DIR"]
