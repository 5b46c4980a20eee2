"""`check_tokenizer`: a trainer's tokenizer is fingerprinted as compile fingerprinted the plan's (real plans compiled
with the built-in tokenizer and with the real DeepSeek tokenizer, real transformers tokenizers), and another
tokenizer is refused with a message naming both."""

from __future__ import annotations

import json
import shutil

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from benchmarks.synthetic import build_plan
from plancc import api
from plancc.runtime import PlanMismatchError, check_tokenizer, plan_tokenizer
from plancc.sources.tokenizer import BUILTIN, BUILTIN_NAME, load_tokenizer
from tests.sources_fixtures import DEEPSEEK_JSON, pc_rows, write_rows


def builtin_hf() -> PreTrainedTokenizerFast:
    """The built-in tokenizer as the TRL example hands it to transformers."""
    tok = load_tokenizer(BUILTIN)
    return PreTrainedTokenizerFast(tokenizer_object=tok.tokenizer, eos_token=tok.eos_token, pad_token="<|pad|>",
                                   bos_token=tok.bos_token)


def compiled(tmp_path, name: str, tokenizer: str):
    src = write_rows(tmp_path / f"{name}.jsonl", pc_rows(8))
    return api.compile(src, tmp_path / name, tokenizer=tokenizer, sequence_len=64, cache_dir=tmp_path / "cache").path


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tok")
    own = tmp / "deepseek"
    own.mkdir()
    shutil.copyfile(DEEPSEEK_JSON, own / "tokenizer.json")  # no tokenizer_config.json: compile guesses the eos
    return {"builtin": compiled(tmp, "b", BUILTIN), "deepseek": compiled(tmp, "d", str(own)), "dir": own,
            "tmp": tmp}


def test_the_plans_tokenizer_passes(plans):
    check_tokenizer(plans["builtin"], builtin_hf())
    assert plan_tokenizer(plans["builtin"]).name == BUILTIN_NAME
    assert plan_tokenizer(plans["builtin"]).builtin
    # transformers finds no eos here (no tokenizer_config.json), compile guessed one: the files decide, as in compile
    hf = AutoTokenizer.from_pretrained(plans["dir"], local_files_only=True)
    assert hf.eos_token is None
    check_tokenizer(plans["deepseek"], hf)
    check_tokenizer(plans["deepseek"], plans["dir"])
    copy = plans["tmp"] / "copy"  # the same files elsewhere are the same tokenizer
    shutil.copytree(plans["dir"], copy)
    check_tokenizer(plans["deepseek"], AutoTokenizer.from_pretrained(copy, local_files_only=True))
    assert plan_tokenizer(plans["deepseek"]).name == str(plans["dir"].resolve())


def test_another_tokenizer_is_refused_naming_both(plans):
    with pytest.raises(PlanMismatchError) as err:
        check_tokenizer(plans["builtin"], AutoTokenizer.from_pretrained(plans["dir"], local_files_only=True))
    msg = str(err.value)
    assert str(plans["dir"].resolve()) in msg and BUILTIN_NAME in msg and str(plans["builtin"]) in msg
    assert plan_tokenizer(plans["builtin"]).fingerprint in msg
    with pytest.raises(PlanMismatchError) as err:
        check_tokenizer(plans["deepseek"], builtin_hf())
    assert "in-memory" in str(err.value) and str(plans["dir"].resolve()) in str(err.value)


def test_another_eos_is_another_tokenizer(plans):
    """The same vocabulary with another eos appends other ids: refused."""
    other = plans["tmp"] / "other-eos"
    shutil.copytree(plans["dir"], other)
    (other / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<｜begin▁of▁sentence｜>"}))
    with pytest.raises(PlanMismatchError, match="other-eos"):
        check_tokenizer(plans["deepseek"], AutoTokenizer.from_pretrained(other, local_files_only=True))


def test_a_plan_of_tokenized_data_records_no_tokenizer(tmp_path):
    plan = build_plan(tmp_path / "p", n=8, data_seed=1, max_len=10, mode="packed", sequence_len=16)
    assert plan_tokenizer(plan) is None
    check_tokenizer(plan, builtin_hf())  # nothing recorded: nothing to compare
