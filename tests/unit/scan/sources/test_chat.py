"""Chat masks are exact for any template: with the real DeepSeek tokenizer and real chatterbot conversations, the
supervised tokens decode to exactly each assistant turn's content plus its end-of-turn text, nothing else."""

from __future__ import annotations

import numpy as np
import pytest

from plancc.config.settings import ScanOptions
from plancc.errors import InputError
from plancc.scan.scanner import scan
from plancc.scan.sources.chat import Renderer
from plancc.scan.sources.templates import BUILTIN_TEMPLATES
from plancc.scan.sources.tokenizer import load_tokenizer
from plancc.store import token_store
from tests.support.sources import (
    TEMPLATES,
    chatterbot_conversations,
    deepseek_dir,
    supervised_runs,
    write_rows,
)

BUILTIN_CHAT = ScanOptions(tokenizer="builtin", chat_template="chatml")


@pytest.mark.parametrize("template", sorted(TEMPLATES))
def test_masks_exact_real_tokenizer(tmp_path, template):
    convs = chatterbot_conversations(40)
    src = write_rows(tmp_path / "chat.jsonl", [{"messages": c} for c in convs])
    tok_dir = deepseek_dir(tmp_path, template)
    result = scan(str(src), ScanOptions(tokenizer=str(tok_dir)), cache_dir=tmp_path / "cache")
    assert result.report.to_json()["format"] == "messages"
    tok = load_tokenizer(str(tok_dir)).tokenizer
    table = token_store.to_table(result.tokenized_path).to_pylist()
    eot = TEMPLATES[template][1]
    trim = template == "llama3"
    for conv, row in zip(convs, table, strict=True):
        expected = [(m["content"].strip() if trim else m["content"]) + eot for m in conv if m["role"] == "assistant"]
        decoded = [tok.decode(r, skip_special_tokens=False) for r in supervised_runs(row["input_ids"], row["labels"])]
        assert decoded == expected


def test_conversations_sharegpt_columns(tmp_path):
    convs = chatterbot_conversations(10, system=False)
    share = [[{"from": "human" if m["role"] == "user" else "gpt", "value": m["content"]} for m in c] for c in convs]
    a = scan(str(write_rows(tmp_path / "a.jsonl", [{"conversations": c} for c in share])), BUILTIN_CHAT,
             cache_dir=tmp_path / "c")
    b = scan(str(write_rows(tmp_path / "b.jsonl", [{"messages": c} for c in convs])), BUILTIN_CHAT,
             cache_dir=tmp_path / "c")
    assert a.samples.equals(b.samples)


def test_builtin_template_masks_user_and_system():
    tok = load_tokenizer("builtin")
    r = Renderer(BUILTIN_TEMPLATES["chatml"], tok.bos_token, tok.eos_token)
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "U1"},
            {"role": "assistant", "content": "A1"}, {"role": "user", "content": "U2"},
            {"role": "assistant", "content": "A2"}]
    full, spans = r.spans(msgs)
    assert [full[a:b] for a, b in spans] == ["A1<|im_end|>\n", "A2<|im_end|>\n"]


def test_template_error_names_row(tmp_path):
    convs = chatterbot_conversations(5, system=False)
    convs[3] = [*convs[3], {"role": "tool", "content": "x"}]
    src = write_rows(tmp_path / "chat.jsonl", [{"messages": c} for c in convs])
    with pytest.raises(InputError, match=r"chat\.jsonl row 3 \(line 4\).*unknown role tool"):
        scan(str(src), ScanOptions(tokenizer=str(deepseek_dir(tmp_path, "deepseek"))), cache_dir=tmp_path / "c")


def test_label_count_matches_tokenized(tmp_path):
    convs = chatterbot_conversations(30)
    src = write_rows(tmp_path / "chat.parquet", [{"messages": c} for c in convs])
    result = scan(str(src), BUILTIN_CHAT, cache_dir=tmp_path / "c")
    labels = token_store.to_table(result.tokenized_path).column("labels").to_pylist()
    counts = [int((np.array(lab) != -100).sum()) for lab in labels]
    assert result.samples.column("label_count").to_pylist() == [counts[i] for i in
                                                                 result.samples.column("sample_id").to_pylist()]


def test_template_not_prefix_stable_falls_back_to_content(tmp_path):
    # the header depends on the whole conversation, so shorter renders are not prefixes of the full one
    template = ("turns={{ messages | length }}\n" + BUILTIN_TEMPLATES["chatml"])
    tok_dir = tmp_path / "tok"
    tok_dir.mkdir()
    load_tokenizer("builtin").tokenizer.save(str(tok_dir / "tokenizer.json"))
    (tok_dir / "tokenizer_config.json").write_text(
        __import__("json").dumps({"chat_template": template, "eos_token": "<|eos|>"}))
    convs = [*chatterbot_conversations(10), [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hi"},
                                             {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hi"}]]
    result = scan(str(write_rows(tmp_path / "c.jsonl", [{"messages": c} for c in convs])),
                  ScanOptions(tokenizer=str(tok_dir)), cache_dir=tmp_path / "c")
    tok = load_tokenizer(str(tok_dir)).tokenizer
    for conv, row in zip(convs, token_store.to_table(result.tokenized_path).to_pylist(), strict=True):
        expected = [m["content"] + "<|im_end|>\n" for m in conv if m["role"] == "assistant"]
        assert [tok.decode(r, skip_special_tokens=False) for r in supervised_runs(row["input_ids"], row["labels"])] == expected
