"""Conformance with Axolotl's preference path: does `plancc compile --config axolotl.yml` of an `rl: dpo` (or
`ipo`) config with `type: chat_template.default` give the token ids and label masks Axolotl's DPO trainer trains on?

For each variant below the same YAML goes to both tools:

- Axolotl 0.19.0's own pipeline, in its venv (`--axolotl-python`, default /tmp/plancc-axolotl-venv/bin/python, as
  `make axolotl-venv` builds it): config validation and normalization, `load_tokenizer`,
  `prepare_preference_datasets` (its strategy and long-pair filter), then the tokenization of the trainer it
  builds (`AxolotlDPOTrainer._prepare_dataset`, TRL 1.9.0) and TRL's collator's cut to `max_length`
  (Axolotl's `sequence_len`): each pair's two sequences, prompt tokens masked;
- `plancc compile --config` of the same file, read back from the plan's token store.

It prints per variant the sequences each tool kept and how many of Axolotl's plancc has token for token (ids and
labels, matched as multisets), or plancc's exit-2 line when it refuses the config.

Data, all real: DPO pairs from the Alpaca rows in ../shared/data/alpaca-cleaned-1000.json (the instruction and
input as the user turn, the row's output chosen, another row's output of a different length rejected:
`benchmarks/preference_data.alpaca_pairs`' rule) and from the English conversations of the chatterbot corpus
(`--corpus`: its `data/english` folder), each conversation's last reply chosen and another conversation's last
reply rejected, a system turn on every third; the same rows under other field names. Tokenizer: Llama 3.2's (`--model`, a folder with its tokenizer.json and a config).

    PYTHONPATH=. python benchmarks/bench_axolotl_preference.py [--rows N] [--variants a,b] [--json out.json]

Results: docs/preference.md ("Axolotl").
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.bench_axolotl_conformance import BASE, first_difference, outcome, table_row  # noqa: E402

DEFAULT_PYTHON = Path("/tmp/plancc-axolotl-venv/bin/python")
DEFAULT_MODEL = Path("/tmp/axo-scratch-axolotl/llama-3.2-tokenizer")
DEFAULT_CORPUS = Path("/tmp/axo-extra-axolotl/chatterbot_corpus/data/english")
SYSTEM = "You are a friendly assistant. This conversation is about {topic}."

ENTRY = "datasets:\n  - path: {data}/{file}\n    type: chat_template.default\n"
FIELDS = "    field_messages: conversation\n    field_chosen: better\n    field_rejected: worse\n"
# keys Axolotl 0.19.0's DPO dataset schema drops (its strategy never sees them): plancc refuses them
DROPPED = "    message_property_mappings:\n      role: from\n      content: value\n"
# name -> (rl and template keys, data file, entry keys, sequence_len, what it exercises)
VARIANTS: dict[str, tuple[str, str, str, int, str]] = {
    "alpaca_llama3": ("rl: dpo\nchat_template: llama3\n", "alpaca.jsonl", "", 2048,
                      "Alpaca pairs, llama3 template (its bos in the rendered prompt)"),
    "alpaca_chatml": ("rl: dpo\nchat_template: chatml\n", "alpaca.jsonl", "", 2048, "Alpaca pairs, chatml"),
    "chat_llama3": ("rl: dpo\nchat_template: llama3\n", "chat.jsonl", "", 2048,
                    "chatterbot conversations, system turns, llama3"),
    "chat_fields_ipo": ("rl: ipo\nchat_template: chatml\n", "chat_fields.jsonl", FIELDS, 2048,
                        "field_messages/field_chosen/field_rejected, rl: ipo, chatml"),
    "dropped_keys": ("rl: dpo\nchat_template: chatml\n", "chat_fields.jsonl", FIELDS + DROPPED, 2048,
                     "message_property_mappings: dropped by Axolotl's DPO schema (refused by plancc)"),
    "alpaca_long": ("rl: dpo\nchat_template: llama3\n", "alpaca.jsonl", "", 256,
                    "sequence_len 256: Axolotl's long-pair filter, then TRL's cut"),
}


def alpaca(rows: list[dict], n: int | None) -> list[dict]:
    """DPO rows from the Alpaca rows: the user turn, the row's output chosen, the next row's output of another
    length rejected."""
    out = []
    for i, r in enumerate(rows[:n]):
        other = next(rows[(i + k) % len(rows)]["output"] for k in range(1, len(rows))
                     if len(rows[(i + k) % len(rows)]["output"]) != len(r["output"]))
        user = r["instruction"] + (f"\n\n{r['input']}" if r["input"] else "")
        out.append({"messages": [{"role": "user", "content": user}], "chosen": r["output"],
                    "rejected": {"role": "assistant", "content": other}})
    return out


def chats(corpus: Path, n: int | None) -> list[dict]:
    """DPO rows from the chatterbot conversations: the turns before the last reply, it chosen, the next
    conversation's last reply rejected; a system turn on every third."""
    import yaml

    convs = []
    for path in sorted(glob.glob(str(corpus / "*.yml"))):
        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        topic = ", ".join(map(str, doc.get("categories") or [Path(path).stem]))
        for lines in doc.get("conversations") or []:
            lines = [str(x) for x in lines][: len(lines) // 2 * 2]
            if lines:
                convs.append((topic, lines))
    out = []
    for i, (topic, lines) in enumerate(convs[:n]):
        turns = [{"role": "user" if k % 2 == 0 else "assistant", "content": t} for k, t in enumerate(lines)]
        if i % 3 == 0:
            turns.insert(0, {"role": "system", "content": SYSTEM.format(topic=topic)})
        other = next(c[1][-1] for c in convs[i + 1:] + convs[:i] if c[1][-1] != lines[-1])
        out.append({"messages": turns[:-1], "chosen": [turns[-1]], "rejected": other})
    return out


def renamed(rows: list[dict]) -> list[dict]:
    """The same rows under other field names."""
    return [{"conversation": r["messages"], "better": r["chosen"], "worse": r["rejected"]} for r in rows]


def write_data(folder: Path, alpaca_json: Path, corpus: Path, n: int | None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    chat = chats(corpus, n)
    for name, rows in (("alpaca.jsonl", alpaca(json.loads(alpaca_json.read_text()), n)), ("chat.jsonl", chat),
                       ("chat_fields.jsonl", renamed(chat))):
        (folder / name).write_text("".join(json.dumps(r) + "\n" for r in rows))


def worker(config: str, out: str) -> None:
    """Inside Axolotl's venv: its config, tokenizer and preference datasets, then its DPO trainer's tokenization
    and TRL's collator's cut, one line per sequence."""
    import logging

    import yaml

    logging.disable(logging.WARNING)
    from axolotl.core.trainers.dpo.trainer import AxolotlDPOTrainer
    from axolotl.loaders.tokenizer import load_tokenizer
    from axolotl.utils.config import normalize_config, validate_config
    from axolotl.utils.data.rl import prepare_preference_datasets
    from axolotl.utils.dict import DictDefault
    from trl import DPOConfig

    cfg = validate_config(DictDefault(yaml.safe_load(Path(config).read_text())))
    normalize_config(cfg)
    tokenizer = load_tokenizer(cfg)
    train, _ = prepare_preference_datasets(cfg, tokenizer)
    trainer = object.__new__(AxolotlDPOTrainer)  # what _prepare_dataset reads of the trainer: its tokenizer
    trainer._tokenizer = tokenizer
    args = DPOConfig(output_dir=str(Path(out).parent / "trl"), max_length=cfg.sequence_len, report_to=[],
                     bf16=False, use_cpu=True)
    rows = AxolotlDPOTrainer._prepare_dataset(trainer, train, tokenizer, args, "train")
    limit = args.max_length
    with open(out, "w") as f:
        for row in rows:
            for side in ("chosen_ids", "rejected_ids"):
                ids = (row["prompt_ids"] + row[side])[:limit]
                labels = ([-100] * len(row["prompt_ids"]) + row[side])[:limit]
                f.write(json.dumps({"input_ids": ids, "labels": labels}) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--axolotl-python", type=Path, default=DEFAULT_PYTHON)
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "alpaca-cleaned-1000.json")
    ap.add_argument("--work", type=Path, default=Path("/tmp/plancc-axolotl-preference"))
    ap.add_argument("--rows", type=int, default=None, help="first N rows of each data set (default: all)")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--json", type=Path)
    ap.add_argument("--axolotl-worker", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.axolotl_worker:
        return worker(*args.axolotl_worker)
    if not args.data.is_file():
        args.data = ROOT.parents[1] / "shared" / "data" / "alpaca-cleaned-1000.json"
    from transformers import AutoTokenizer

    data = args.work / "data"
    write_data(data, args.data, args.corpus, args.rows)
    results = {}
    print("| variant | what | Axolotl sequences | plancc sequences | identical | labels differ | ids differ | "
          "identical share |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.variants.split(","):
        top, file, entry, sequence_len, what = VARIANTS[name]
        work = args.work / "variants" / name
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        config = work / "axolotl.yml"
        base = BASE.replace("sequence_len: 2048", f"sequence_len: {sequence_len}").replace("sample_packing: true\n", "")
        config.write_text(base.format(model=args.model, work=work) + top
                          + ENTRY.format(data=data, file=file) + entry)
        env = {**os.environ, "AXOLOTL_DO_NOT_TRACK": "1", "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
               "PYTHONPATH": ""}
        done = subprocess.run([str(args.axolotl_python), __file__, "--axolotl-worker", str(config),
                               str(work / "axolotl.jsonl")], env=env, capture_output=True, text=True)
        failed = (done.stderr.strip().splitlines() or ["(no output)"])[-1] if done.returncode else None
        results[name], theirs, ours = outcome(failed, config, work)
        print(table_row(name, what, results[name]))
        if "identical" in results[name] and results[name]["identical"] < len(theirs):
            print(textwrap.indent(first_difference(theirs, ours, AutoTokenizer.from_pretrained(args.model)), "  "),
                  file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
