"""Nothing about the data happens silently: drops are counted and bounded, tokenizer and chat template are explicit
and recorded, columns and splits are chosen by the user, scans carry their options, bad chat turns are errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from plancc.cli import app
from plancc.config.resolve import read_config
from plancc.config.settings import ScanOptions
from plancc.errors import InputError, SettingsError
from plancc.scan.scanner import scan
from plancc.scan.sources.chat import Renderer
from plancc.scan.sources.templates import BUILTIN_TEMPLATES
from plancc.scan.sources.tokenizer import load_tokenizer
from plancc.store import schemas
from tests.support import REPO
from tests.support.sources import DEEPSEEK_JSON, chatterbot_conversations, deepseek_dir, pc_rows, write_rows

runner = CliRunner()


def _run(*args):
    return runner.invoke(app, [str(a) for a in args])


def _texts(tmp_path: Path, lengths: list[int]) -> Path:
    return write_rows(tmp_path / "t.jsonl", [{"text": "a" * n} for n in lengths])


def _scans(cache: Path) -> list[Path]:
    """Cache entries (not the lock files beside them)."""
    return sorted((cache / "scans").glob("[!.]*"))


# ---------------------------------------------------------------- drops


def test_drops_over_the_threshold_write_nothing(tmp_path):
    src = _texts(tmp_path, [10] * 90 + [400] * 10)  # 10% over --sequence-len 64
    cache = tmp_path / "cache"
    for command in ("compile", "scan"):
        out = tmp_path / f"out-{command}"
        res = _run(command, src, "-o", out, "--tokenizer", "builtin", "--sequence-len", "64", "--cache-dir", cache)
        assert res.exit_code == 2
        message = res.output.strip()
        assert "dropped 10 of 100 samples (10.0%)" in message and "--max-dropped 0.05" in message
        for name in ("--sequence-len", "--long truncate", "--max-dropped 0.1"):
            assert name in message
        assert not out.exists() and _scans(cache) == []  # no plan, no scan dir, no cache entry


def test_a_cached_scan_is_checked_again_against_a_lower_threshold(tmp_path):
    src, cache = _texts(tmp_path, [10] * 90 + [400] * 10), tmp_path / "cache"
    options = ScanOptions(tokenizer="builtin", sequence_len=64, max_dropped=0.2)
    first = scan(str(src), options, cache_dir=cache)
    assert first.report.to_json()["dropped_samples"] == 10 and len(_scans(cache)) == 1
    with pytest.raises(InputError, match=r"more than --max-dropped 0\.05"):
        scan(str(src), ScanOptions(tokenizer="builtin", sequence_len=64), cache_dir=cache)
    assert scan(str(src), options, cache_dir=cache).key == first.key  # the threshold is not part of the key


def test_small_drops_warn_once_and_are_counted_everywhere(tmp_path):
    src = _texts(tmp_path, [10] * 98 + [400] * 2)
    out = tmp_path / "plan"
    res = _run("compile", src, "-o", out, "--tokenizer", "builtin", "--sequence-len", "64", "--json",
               "--cache-dir", tmp_path / "cache")
    assert res.exit_code == 0, res.output
    warnings = [line for line in res.stderr.splitlines() if line.startswith("warning:")]
    assert warnings == ["warning: dropped 2 of 100 samples (2.0%): 2 longer than --sequence-len 64, "
                        "0 without a supervised target"]
    manifest = json.loads((out / schemas.MANIFEST_FILE).read_text())
    scan = manifest["scan"]  # the counts are the scan record's, held once
    assert (scan["rows_read"], manifest["samples"], scan["dropped_samples"]) == (100, 98, 2)
    assert not {"rows_read", "dropped_samples", "truncated_samples", "tokenizer", "warnings"} & set(manifest)
    assert manifest["scan"]["dropped_long"]["first_rows"] == [98, 99]
    metrics = pq.read_table(out / schemas.METRICS_FILE).to_pylist()
    assert {m["dropped_samples"] for m in metrics} == {2} and {m["truncated_samples"] for m in metrics} == {0}


def test_truncation_is_counted_in_scan_plan_and_metrics(tmp_path):
    src = _texts(tmp_path, [10] * 7 + [400] * 3)
    out = tmp_path / "plan"
    res = _run("compile", src, "-o", out, "--tokenizer", "builtin", "--sequence-len", "64", "--long", "truncate",
               "--cache-dir", tmp_path / "cache")
    assert res.exit_code == 0, res.output
    assert "warning: truncated 3 samples to --sequence-len 64" in res.stderr
    manifest = json.loads((out / schemas.MANIFEST_FILE).read_text())
    scan = manifest["scan"]
    assert (scan["dropped_samples"], scan["truncated_samples"], manifest["samples"]) == (0, 3, 10)
    metrics = pq.read_table(out / schemas.METRICS_FILE).to_pylist()
    assert {m["truncated_samples"] for m in metrics} == {3} and {m["dropped_samples"] for m in metrics} == {0}


def test_max_dropped_from_the_config_file(tmp_path):
    src = _texts(tmp_path, [10] * 90 + [400] * 10)
    config = tmp_path / "c.toml"
    config.write_text('tokenizer = "builtin"\nsequence_len = 64\nmax_dropped = 0.25\n')
    res = _run("scan", src, "-o", tmp_path / "s", "--config", config, "--cache-dir", tmp_path / "cache")
    assert res.exit_code == 0, res.output
    report = json.loads((tmp_path / "s" / schemas.SCAN_MANIFEST_FILE).read_text())
    assert (report["rows_read"], report["dropped_samples"], report["max_dropped"]) == (100, 10, 0.25)


def test_the_bundled_demo_drops_nothing(tmp_path):
    root = REPO
    config = read_config(root / "examples" / "chat.toml").settings
    assert config["tokenizer"] == "builtin" and config["chat_template"] == "chatml"
    keys = ("tokenizer", "chat_template", "sequence_len")
    result = scan(str(root / "examples" / "data" / "chat.jsonl"), ScanOptions(**{k: config[k] for k in keys}),
                  cache_dir=tmp_path / "c")
    assert result.report.to_json()["dropped_samples"] == 0 and result.report.to_json()["warnings"] == []
    assert config["sequence_len"] * config["micro_batch_size"] == 4096  # the rows the examples train on


# ---------------------------------------------------------------- tokenizer and template


def test_a_source_to_tokenize_needs_tokenizer(tmp_path):
    res = _run("compile", write_rows(tmp_path / "d.jsonl", pc_rows(4)), "-o", tmp_path / "p",
               "--cache-dir", tmp_path / "cache")
    assert res.exit_code == 2 and "--tokenizer PATH" in res.output and "--tokenizer builtin" in res.output
    assert not (tmp_path / "p").exists()


def test_tokenized_sources_need_no_tokenizer(tmp_path):
    rows = [{"input_ids": [1, 2, 3], "labels": [-100, 2, 3]}, {"input_ids": [4, 5], "labels": [4, 5]}]
    result = scan(str(write_rows(tmp_path / "t.parquet", rows)), ScanOptions(), cache_dir=tmp_path / "c")
    assert result.report.to_json()["tokenizer"] is None and result.report.to_json()["chat_template"] is None


def _chat(tmp_path: Path, n: int = 12) -> Path:
    return write_rows(tmp_path / "chat.jsonl", [{"messages": c} for c in chatterbot_conversations(n)])


def test_chat_without_a_template_names_chat_template(tmp_path):
    src = _chat(tmp_path)
    bare = tmp_path / "bare"  # a tokenizer.json alone never holds a chat template
    bare.mkdir()
    shutil.copyfile(DEEPSEEK_JSON, bare / "tokenizer.json")
    for tok in ("builtin", str(bare), str(bare / "tokenizer.json")):
        res = _run("scan", src, "-o", tmp_path / "s", "--tokenizer", tok, "--cache-dir", tmp_path / "cache")
        assert res.exit_code == 2 and "--chat-template" in res.output and "chatml, llama3" in res.output
    assert not (tmp_path / "s").exists()


def test_template_markers_that_are_not_single_tokens_warn(tmp_path):
    src = _chat(tmp_path)
    deepseek_chatml = scan(str(src), ScanOptions(tokenizer=str(DEEPSEEK_JSON), chat_template="chatml"),
                           cache_dir=tmp_path / "c")
    [warning] = deepseek_chatml.report.to_json()["warnings"]
    assert "chat template chatml" in warning and "<|im_start|>" in warning and "<|im_end|>" in warning
    builtin_chatml = scan(str(src), ScanOptions(tokenizer="builtin", chat_template="chatml"), cache_dir=tmp_path / "c")
    assert builtin_chatml.report.to_json()["warnings"] == []  # the built-in vocabulary has them as special tokens
    own = scan(str(src), ScanOptions(tokenizer=str(deepseek_dir(tmp_path, "deepseek"))), cache_dir=tmp_path / "c")
    assert own.report.to_json()["warnings"] == []
    assert own.report.to_json()["chat_template"]["origin"] == "tokenizer"
    assert own.report.to_json()["chat_template"]["name"].endswith("tokenizer_config.json")


def test_a_tokenizer_directory_with_chat_template_jinja_uses_it(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok_dir = tmp_path / "bpe"
    tok_dir.mkdir()
    bpe = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate("abcdefghijklmnopqrstuvwxyz <>|_\n")}, merges=[],
                               unk_token="_"))
    bpe.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    bpe.add_special_tokens(["<|turn|>", "<|end|>"])
    bpe.save(str(tok_dir / "tokenizer.json"))
    (tok_dir / "chat_template.jinja").write_text(
        "{% for m in messages %}{{ '<|turn|>' + m['role'] + '\n' + m['content'] + '<|end|>' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|turn|>assistant\n' }}{% endif %}")
    rows = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}] * 3
    result = scan(str(write_rows(tmp_path / "c.jsonl", rows)), ScanOptions(tokenizer=str(tok_dir)),
                  cache_dir=tmp_path / "c")
    assert result.report.to_json()["chat_template"]["origin"] == "tokenizer"
    assert result.report.to_json()["chat_template"]["name"] == str((tok_dir / "chat_template.jinja").resolve())
    assert result.report.to_json()["warnings"] == []  # its markers are single tokens of its vocabulary
    assert result.samples.column("label_count").to_pylist() == [3, 3, 3]  # "y", "o", "<|end|>"


def test_template_is_named_fingerprinted_and_keys_the_cache(tmp_path):
    src = _chat(tmp_path)
    tmpl = tmp_path / "mine.jinja"
    tmpl.write_text(BUILTIN_TEMPLATES["chatml"].replace("\n'", "\n\n'"))
    results = {name: scan(str(src), ScanOptions(tokenizer="builtin", chat_template=name), cache_dir=tmp_path / "c")
               for name in ("chatml", "llama3", str(tmpl))}
    assert len({r.key for r in results.values()}) == 3
    assert len({r.report.to_json()["fingerprints"]["metadata"] for r in results.values()}) == 3
    assert results[str(tmpl)].report.to_json()["chat_template"]["origin"] == "file"
    assert results["llama3"].report.to_json()["chat_template"] == {
        "name": "llama3", "origin": "builtin", "fingerprint": results["llama3"].report.to_json()["options"]["chat_template"]}
    with pytest.raises(InputError, match=r"--chat-template nope\.jinja: no such file"):
        scan(str(src), ScanOptions(tokenizer="builtin", chat_template="nope.jinja"), cache_dir=tmp_path / "c")


def test_plan_manifest_names_tokenizer_and_template(tmp_path):
    out, src = tmp_path / "plan", _chat(tmp_path)
    res = _run("compile", src, "-o", out, "--tokenizer", "builtin", "--chat-template", "llama3",
               "--cache-dir", tmp_path / "cache")
    assert res.exit_code == 0, res.output
    manifest = json.loads((out / schemas.MANIFEST_FILE).read_text())
    assert manifest["scan"]["tokenizer"] == "plancc-byte-level"
    assert manifest["scan"]["chat_template"]["name"] == "llama3"
    assert "chat template llama3" in res.output
    assert _run("validate", out).exit_code == 0  # the metadata fingerprint folds both in, and validates
    res = _run("validate", out, "--dataset", src, "--cache-dir", tmp_path / "cache2")  # rescans with llama3
    assert res.exit_code == 0 and "dataset content" in res.output


def test_llama3_builtin_masks_exactly_the_assistant_turns():
    tok = load_tokenizer("builtin")
    r = Renderer(BUILTIN_TEMPLATES["llama3"], tok.bos_token, tok.eos_token)
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "U1"},
            {"role": "assistant", "content": " A1 "}, {"role": "user", "content": "U2"},
            {"role": "assistant", "content": "A2"}]
    full, spans = r.spans(msgs)
    assert full.startswith("<|bos|><|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>")
    assert [full[a:b] for a, b in spans] == ["A1<|eot_id|>", "A2<|eot_id|>"]


# ---------------------------------------------------------------- columns, splits, config keys


def test_columns_map_fields_onto_roles(tmp_path):
    ref = scan(str(write_rows(tmp_path / "pc.jsonl", pc_rows(6))), ScanOptions(tokenizer="builtin"),
               cache_dir=tmp_path / "c")
    qa = [{"question": r["prompt"], "answer": r["completion"], "prompt": "decoy"} for r in pc_rows(6)]
    src = write_rows(tmp_path / "qa.jsonl", qa)
    with pytest.raises(InputError, match="--columns"):
        scan(str(write_rows(tmp_path / "only.jsonl", [{"question": "q", "answer": "a"}])),
             ScanOptions(tokenizer="builtin"), cache_dir=tmp_path / "c")
    mapped = scan(str(src), ScanOptions(tokenizer="builtin", columns="prompt=question,completion=answer"),
                  cache_dir=tmp_path / "c")
    assert mapped.report.to_json()["format"] == "prompt_completion" and mapped.samples.equals(ref.samples)
    dialog = write_rows(tmp_path / "dialog.jsonl", [{"dialog": c} for c in chatterbot_conversations(5)])
    chat = scan(str(dialog), ScanOptions(tokenizer="builtin", chat_template="chatml", columns={"messages": "dialog"}),
                cache_dir=tmp_path / "c")
    assert chat.report.to_json()["format"] == "messages" and chat.samples.num_rows == 5
    with pytest.raises(InputError, match=r"--columns prompt=query: no column 'query'"):
        scan(str(src), ScanOptions(tokenizer="builtin", columns="prompt=query"), cache_dir=tmp_path / "c")
    with pytest.raises(SettingsError, match=r"unknown role 'promt' \(did you mean 'prompt'\?\)"):
        ScanOptions(columns="promt=question")


def test_columns_flag_and_config_key(tmp_path):
    qa = [{"question": r["prompt"], "answer": r["completion"]} for r in pc_rows(6)]
    src = write_rows(tmp_path / "qa.jsonl", qa)
    res = _run("scan", src, "-o", tmp_path / "s", "--tokenizer", "builtin", "--cache-dir", tmp_path / "cache")
    assert res.exit_code == 2 and "--columns" in res.output
    res = _run("scan", src, "-o", tmp_path / "s", "--tokenizer", "builtin", "--columns",
               "prompt=question,completion=answer", "--cache-dir", tmp_path / "cache")
    assert res.exit_code == 0, res.output
    config = tmp_path / "c.yaml"
    config.write_text("tokenizer: builtin\ncolumns:\n  prompt: question\n  completion: answer\n")
    res = _run("scan", src, "-o", tmp_path / "s2", "--config", config, "--cache-dir", tmp_path / "cache")
    assert res.exit_code == 0, res.output


def test_unknown_config_key_suggests_the_known_one(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text("sequence_length = 2048\n")
    with pytest.raises(SettingsError, match=r"unknown setting 'sequence_length' \(did you mean 'sequence_len'\?\)"):
        read_config(config)


def test_split_of_a_dataset_dict(tmp_path):
    import datasets

    rows = pc_rows(8)
    datasets.DatasetDict({
        "train": datasets.Dataset.from_list(rows[:5]), "test": datasets.Dataset.from_list(rows[5:]),
    }).save_to_disk(str(tmp_path / "dd"))
    cache = tmp_path / "cache"
    res = _run("scan", tmp_path / "dd", "-o", tmp_path / "s", "--tokenizer", "builtin", "--cache-dir", cache)
    assert res.exit_code == 0, res.output
    assert "using split 'train' of train, test (choose with --split)" in res.stderr
    res = _run("scan", tmp_path / "dd", "-o", tmp_path / "s2", "--tokenizer", "builtin", "--split", "test",
               "--json", "--cache-dir", cache)
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["rows_read"] == 3
    res = _run("scan", tmp_path / "dd", "-o", tmp_path / "s3", "--tokenizer", "builtin", "--split", "valid",
               "--cache-dir", cache)
    assert res.exit_code == 2 and "--split valid: no such split (splits: train, test)" in res.output


# ---------------------------------------------------------------- scans carry their options


def test_compiling_a_scan_takes_its_options_and_refuses_contradictions(tmp_path):
    src, cache, scan_dir = _texts(tmp_path, [30] * 40), tmp_path / "cache", tmp_path / "scan"
    res = _run("scan", src, "-o", scan_dir, "--tokenizer", "builtin", "--sequence-len", "2048", "--shift", "row",
               "--cache-dir", cache)
    assert res.exit_code == 0, res.output
    res = _run("compile", scan_dir, "-o", tmp_path / "p", "--json")
    assert res.exit_code == 0, res.output
    settings = json.loads(res.stdout)["settings"]
    assert (settings["sequence_len"], settings["shift"]) == (2048, "row")
    for flag, value, recorded in [("--sequence-len", "4096", "2048"), ("--shift", "sample", "row"),
                                  ("--long", "truncate", "drop")]:
        res = _run("compile", scan_dir, "-o", tmp_path / "q", flag, value)
        assert res.exit_code == 2 and flag in res.output and value in res.output and recorded in res.output
    res = _run("compile", scan_dir, "-o", tmp_path / "q", "--tokenizer", str(DEEPSEEK_JSON))
    assert res.exit_code == 2 and "--tokenizer" in res.output and "plancc-byte-level" in res.output
    config = tmp_path / "c.toml"
    config.write_text("sequence_len = 1024\n")
    res = _run("compile", scan_dir, "-o", tmp_path / "q", "--config", config)
    assert res.exit_code == 2 and "1024" in res.output and "2048" in res.output
    assert not (tmp_path / "q").exists()
    res = _run("compile", scan_dir, "-o", tmp_path / "q", "--sequence-len", "2048", "--tokenizer", "builtin")
    assert res.exit_code == 0, res.output  # agreeing flags are fine


# ---------------------------------------------------------------- bad chat input


def _errors(res) -> list[str]:
    return [line for line in res.stderr.splitlines() if line.startswith("error:")]


@pytest.mark.parametrize("key, turn, field, got", [
    ("messages", {"role": "user"}, "content", "missing"),
    ("messages", {"role": "user", "content": 7}, "content", "int 7"),
    ("messages", {"role": "user", "content": {"text": "hi"}}, "content", "dict"),  # a list of text parts is read
    ("conversations", {"from": "human"}, "value", "missing"),
])
def test_chat_turn_without_string_content_names_file_row_and_field(tmp_path, key, turn, field, got):
    good = ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}] if key == "messages"
            else [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}])
    rows = [{key: good}, {key: good}, {key: [turn, good[1]]}]
    res = _run("scan", write_rows(tmp_path / "c.jsonl", rows), "-o", tmp_path / "s", "--tokenizer", "builtin",
               "--chat-template", "chatml", "--quiet", "--cache-dir", tmp_path / "cache")
    assert res.exit_code == 2 and not (tmp_path / "s").exists()
    [error] = _errors(res)
    assert "c.jsonl row 2 (line 3)" in error and "message 0 (" in error and f"field '{field}' is {got}" in error


def test_deeply_nested_values_give_short_errors(tmp_path):
    value: object = "x"
    for i in range(200):
        value = {f"k{i}": value, f"w{i}": [1, 2, 3]}
    for rows in ([{"text": value}] * 2, [{"text": value}, {"text": "ok"}],
                 [{"messages": [{"role": "user", "content": value}, {"role": "assistant", "content": "a"}]}] * 2):
        res = _run("scan", write_rows(tmp_path / "n.jsonl", rows), "-o", tmp_path / "s", "--tokenizer", "builtin",
                   "--chat-template", "chatml", "--quiet", "--cache-dir", tmp_path / "cache")
        assert res.exit_code == 2 and res.stderr.count("\n") == 1
        [error] = _errors(res)
        assert "n.jsonl row 0" in error and len(error) < 400
