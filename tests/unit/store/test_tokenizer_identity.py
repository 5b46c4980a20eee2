"""A tokenizer is identified by what decides its ids, not by its file's bytes: the real DeepSeek tokenizer re-saved by
transformers' `save_pretrained` (merges rewritten as pairs, defaults spelled out, a config added) is the plan's
tokenizer; the same with one more special token, another eos or one merge less is not, and the refusal names it."""

from __future__ import annotations

import json

import orjson
import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from plancc import api
from plancc.runtime import PlanMismatchError, check_tokenizer, plan_tokenizer
from plancc.runtime.tokenizer import fingerprint_of
from plancc.scan.sources.tokenizer import load_tokenizer
from plancc.store.tokenizer_identity import (
    file_fingerprint,
    identity_difference,
    identity_fingerprint,
    tokenizer_identity,
)
from tests.support.sources import DEEPSEEK_JSON, pc_rows, write_rows

EOS = "<｜end▁of▁sentence｜>"
BOS = "<｜begin▁of▁sentence｜>"


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    """A plan compiled with the DeepSeek tokenizer directory, its directory, and a save_pretrained copy of it."""
    tmp = tmp_path_factory.mktemp("identity")
    tok_dir = tmp / "deepseek"
    tok_dir.mkdir()
    (tok_dir / "tokenizer.json").write_bytes(DEEPSEEK_JSON.read_bytes())
    (tok_dir / "tokenizer_config.json").write_text(json.dumps({"eos_token": EOS, "bos_token": BOS}))
    src = write_rows(tmp / "rows.jsonl", pc_rows(8))
    compiled = api.compile(src, tmp / "plan", tokenizer=str(tok_dir), sequence_len=64, cache_dir=tmp / "cache")
    saved = tmp / "saved"
    PreTrainedTokenizerFast(tokenizer_file=str(tok_dir / "tokenizer.json"), eos_token=EOS,
                            bos_token=BOS).save_pretrained(saved)
    return {"plan": compiled.path, "dir": tok_dir, "saved": saved, "tmp": tmp}


def test_a_save_pretrained_copy_is_the_plans_tokenizer(plan):
    assert (plan["saved"] / "tokenizer.json").read_bytes() != DEEPSEEK_JSON.read_bytes()  # other bytes, same ids
    recorded = plan_tokenizer(plan["plan"]).fingerprint
    assert recorded == load_tokenizer(str(plan["dir"])).fingerprint
    for given in (plan["saved"], AutoTokenizer.from_pretrained(plan["saved"], local_files_only=True),
                  AutoTokenizer.from_pretrained(plan["dir"], local_files_only=True)):
        assert fingerprint_of(given) == recorded
        check_tokenizer(plan["plan"], given)
    resaved = plan["tmp"] / "resaved"  # a checkpoint of a checkpoint
    AutoTokenizer.from_pretrained(plan["saved"], local_files_only=True).save_pretrained(resaved)
    check_tokenizer(plan["plan"], resaved)


def test_one_more_special_token_is_refused_naming_it(plan):
    tok = AutoTokenizer.from_pretrained(plan["saved"], local_files_only=True)
    tok.add_special_tokens({"additional_special_tokens": ["<|extra|>"]})
    with pytest.raises(PlanMismatchError) as err:
        check_tokenizer(plan["plan"], tok)  # in memory, though loaded from the saved copy
    msg = str(err.value)
    assert "added token '<|extra|>' (special)" in msg and "only in the tokenizer given" in msg
    assert str(plan["dir"].resolve()) in msg
    extra = plan["tmp"] / "extra"
    tok.save_pretrained(extra)
    with pytest.raises(PlanMismatchError, match=r"added token '<\|extra\|>' \(special\)"):
        check_tokenizer(plan["plan"], extra)


def test_another_eos_or_merge_is_another_tokenizer(plan):
    other = plan["tmp"] / "other-eos"
    other.mkdir()
    (other / "tokenizer.json").write_bytes(DEEPSEEK_JSON.read_bytes())
    (other / "tokenizer_config.json").write_text(json.dumps({"eos_token": BOS, "bos_token": BOS}))
    with pytest.raises(PlanMismatchError, match="eos token"):
        check_tokenizer(plan["plan"], other)
    doc = orjson.loads(DEEPSEEK_JSON.read_bytes())
    doc["model"]["merges"] = doc["model"]["merges"][:-1]
    a = tokenizer_identity(DEEPSEEK_JSON.read_bytes(), EOS, BOS)
    b = tokenizer_identity(orjson.dumps(doc), EOS, BOS)
    assert identity_fingerprint(a) != identity_fingerprint(b)
    assert identity_difference(a, b).startswith("merges (")
    assert identity_difference(a, a) is None


def test_merges_as_strings_or_pairs_and_defaults_are_one_identity():
    doc = orjson.loads(DEEPSEEK_JSON.read_bytes())
    pairs = dict(doc, model={**doc["model"], "merges": [m.split(" ", 1) for m in doc["model"]["merges"]],
                             "ignore_merges": False})
    assert identity_fingerprint(tokenizer_identity(orjson.dumps(doc), EOS, BOS)) == identity_fingerprint(
        tokenizer_identity(orjson.dumps(pairs), EOS, BOS))


def test_plans_that_recorded_the_file_digest_still_name_their_tokenizer(plan):
    """Older plans recorded a digest of the tokenizer file's bytes: the same files still match it."""
    raw = (plan["dir"] / "tokenizer.json").read_bytes()
    tok = load_tokenizer(str(plan["dir"]))
    assert tok.made(file_fingerprint(raw, EOS, BOS)) and tok.made(tok.fingerprint)
    assert not tok.made(file_fingerprint(raw, BOS, BOS))
