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
from plancc.scan.sources.tokenizer import BUILTIN, BUILTIN_NAME, load_tokenizer
from tests.support import REPO
from tests.support.sources import DEEPSEEK_JSON, pc_rows, write_rows

pytestmark = pytest.mark.slow  # trains Hugging Face and TRL trainers, runs the TRL example


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


def test_trainers_refuse_another_tokenizer_before_training(plans, tmp_path):
    from transformers import TrainingArguments
    from trl import SFTConfig

    from plancc.runtime.hf import PlanTrainer
    from plancc.runtime.trl import PlanSFTTrainer
    from tests.support.training import tiny_model

    other = AutoTokenizer.from_pretrained(plans["dir"], local_files_only=True)
    common = dict(output_dir=str(tmp_path / "out"), use_cpu=True, report_to=[], save_strategy="no")
    for trainer, args in ((PlanTrainer, TrainingArguments(**common)), (PlanSFTTrainer, SFTConfig(**common))):
        with pytest.raises(PlanMismatchError, match="compiled with plancc-byte-level"):
            trainer(model=tiny_model(vocab=320), args=args, plan=plans["builtin"], processing_class=other)
    assert not (tmp_path / "out").exists()
    PlanTrainer(model=tiny_model(vocab=320), args=TrainingArguments(**common), plan=plans["builtin"],
                processing_class=builtin_hf())  # the plan's own: accepted


def test_trl_example_uses_the_plans_tokenizer_and_refuses_another(plans, tmp_path):
    """Without --tokenizer the example trains with the one the plan records; with another it stops in one line."""
    import subprocess
    import sys

    root = REPO
    cmd = [sys.executable, str(root / "examples" / "trl_sft.py"), "--plan", str(plans["builtin"]), "--max-steps",
           "1", "--output-dir"]
    bad = subprocess.run([*cmd, str(tmp_path / "bad"), "--tokenizer", str(plans["dir"])], capture_output=True,
                         text=True, timeout=300, cwd=root)
    assert bad.returncode == 2, bad.stderr[-3000:]
    assert "Traceback" not in bad.stderr and BUILTIN_NAME in bad.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "bad").exists()
    good = subprocess.run([*cmd, str(tmp_path / "good")], capture_output=True, text=True, timeout=300, cwd=root)
    assert good.returncode == 0, good.stdout[-3000:] + good.stderr[-3000:]
    assert "train_loss" in good.stdout + good.stderr


def test_trainers_accept_a_saved_copy_of_the_plans_tokenizer(plans, tmp_path):
    """What a checkpoint holds: the plan's tokenizer re-saved by transformers (other bytes, the same ids)."""
    from transformers import TrainingArguments
    from trl import SFTConfig

    from plancc.runtime.hf import PlanTrainer
    from plancc.runtime.trl import PlanSFTTrainer
    from tests.support.training import tiny_model

    saved = tmp_path / "checkpoint"
    tok = AutoTokenizer.from_pretrained(plans["dir"], local_files_only=True)
    tok.pad_token = "<｜end▁of▁sentence｜>"  # as a TRL run sets it: the pad token decides no id of the plan
    tok.save_pretrained(saved)
    assert (saved / "tokenizer.json").read_bytes() != (plans["dir"] / "tokenizer.json").read_bytes()
    tok = AutoTokenizer.from_pretrained(saved, local_files_only=True)
    check_tokenizer(plans["deepseek"], saved)
    common = dict(output_dir=str(tmp_path / "out"), use_cpu=True, report_to=[], save_strategy="no", bf16=False)
    for trainer, args in ((PlanTrainer, TrainingArguments(**common)), (PlanSFTTrainer, SFTConfig(**common))):
        trainer(model=tiny_model(vocab=len(tok)), args=args, plan=plans["deepseek"], processing_class=tok)
