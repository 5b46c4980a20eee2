"""What is trained: masks from a template's {% generation %} blocks (token for token as Hugging Face's
`return_assistant_tokens_mask`), a pinned `strftime_now` date, roles_to_train / train_on_eos / train_on_inputs /
train_on on real rows, samples that train on an end of turn alone, and one-line errors for bad values."""

from __future__ import annotations

import datetime as dt
import json

import numpy as np
import pytest
from transformers import PreTrainedTokenizerFast
from typer.testing import CliRunner

import plancc
from plancc.cli import app
from plancc.config.settings import ScanOptions
from plancc.errors import InputError, SettingsError
from plancc.scan.scanner import scan
from plancc.scan.sources import clock
from plancc.scan.sources.tokenizer import load_tokenizer
from plancc.store import token_store
from tests.support.sources import (
    DATED_CHATML,
    DEEPSEEK_JSON,
    GENERATION_CHATML,
    chatterbot_conversations,
    supervised_runs,
    write_rows,
    write_template,
)

runner = CliRunner()


def _rows(result) -> list[dict]:
    """Every source row's input_ids and labels, from the scan's token store."""
    return token_store.to_table(result.tokenized_path).to_pylist()


def _trained(tok, row: dict) -> list[str]:
    """The supervised runs of a row, decoded."""
    return [tok.decode(r, skip_special_tokens=False) for r in supervised_runs(row["input_ids"], row["labels"])]


# ---------------------------------------------------------------- {% generation %} masks, against transformers


@pytest.fixture(scope="module")
def hf_tokenizer():
    return PreTrainedTokenizerFast(tokenizer_file=str(DEEPSEEK_JSON))


@pytest.mark.parametrize("train_on", ["all_turns", "last_turn"])
def test_generation_masks_match_transformers(tmp_path, hf_tokenizer, train_on):
    convs = chatterbot_conversations(600)
    assert len(convs) >= 500
    src = write_rows(tmp_path / "chat.jsonl", [{"messages": c} for c in convs])
    template = write_template(tmp_path, "gen", GENERATION_CHATML)
    result = scan(str(src), ScanOptions(tokenizer=str(DEEPSEEK_JSON), chat_template=str(template),
                                        train_on=train_on, sequence_len=8192), cache_dir=tmp_path / "c")
    rows = _rows(result)
    for conv, row in zip(convs, rows, strict=True):
        out = hf_tokenizer.apply_chat_template(conv, chat_template=GENERATION_CHATML, tokenize=True,
                                               return_dict=True, return_assistant_tokens_mask=True)
        assert row["input_ids"] == list(out["input_ids"])
        mask = np.array(out["assistant_masks"], bool)
        if train_on == "last_turn":  # the last block only: HF's mask from the last assistant turn's start on
            last = hf_tokenizer.apply_chat_template(conv[:max(i for i, m in enumerate(conv)
                                                              if m["role"] == "assistant")],
                                                    chat_template=GENERATION_CHATML, tokenize=True,
                                                    add_generation_prompt=True, return_dict=True)["input_ids"]
            mask[:len(last)] = False
        assert (np.array(row["labels"]) != -100).tolist() == mask.tolist()
        assert [lab for lab, m in zip(row["labels"], mask, strict=True) if m] == \
            [t for t, m in zip(row["input_ids"], mask, strict=True) if m]


def test_generation_blocks_exclude_what_follows(tmp_path):
    """The newline after each reply is outside the block, so it is not trained (per-turn masking would train it)."""
    convs = chatterbot_conversations(30, system=False)
    src = write_rows(tmp_path / "chat.jsonl", [{"messages": c} for c in convs])
    template = write_template(tmp_path, "gen", GENERATION_CHATML)
    result = scan(str(src), ScanOptions(tokenizer="builtin", chat_template=str(template)), cache_dir=tmp_path / "c")
    tok = load_tokenizer("builtin").tokenizer
    for conv, row in zip(convs, _rows(result), strict=True):
        assert _trained(tok, row) == [m["content"] + "<|im_end|>" for m in conv if m["role"] == "assistant"]


def test_generation_template_refuses_settings_it_decides(tmp_path):
    src = write_rows(tmp_path / "chat.jsonl", [{"messages": c} for c in chatterbot_conversations(5)])
    template = write_template(tmp_path, "gen", GENERATION_CHATML)
    with pytest.raises(SettingsError, match=r"roles_to_train cannot apply: .*\{% generation %\}"):
        scan(str(src), ScanOptions(tokenizer="builtin", chat_template=str(template), roles_to_train=["user"]),
             cache_dir=tmp_path / "c")


# ---------------------------------------------------------------- template_date


class _Clock(dt.datetime):
    """A clock set to `now_value` (what a template reading the real clock would see)."""

    now_value = dt.datetime(2030, 5, 17, 13, 0)

    @classmethod
    def now(cls, tz=None):
        return cls.now_value


def _dated_plan(tmp_path, name: str, monkeypatch, when: dt.datetime, **settings) -> bytes:
    monkeypatch.setattr(_Clock, "now_value", when)
    monkeypatch.setattr(clock, "datetime", _Clock)
    monkeypatch.setattr(dt, "datetime", _Clock)
    src = write_rows(tmp_path / "chat.jsonl", [{"messages": c} for c in chatterbot_conversations(40)])
    template = write_template(tmp_path, "dated", DATED_CHATML)
    out = tmp_path / name
    plancc.compile(str(src), out, tokenizer="builtin", chat_template=str(template), cache_dir=tmp_path / f"c-{name}",
                   **settings)
    return (out / "plan.parquet").read_bytes()


def test_template_date_pins_strftime_now(tmp_path, monkeypatch):
    """Two clocks, one plan: strftime_now reads template_date, never the clock."""
    a = _dated_plan(tmp_path, "a", monkeypatch, dt.datetime(2031, 1, 2, 3, 4))
    b = _dated_plan(tmp_path, "b", monkeypatch, dt.datetime(2029, 12, 31, 23, 59))
    assert a == b
    c = _dated_plan(tmp_path, "c", monkeypatch, dt.datetime(2031, 1, 2), template_date="2025-06-30")
    assert c != a  # the date is in the tokens: another template_date is another plan


def test_template_date_in_text_report_and_note(tmp_path):
    src = write_rows(tmp_path / "chat.jsonl", [{"messages": c} for c in chatterbot_conversations(3)])
    template = write_template(tmp_path, "dated", DATED_CHATML)
    result = scan(str(src), ScanOptions(tokenizer="builtin", chat_template=str(template),
                                        template_date="2025-06-30"), cache_dir=tmp_path / "c")
    text = load_tokenizer("builtin").tokenizer.decode(_rows(result)[0]["input_ids"], skip_special_tokens=False)
    assert "Today Date: 30 Jun 2025" in text
    assert result.report.to_json()["options"]["template_date"] == "2025-06-30"
    notes = [w for w in result.report.to_json()["warnings"] if "strftime_now" in w]
    assert notes == ["chat template " + str(template.resolve()) + " reads the date (strftime_now): rendered with "
                     "template_date 2025-06-30, not today's (set template_date to change it)"]
    default = scan(str(src), ScanOptions(tokenizer="builtin", chat_template=str(template)), cache_dir=tmp_path / "c")
    assert default.report.to_json()["options"]["template_date"] == "2024-01-01"


def test_template_date_left_out_of_key_when_unread(tmp_path):
    src = write_rows(tmp_path / "chat.jsonl", [{"messages": c} for c in chatterbot_conversations(3)])
    a = scan(str(src), ScanOptions(tokenizer="builtin", chat_template="chatml"), cache_dir=tmp_path / "c")
    b = scan(str(src), ScanOptions(tokenizer="builtin", chat_template="chatml", template_date="2020-02-02"),
             cache_dir=tmp_path / "c")
    assert a.key == b.key and "template_date" not in a.report.to_json()["options"]


# ---------------------------------------------------------------- roles_to_train, train_on_eos, train_on


# a system turn, then alternating user / assistant turns, two replies or more
CONV = [{"role": "system", "content": "You are a chatbot."},
        *max((c for c in chatterbot_conversations(3000, system=False) if all(len(m["content"]) > 3 for m in c)),
             key=len)]


def _chat_runs(tmp_path, convs, **settings) -> list[list[str]]:
    tmp_path.mkdir(exist_ok=True)
    src = write_rows(tmp_path / "chat.jsonl", [{"messages": c} for c in convs])
    result = scan(str(src), ScanOptions(tokenizer="builtin", chat_template="chatml", **settings),
                  cache_dir=tmp_path / "c")
    tok = load_tokenizer("builtin").tokenizer
    return [_trained(tok, row) for row in _rows(result)]


def _turns(conv, roles, ends):
    """Expected runs: each turn of `roles`, with '<|im_end|>\\n' after it where `ends` says (by turn index)."""
    out = []
    for i, m in enumerate(conv):
        if m["role"] in roles:
            out.append(m["content"] + ("<|im_end|>\n" if ends(i) else ""))
    return out


def test_roles_to_train_on_real_rows(tmp_path):
    convs = chatterbot_conversations(20)
    runs = _chat_runs(tmp_path, convs, roles_to_train=["user", "assistant"])
    for conv, got in zip(convs, runs, strict=True):
        # the user turn's content, its end, the next header, the assistant's: the runs split at the headers
        assert got == _turns(conv, {"user", "assistant"}, lambda i: True)
        assert conv[0]["role"] != "system" or not got[0].startswith(conv[0]["content"])


def test_train_on_eos_modes(tmp_path):
    conv = CONV
    assistants = [i for i, m in enumerate(conv) if m["role"] == "assistant"]
    assert len(assistants) >= 2
    assert _chat_runs(tmp_path / "n", [conv], train_on_eos="none")[0] == _turns(conv, {"assistant"}, lambda i: False)
    assert _chat_runs(tmp_path / "l", [conv], train_on_eos="last")[0] == _turns(
        conv, {"assistant"}, lambda i: i == assistants[-1])
    # all: every turn's end, the user's and system's too, while their content stays masked
    got = _chat_runs(tmp_path / "a", [conv], train_on_eos="all")[0]
    assert got.count("<|im_end|>\n") == sum(m["role"] != "assistant" for m in conv)
    assert [g for g in got if g != "<|im_end|>\n"] == _turns(conv, {"assistant"}, lambda i: True)


def test_train_on_last_turn(tmp_path):
    convs = chatterbot_conversations(20)
    for conv, got in zip(convs, _chat_runs(tmp_path, convs, train_on="last_turn"), strict=True):
        last = [m for m in conv if m["role"] == "assistant"][-1]
        assert got == [last["content"] + "<|im_end|>\n"]


def test_train_on_all_tokens_trains_every_token_but_a_leading_untrained_prompt(tmp_path):
    """all_tokens: every token of the conversation, markup too, but the leading turns flagged untrained and the
    generation prompt after them (a prompt); a turn flagged untrained after a trained one is a one-line row error."""
    convs = chatterbot_conversations(20)
    flagged = [[{**m, "train": False} if i < len(c) - 1 else m for i, m in enumerate(c)] for c in convs]
    runs = _chat_runs(tmp_path / "f", flagged, train_on="all_tokens", message_fields={"training": "train"})
    assert runs == [[c[-1]["content"] + "<|im_end|>\n"] for c in convs]
    for conv, got in zip(convs, _chat_runs(tmp_path / "a", convs, train_on="all_tokens"), strict=True):
        assert got == ["".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in conv)]
    late = [[*c[:-1], {**c[-1], "train": False}] for c in convs[:1]]
    with pytest.raises(InputError, match=r"chat\.jsonl.*line 1.*turn \d+ is flagged untrained after a trained one"):
        _chat_runs(tmp_path / "l", late, train_on="all_tokens", message_fields={"training": "train"})


@pytest.mark.parametrize("setting", [{"roles_to_train": ["user"]}, {"train_on_eos": "none"},
                                     {"end_of_turn": "tokens"}])
def test_train_on_all_tokens_refuses_the_settings_it_decides(tmp_path, setting):
    with pytest.raises(SettingsError, match=r"cannot apply: train_on all_tokens trains every token"):
        _chat_runs(tmp_path, chatterbot_conversations(2), train_on="all_tokens", **setting)


def _pair_rows(tmp_path, rows, **settings):
    tmp_path.mkdir(exist_ok=True)
    src = write_rows(tmp_path / "alpaca.jsonl", rows)
    return scan(str(src), ScanOptions(tokenizer="builtin", **settings), cache_dir=tmp_path / "c")


def _alpaca_from_corpus(n: int) -> list[dict]:
    """Real question/answer pairs as Alpaca rows."""
    convs = chatterbot_conversations(n, system=False)
    return [{"instruction": c[0]["content"], "input": "", "output": c[1]["content"]} for c in convs]


def test_train_on_inputs_supervises_the_prompt(tmp_path):
    rows = _alpaca_from_corpus(20)
    plain = _rows(_pair_rows(tmp_path / "p", rows))
    inputs = _rows(_pair_rows(tmp_path / "i", rows, train_on_inputs=True))
    tok = load_tokenizer("builtin").tokenizer
    for src, a, b in zip(rows, plain, inputs, strict=True):
        assert a["input_ids"] == b["input_ids"]
        assert b["labels"] == b["input_ids"]
        assert _trained(tok, a) == [src["output"] + "<|eos|>"]


def test_train_on_eos_none_masks_the_appended_eos(tmp_path):
    rows = _alpaca_from_corpus(10)
    tok = load_tokenizer("builtin").tokenizer
    for src, row in zip(rows, _rows(_pair_rows(tmp_path, rows, train_on_eos="none")), strict=True):
        assert _trained(tok, row) == [src["output"]]


# ---------------------------------------------------------------- samples training on an end of turn alone


def test_empty_outputs_are_counted_warned_and_droppable(tmp_path):
    rows = _alpaca_from_corpus(60)
    empty = list(range(0, 60, 3))  # 20 rows
    for i in empty:
        rows[i]["output"] = ""
    kept = _pair_rows(tmp_path / "k", rows)
    assert kept.report.to_json()["end_only"] == {"count": 20, "first_rows": empty[:10]}
    assert kept.report.to_json()["retained"] == 60
    assert any("20 samples have an empty completion or reply and train on the end of turn (EOS) alone "
               "(rows 0, 3, 6, 9, 12, ...); drop them with drop_eos_only = true" in w
               for w in kept.report.to_json()["warnings"])
    dropped = _pair_rows(tmp_path / "d", rows, drop_eos_only=True, max_dropped=0.5)
    assert dropped.report.to_json()["retained"] == 40
    assert sorted(set(range(60)) - set(dropped.samples.column("sample_id").to_pylist())) == empty
    assert any("20 training on the end of turn alone (drop_eos_only)" in w for w in dropped.report.to_json()["warnings"])


def test_empty_assistant_turns_are_not_trained_and_counted(tmp_path):
    """As Axolotl: a turn with no text has no span, so neither it nor its end of turn is trained; a conversation
    left with nothing to train is dropped as having no target, and every such turn's row is counted."""
    convs = chatterbot_conversations(8, system=False)
    for c in convs[:3]:
        for m in c:
            if m["role"] == "assistant":
                m["content"] = ""
    src = write_rows(tmp_path / "chat.jsonl", [{"messages": c} for c in convs])
    result = scan(str(src), ScanOptions(tokenizer="builtin", chat_template="chatml", max_dropped=0.5),
                  cache_dir=tmp_path / "c")
    report = result.report.to_json()
    assert report["blank_turns"] == {"count": 3, "first_rows": [0, 1, 2]}
    assert report["dropped_all_masked"]["first_rows"] == [0, 1, 2] and report["end_only"]["count"] == 0
    assert any("3 conversations have a turn to train with no text" in w and "(rows 0, 1, 2)" in w
               for w in report["warnings"])


@pytest.mark.parametrize(("template", "trained"), [("llama3", False), ("chatml", True)])
def test_a_whitespace_turn_is_trained_only_where_the_template_renders_it(tmp_path, template, trained):
    """llama3 trims a reply of spaces to nothing (Axolotl trains neither it nor its <|eot_id|>); chatml renders
    the spaces, which Axolotl trains with their end of turn."""
    conv = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "   "},
            {"role": "user", "content": "Still there?"}, {"role": "assistant", "content": "Yes."}]
    src = write_rows(tmp_path / "chat.jsonl", [{"messages": conv}])
    result = scan(str(src), ScanOptions(tokenizer="builtin", chat_template=template), cache_dir=tmp_path / "c")
    runs = _trained(load_tokenizer("builtin").tokenizer, _rows(result)[0])
    assert runs[-1].startswith("Yes.") and (len(runs) == 2) is trained
    assert result.report.to_json()["blank_turns"]["count"] == (0 if trained else 1)


# ---------------------------------------------------------------- bad values: one line, exit 2


@pytest.mark.parametrize(("flag", "value", "expected"), [
    ("--roles-to-train", "assistant,robot", "--roles-to-train: unknown role 'robot'; roles are system, user, "
                                             "assistant, tool"),
    ("--train-on-eos", "sometimes", "--train-on-eos must be one of turn, last, all, none; got 'sometimes'"),
    ("--train-on", "first_turn", "--train-on must be one of all_turns, last_turn, all_tokens; got 'first_turn'"),
    ("--template-date", "26/07/2024", "--template-date must be a date YYYY-MM-DD (e.g. 2024-07-26), got "
                                      "'26/07/2024'"),
])
def test_bad_values_one_line(tmp_path, flag, value, expected):
    src = write_rows(tmp_path / "chat.jsonl", [{"messages": c} for c in chatterbot_conversations(3)])
    out = tmp_path / "plan"
    r = runner.invoke(app, ["compile", str(src), "-o", str(out), "--tokenizer", "builtin", "--chat-template",
                            "chatml", flag, value])
    lines = [line for line in r.output.splitlines() if line.strip()]
    assert r.exit_code == 2 and lines == [f"error: {expected}"], r.output
    assert not out.exists()


def test_bad_value_in_config_names_the_file(tmp_path):
    src = write_rows(tmp_path / "chat.jsonl", [{"messages": c} for c in chatterbot_conversations(3)])
    config = tmp_path / "c.toml"
    config.write_text('train_on_eos = "often"\n')
    r = runner.invoke(app, ["compile", str(src), "-o", str(tmp_path / "plan"), "--tokenizer", "builtin",
                            "--chat-template", "chatml", "--config", str(config)])
    assert r.exit_code == 2
    assert r.output.strip().splitlines() == [f"error: config file {config}: train_on_eos must be one of turn, last, "
                                             "all, none; got 'often'"]


def test_recipe_entry_sets_what_is_trained(tmp_path):
    rows = _alpaca_from_corpus(10)
    a = write_rows(tmp_path / "a.jsonl", rows)
    b = write_rows(tmp_path / "b.jsonl", rows)
    plan = plancc.compile([str(a), {"path": str(b), "train_on_inputs": True}], tmp_path / "plan",
                          tokenizer="builtin", cache_dir=tmp_path / "c")
    datasets = {d["name"]: d for d in plan.manifest.recipe["datasets"]}
    assert datasets["b"]["label_tokens"] == datasets["b"]["tokens"]  # the prompt trained too
    assert datasets["a"]["label_tokens"] == sum(len(r["output"]) + 1 for r in rows)  # bytes + eos
    with pytest.raises(SettingsError, match=r"^dataset 'b': train_on must be one of all_turns, last_turn"):
        plancc.compile([str(a), {"path": str(b), "train_on": "x"}], tmp_path / "plan2", tokenizer="builtin",
                       cache_dir=tmp_path / "c")


# ---------------------------------------------------------------- plancc show names what was trained


@pytest.mark.parametrize(("kind", "flags", "expected"), [
    ("chat", ["--roles-to-train", "user,assistant", "--train-on-eos", "last"],
     "trained: roles_to_train user,assistant, train_on_eos last, train_on all_turns"),
    ("gen", ["--train-on", "last_turn"], "trained: the chat template's {% generation %} blocks, train_on last_turn"),
    ("alpaca", ["--train-on-inputs"], "trained: train_on_inputs true, train_on_eos turn"),
])
def test_show_header_names_what_is_trained(tmp_path, kind, flags, expected):
    if kind == "alpaca":
        src, more = write_rows(tmp_path / "a.jsonl", _alpaca_from_corpus(5)), []
    else:
        src = write_rows(tmp_path / "c.jsonl", [{"messages": c} for c in chatterbot_conversations(5)])
        template = "chatml" if kind == "chat" else str(write_template(tmp_path, "gen", GENERATION_CHATML))
        more = ["--chat-template", template]
    out = tmp_path / "plan"
    r = runner.invoke(app, ["compile", str(src), "-o", str(out), "--tokenizer", "builtin", "-q", *more, *flags])
    assert r.exit_code == 0, r.output
    shown = runner.invoke(app, ["show", str(out), "--sample", "1", "--no-color"])
    assert shown.exit_code == 0 and shown.output.splitlines()[2] == expected, shown.output
    as_json = runner.invoke(app, ["show", str(out), "--sample", "1", "--json"])
    assert json.loads(as_json.output)["trained"] == expected.removeprefix("trained: ")


# ---------------------------------------------------------------- plancc show --dropped


def test_show_dropped_lists_every_dropped_row_with_its_reason(tmp_path):
    rows = _alpaca_from_corpus(40)
    for i in (2, 5, 30):
        rows[i]["output"] = ""  # end of turn alone: dropped by drop_eos_only
    rows[7]["output"] = "long answer " * 100  # longer than --sequence-len 1024: dropped
    src = write_rows(tmp_path / "a.jsonl", rows)
    out = tmp_path / "plan"
    r = runner.invoke(app, ["compile", str(src), "-o", str(out), "--tokenizer", "builtin", "-q", "--drop-eos-only",
                            "--sequence-len", "1024", "--max-dropped", "0.5"])
    assert r.exit_code == 0, r.output
    listed = json.loads(runner.invoke(app, ["show", str(out), "--dropped", "--json"]).output)
    reasons = {d["row"]: d["reason"] for d in listed["dropped"]}
    assert reasons == {2: "trains on the end of turn alone (drop_eos_only)",
                       5: "trains on the end of turn alone (drop_eos_only)",
                       7: "longer than sequence_len 1024",
                       30: "trains on the end of turn alone (drop_eos_only)"}
    text = runner.invoke(app, ["show", str(out), "--dropped"]).output.splitlines()
    assert text[0].startswith("row 2: trains on the end of turn alone (drop_eos_only) (")
    assert text[-1] == "4 rows dropped; 0 truncated"


def test_show_dropped_names_a_recipe_dataset_and_truncated_rows(tmp_path):
    rows = _alpaca_from_corpus(10)
    rows[4]["output"] = ""
    rows[6]["output"] = "long answer " * 100
    a = write_rows(tmp_path / "a.jsonl", _alpaca_from_corpus(10))
    b = write_rows(tmp_path / "b.jsonl", rows)
    out = tmp_path / "plan"
    plancc.compile([str(a), str(b)], out, tokenizer="builtin", drop_eos_only=True, long="truncate",
                   sequence_len=1024, max_dropped=0.5, cache_dir=tmp_path / "c")
    listed = json.loads(runner.invoke(app, ["show", str(out), "--dropped", "--json"]).output)
    assert [(d["dataset"], d["dataset_row"], d["reason"]) for d in listed["dropped"]] == [
        ("b", 4, "trains on the end of turn alone (drop_eos_only)")]
    assert listed["truncated"]["count"] == 1


def test_show_needs_sample_or_dropped(tmp_path):
    src = write_rows(tmp_path / "a.jsonl", _alpaca_from_corpus(5))
    out = tmp_path / "plan"
    assert runner.invoke(app, ["compile", str(src), "-o", str(out), "--tokenizer", "builtin", "-q"]).exit_code == 0
    r = runner.invoke(app, ["show", str(out)])
    assert r.exit_code == 2 and r.output.strip() == ("error: plancc show: give --sample ID (one sample) or --dropped "
                                                     "(the dropped rows)")
