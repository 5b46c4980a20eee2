"""The preference formats (docs/preference.md) render every completion exactly as TRL's own DPO and KTO trainers
tokenize it, token for token and mask for mask, on real pairs: Alpaca rows as strings, chatterbot conversations
with a chat template, TRL's implicit-prompt form; are detected from their columns; keep or drop a pair whole and
count pairs; and refuse to be compiled as SFT."""

from __future__ import annotations

import types
from pathlib import Path

import orjson
import pytest
from datasets import Dataset
from transformers import PreTrainedTokenizerFast
from trl import DPOConfig, DPOTrainer, KTOConfig, KTOTrainer

import plancc
from benchmarks.preference_data import alpaca_pairs
from plancc.errors import PlanccError
from plancc.runtime import load_tokens
from tests.support.sources import DEEPSEEK_JSON, TEMPLATES, chatterbot_conversations, deepseek_dir

pytestmark = pytest.mark.slow  # tokenizes hundreds of rows twice (plancc and TRL)


def hf_tokenizer(template: str = "chatml") -> PreTrainedTokenizerFast:
    tok = PreTrainedTokenizerFast(tokenizer_file=str(DEEPSEEK_JSON), bos_token="<｜begin▁of▁sentence｜>",
                                  eos_token="<｜end▁of▁sentence｜>")
    tok.chat_template = TEMPLATES[template][0]
    return tok


def trl_tokens(trainer, rows: list[dict], tmp: Path, config) -> Dataset:
    """What TRL's trainer itself makes of `rows` (its own dataset preparation)."""
    tok = hf_tokenizer()
    args = config(output_dir=str(tmp / "trl"), use_cpu=True, bf16=False, max_length=None)
    owner = types.SimpleNamespace(_tokenizer=tok, calculate_KL=False, desirable_weight=1.0, undesirable_weight=1.0)
    return trainer._prepare_dataset(owner, Dataset.from_list(rows), tok, args, "train")


def compiled(tmp: Path, rows: list[dict], **settings):
    (tmp / "rows.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    plan = plancc.compile(str(tmp / "rows.jsonl"), str(tmp / "plan"), tokenizer=str(deepseek_dir(tmp, "chatml")),
                          sequence_len=4096, micro_batch_size=2, **settings)
    tokens = load_tokens(plan)
    out = {}
    for row in plan.samples_table().to_pylist():
        a, b = int(tokens.offsets[row["sample_id"]]), int(tokens.offsets[row["sample_id"] + 1])
        out[row["sample_id"]] = (row, tokens.input_ids[a:b].tolist(), tokens.targets[a:b].tolist())
    return plan, out


def conversational_pairs(n: int) -> list[dict]:
    """Real conversations cut before their last reply: that reply chosen, another conversation's last reply of a
    different length rejected."""
    convs = [c for c in chatterbot_conversations(limit=4 * n) if c[-1]["role"] == "assistant"]
    out = []
    for i, conv in enumerate(convs[:n]):
        other = next(c[-1] for c in convs[i + 1:] + convs[:i] if len(c[-1]["content"]) != len(conv[-1]["content"]))
        out.append({"prompt": conv[:-1], "chosen": [conv[-1]], "rejected": [other]})
    return out


def assert_as_trl(samples: dict, trl: Dataset, *, paired: bool) -> int:
    for row, ids, labels in samples.values():
        example = trl[row["pair_id"] if paired else row["sample_id"]]
        completion = example[f"{row['pair_role']}_ids"] if paired else example["completion_ids"]
        assert ids == example["prompt_ids"] + completion
        assert labels == [-100] * len(example["prompt_ids"]) + completion
    return len(samples)


@pytest.mark.parametrize("form", ["strings", "conversations", "implicit"])
def test_pairs_render_as_trl_renders_them(tmp_path, form):
    if form == "strings":
        rows = alpaca_pairs(60, seed=3)
    else:
        rows = conversational_pairs(60)
        if form == "implicit":
            rows = [{"chosen": r["prompt"] + r["chosen"], "rejected": r["prompt"] + r["rejected"]} for r in rows]
    plan, samples = compiled(tmp_path, rows)
    assert plan.manifest.data_kind == "preference" and plan.scan_record.format == "preference"
    assert assert_as_trl(samples, trl_tokens(DPOTrainer, rows, tmp_path, DPOConfig), paired=True) == 2 * len(rows)


def test_unpaired_rows_render_as_trl_kto_renders_them(tmp_path):
    rows = [{"prompt": p["prompt"], "completion": p[side], "label": side == "chosen"}
            for p in alpaca_pairs(40, seed=5) for side in ("chosen", "rejected")]
    plan, samples = compiled(tmp_path, rows)
    assert plan.manifest.data_kind == "unpaired_preference"
    assert [r["desirable"] for r, _, _ in samples.values()] == [r["label"] for r in rows]
    assert assert_as_trl(samples, trl_tokens(KTOTrainer, rows, tmp_path, KTOConfig), paired=False) == len(rows)


def test_a_pair_is_dropped_or_truncated_whole_and_counted_as_a_pair(tmp_path):
    rows = [{"prompt": f"Question {i}? ", "chosen": "yes " * (3 if i % 4 else 80), "rejected": "no"} for i in range(40)]
    (tmp_path / "rows.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    common = dict(tokenizer="builtin", sequence_len=64, micro_batch_size=2)
    dropped = plancc.compile(str(tmp_path / "rows.jsonl"), str(tmp_path / "drop"), long="drop", max_dropped=0.5,
                             **common)
    assert dropped.scan_record.dropped_samples == 10 and dropped.scan_record.rows_read == 40
    ids = dropped.samples_table().column("pair_id").to_pylist()
    assert sorted(set(ids)) == [i for i in range(40) if i % 4] and len(ids) == 60
    with pytest.raises(PlanccError, match="dropped 10 of 40"):
        plancc.compile(str(tmp_path / "rows.jsonl"), str(tmp_path / "refused"), long="drop", max_dropped=0.2,
                       **common)
    cut = plancc.compile(str(tmp_path / "rows.jsonl"), str(tmp_path / "cut"), long="truncate", **common)
    assert cut.scan_record.truncated_samples == 10 and cut.samples_table().num_rows == 80
    assert max(cut.samples_table().column("length").to_pylist()) == 64


def test_preference_rows_are_never_compiled_as_sft(tmp_path):
    rows = [{"prompt": "Say hi. ", "completion": "hi", "label": bool(i % 2)} for i in range(10)]
    (tmp_path / "kto.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    with pytest.raises(PlanccError, match=r"unpaired feedback \(KTO\), not SFT data: --format prompt_completion"):
        plancc.compile(str(tmp_path / "kto.jsonl"), str(tmp_path / "p"), tokenizer="builtin", format="prompt_completion")
    with pytest.raises(PlanccError, match="train_on_inputs does not apply to unpaired_preference data"):
        plancc.compile(str(tmp_path / "kto.jsonl"), str(tmp_path / "q"), tokenizer="builtin", train_on_inputs=True)


def test_mixed_rows_are_named(tmp_path):
    rows = [{"prompt": "a", "chosen": "b", "rejected": "c"}, {"prompt": "a", "chosen": [{"role": "assistant",
                                                                                          "content": "b"}],
                                                               "rejected": "c"}]
    (tmp_path / "mixed.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    with pytest.raises(PlanccError, match=r"line 2.*column 'chosen' mixes strings and messages"):
        plancc.compile(str(tmp_path / "mixed.jsonl"), str(tmp_path / "p"), tokenizer="builtin")
