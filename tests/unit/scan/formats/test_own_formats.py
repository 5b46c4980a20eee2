"""Data as users bring it: TRL's conversational prompt/completion, OpenAI content parts, tool calls, messages with
other field names, Alpaca with its own prompt format, prompt/completion with a separator, and tokenizers named by
Hub id (read from the local Hugging Face cache). Each test shows exactly which text is supervised."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from plancc.cli import app
from plancc.config.settings import ScanOptions
from plancc.errors import InputError, SettingsError
from plancc.scan.scanner import scan
from plancc.scan.sources.tokenizer import load_tokenizer
from plancc.store import token_store
from tests.support.sources import DEEPSEEK_JSON, GENERATION_CHATML, write_rows, write_template

TOK = load_tokenizer("builtin")
EOS = "<|eos|>"
TOOL_TEMPLATE = (  # renders tool calls and tool results, as Qwen/Llama-style templates do
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{{ c.function.name }}"
    "{{ c.function.arguments | tojson }}</tool_call>{% endfor %}{% else %}{{ m.content }}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _scan(tmp_path, rows, **kw):
    tmp_path.mkdir(exist_ok=True)
    src = write_rows(tmp_path / "d.jsonl", rows)
    options = ScanOptions(**{"tokenizer": "builtin", "chat_template": "chatml", **kw})
    return scan(str(src), options, cache_dir=tmp_path / "cache")


def _rows(result) -> list[dict]:
    return token_store.to_table(result.tokenized_path).to_pylist()


def _text(ids) -> str:
    return TOK.tokenizer.decode(ids, skip_special_tokens=False)


def _supervised(row) -> list[str]:
    """The supervised runs of a row as text."""
    runs, cur = [], []
    for t, lab in zip(row["input_ids"], row["labels"], strict=True):
        if lab != -100:
            cur.append(t)
        elif cur:
            runs, cur = [*runs, cur], []
    return [_text(r) for r in [*runs, cur] if r]


# ---------------------------------------------------------------- chat shapes


def test_trl_conversational_prompt_completion_supervises_the_completion_only(tmp_path):
    rows = [
        {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Capital of France?"}],
         "completion": [{"role": "assistant", "content": "Paris."}]},
        {"prompt": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},  # earlier turn
                    {"role": "user", "content": "2+2?"}],
         "completion": [{"role": "assistant", "content": "4"}]},
    ]
    result = _scan(tmp_path, rows)
    assert result.report.to_json()["format"] == "messages"
    first, second = _rows(result)
    assert _text(first["input_ids"]) == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nCapital of "
                                         "France?<|im_end|>\n<|im_start|>assistant\nParis.<|im_end|>\n")
    assert _supervised(first) == ["Paris.<|im_end|>\n"]
    assert _supervised(second) == ["4<|im_end|>\n"]  # the prompt's assistant turn is context, not a target


def test_conversational_prompt_is_untrained_under_generation_blocks(tmp_path):
    """A template's {% generation %} blocks mark every assistant turn; the one inside the prompt stays context."""
    rows = [{"prompt": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
                        {"role": "user", "content": "2+2?"}],
             "completion": [{"role": "assistant", "content": "4"}]}]
    template = write_template(tmp_path, "gen", GENERATION_CHATML)
    for train_on in ("all_turns", "last_turn"):
        (row,) = _rows(_scan(tmp_path / train_on, rows, chat_template=str(template), train_on=train_on))
        assert "Hello!" in _text(row["input_ids"])
        assert _supervised(row) == ["4<|im_end|>"]


def test_openai_content_parts_are_joined_in_order(tmp_path):
    parts = [{"role": "user", "content": [{"type": "text", "text": "What is "}, {"type": "text", "text": "2+2?"}]},
             {"role": "assistant", "content": [{"type": "text", "text": "4"}]}]
    plain = [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"}]
    got = _rows(_scan(tmp_path / "a", [{"messages": parts}]))[0]
    want = _rows(_scan(tmp_path / "b", [{"messages": plain}]))[0]
    assert got == want
    assert _supervised(got) == ["4<|im_end|>\n"]


def test_an_image_part_is_an_error_naming_the_row(tmp_path):
    ok = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    bad = {"messages": [{"role": "user", "content": [{"type": "text", "text": "Describe"},
                                                     {"type": "image_url", "image_url": {"url": "x.png"}}]},
                        {"role": "assistant", "content": "A cat."}]}
    with pytest.raises(InputError, match=r"d\.jsonl row 1 \(line 2\): .*message 0 \(user\): content part 1 has "
                                         r"type 'image_url'"):
        _scan(tmp_path, [ok, bad])


def test_tool_calls_and_tool_turns_reach_the_template(tmp_path):
    (tmp_path / "tools.jinja").write_text(TOOL_TEMPLATE)
    conv = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"type": "function", "function": {"name": "weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "18C, sunny", "tool_call_id": "c1"},
        {"role": "assistant", "content": "18C and sunny."},
    ]
    other = [{"role": "user", "content": "Time?"}, {"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": "clock", "arguments": {"zone": "UTC", "format": "24h"}}}]},
        {"role": "tool", "content": "12:00"}, {"role": "assistant", "content": "Noon."}]
    row, second = _rows(_scan(tmp_path, [{"messages": conv}, {"messages": other}],
                              chat_template=str(tmp_path / "tools.jinja")))
    assert _supervised(row) == ['<tool_call>weather{"city": "Paris"}</tool_call><|im_end|>\n',
                                "18C and sunny.<|im_end|>\n"]
    assert "<|im_start|>tool\n18C, sunny<|im_end|>" in _text(row["input_ids"])  # the tool's turn: context only
    # arguments keep their own keys: no other row's keys added as nulls
    assert _supervised(second)[0] == '<tool_call>clock{"zone": "UTC", "format": "24h"}</tool_call><|im_end|>\n'


def test_message_fields_map_other_key_names(tmp_path):
    rows = [{"dialog": [{"speaker": "user", "text": "Hi"}, {"speaker": "assistant", "text": "Hello"}]}]
    result = _scan(tmp_path, rows, columns="messages=dialog", message_fields="role=speaker,content=text")
    assert _supervised(_rows(result)[0]) == ["Hello<|im_end|>\n"]
    assert result.report.to_json()["options"]["message_fields"] == [["content", "text"], ["role", "speaker"]]


# ---------------------------------------------------------------- prompt formats and separators


def test_alpaca_with_its_own_prompt_format(tmp_path):
    rows = [{"instruction": "Add", "input": "2 and 3", "output": "5"}, {"instruction": "Greet", "output": "Hi"}]
    result = _scan(tmp_path, rows, prompt_format="Q: {instruction}\nData: {input}\nA: ",
                   no_input_format="Q: {instruction}\nA: ")
    with_input, no_input = _rows(result)
    assert _text(with_input["input_ids"]) == f"Q: Add\nData: 2 and 3\nA: 5{EOS}"
    assert _supervised(with_input) == [f"5{EOS}"]
    assert _text(no_input["input_ids"]) == f"Q: Greet\nA: Hi{EOS}"
    assert _supervised(no_input) == [f"Hi{EOS}"]
    assert result.report.to_json()["format"] == "alpaca"
    assert result.report.to_json()["text_format"]["prompt_format"] == "Q: {instruction}\nData: {input}\nA: "


def test_prompt_completion_separator_is_used_and_reported(tmp_path):
    rows = [{"prompt": "Translate: chat", "completion": "cat"}]
    glued = _scan(tmp_path / "a", rows)
    assert _text(_rows(glued)[0]["input_ids"]) == f"Translate: chatcat{EOS}"  # today's default, now said
    assert glued.report.to_json()["text_format"] == {"separator": ""}
    spaced = _scan(tmp_path / "b", rows, separator="\n### Answer:\n")
    row = _rows(spaced)[0]
    assert _text(row["input_ids"]) == f"Translate: chat\n### Answer:\ncat{EOS}"
    assert _supervised(row) == [f"cat{EOS}"]  # the separator ends the prompt: not supervised
    assert spaced.report.to_json()["text_format"] == {"separator": "\n### Answer:\n"}
    assert spaced.report.to_json()["key"] != glued.report.to_json()["key"]


def test_default_settings_keep_the_scan_key():
    from plancc.scan.shard import recorded_options

    assert "separator" not in recorded_options(ScanOptions(tokenizer="builtin"), None, None).to_json()


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--prompt-format", "Q: {question}", "--prompt-format must be a string with {instruction} and {input}; unknown "
                                         "field {question}"),
    ("--no-input-format", "{instruction} {input}", "--no-input-format must be a string with {instruction}"),
    ("--prompt-format", "Q: {instruction", "--prompt-format 'Q: {instruction': "),
    ("--message-fields", "speaker=role", "--message-fields: unknown role 'speaker'"),
    ("--separator", "\n", "--separator applies to format prompt_completion; this source is alpaca"),
    ("--config-format", "deepspeed", "--config-format must be one of auto, plancc, axolotl, trl; got 'deepspeed'"),
])
def test_bad_values_are_one_line_exit_2(tmp_path, flag, value, message):
    src = write_rows(tmp_path / "d.jsonl", [{"instruction": "i", "output": "o"}])
    (tmp_path / "c.toml").write_text("seed = 1\n")
    res = CliRunner().invoke(app, ["scan", str(src), "-o", str(tmp_path / "s"), "--tokenizer", "builtin",
                                   "--config", str(tmp_path / "c.toml"), flag, value])
    assert res.exit_code == 2, res.output
    assert message in res.output
    assert "Traceback" not in res.output and not (tmp_path / "s").exists()


def test_settings_check_their_values():
    with pytest.raises(SettingsError, match="--separator must be a string"):
        ScanOptions(separator=3)


# ---------------------------------------------------------------- tokenizers by Hub id


def _hub_cache(root: Path, repo: str) -> Path:
    """The Hugging Face cache layout of one model: refs/main names a snapshot holding links to blobs."""
    model = root / f"models--{repo.replace('/', '--')}"
    commit = "0123456789abcdef0123456789abcdef01234567"
    (model / "blobs").mkdir(parents=True)
    (model / "refs").mkdir()
    (model / "refs" / "main").write_text(commit)
    snapshot = model / "snapshots" / commit
    snapshot.mkdir(parents=True)
    shutil.copyfile(DEEPSEEK_JSON, model / "blobs" / "tok")
    (snapshot / "tokenizer.json").symlink_to(model / "blobs" / "tok")
    (snapshot / "tokenizer_config.json").write_text('{"eos_token": "<｜end▁of▁sentence｜>", "chat_template": '
                                                    '"{% for m in messages %}{{ m.content }}{% endfor %}"}')
    return snapshot


def test_a_hub_id_resolves_through_the_local_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    snapshot = _hub_cache(tmp_path / "hf" / "hub", "deepseek-ai/DeepSeek-V3")
    tok = load_tokenizer("deepseek-ai/DeepSeek-V3")
    assert tok.name == str(snapshot.resolve())
    assert tok.tokenizer.encode("hello world").ids == load_tokenizer(str(DEEPSEEK_JSON)).tokenizer.encode(
        "hello world").ids
    assert tok.eos_token == "<｜end▁of▁sentence｜>" and tok.chat_template is not None  # its config came too
    result = _scan(tmp_path, [{"text": "hello world"}], tokenizer="deepseek-ai/DeepSeek-V3")
    assert result.report.to_json()["tokenizer_fingerprint"] == tok.fingerprint


def test_a_hub_id_not_in_the_cache_says_how_to_download_it(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    monkeypatch.chdir(tmp_path)
    src = write_rows(tmp_path / "d.jsonl", [{"text": "hi"}])
    res = CliRunner().invoke(app, ["scan", str(src), "-o", str(tmp_path / "s"), "--tokenizer", "org/missing-model"])
    assert res.exit_code == 2
    assert "hf download org/missing-model tokenizer.json tokenizer_config.json" in res.output
    assert "not found" not in res.output and "Traceback" not in res.output


@settings(max_examples=60, deadline=None)
@given(prompt=st.text(max_size=40), completion=st.text(min_size=1, max_size=40), separator=st.text(max_size=8),
       instruction=st.text(max_size=30), given_input=st.text(max_size=30))
def test_shaped_rows_are_the_prompt_then_the_supervised_completion(prompt, completion, separator, instruction,
                                                                   given_input):
    """Whatever the text (braces included), a shaped row is exactly prompt + separator + completion + eos, and
    exactly the completion and eos are supervised."""
    import pyarrow as pa

    from plancc.scan import formats
    from plancc.scan.formats import Encoding

    pc_table, fmt = formats.get("prompt_completion").shape(pa.table({"prompt": [prompt], "completion": [completion]}),
                                                           ScanOptions(separator=separator))
    alpaca, afmt = formats.get("alpaca").shape(
        pa.table({"instruction": [instruction], "input": [given_input], "output": [completion]}),
        ScanOptions(prompt_format="<{instruction}|{input}>", no_input_format="<{instruction}>"))
    assert fmt.name == afmt.name == "prompt_completion"
    for table, f, head in ((pc_table, fmt, prompt + separator),
                           (alpaca, afmt, f"<{instruction}|{given_input}>" if given_input else f"<{instruction}>")):
        enc = f.encode(table, Encoding(TOK))
        ids, labels = enc.ids.tolist(), enc.labels.tolist()
        n = len(TOK.tokenizer.encode(head).ids)
        assert ids == TOK.tokenizer.encode(head).ids + TOK.tokenizer.encode(completion, add_special_tokens=False).ids \
            + [TOK.eos_id]
        assert labels == [-100] * n + ids[n:]
