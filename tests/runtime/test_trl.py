"""TRL: `PlanSFTTrainer` trains a tiny random-init Llama (hidden 32, 2 layers, from a config: no download) on a
plan with the plain loop's gradients (fp32, relative 1e-5), over epochs of different lengths, and resumes across
an epoch boundary bit for bit."""

from __future__ import annotations

import json

import pytest
import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from transformers import PreTrainedTokenizerFast
from trl import SFTConfig

from benchmarks.synthetic import VOCAB
from plancc.runtime import PlanMismatchError, PlanSampler
from plancc.runtime.hf import STATE_FILE
from plancc.runtime.trl import PlanSFTTrainer
from tests.runtime.test_hf import GradRecorder
from tests.support.training import build_uneven_plan, plain_loop_grads, rel_err, tiny_model

pytestmark = pytest.mark.slow  # trains TRL's SFTTrainer

LR = 0.5


def tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer over the test vocabulary, built in memory."""
    vocab = {"<pad>": 0, **{f"t{i}": i for i in range(1, VOCAB - 1)}, "<eos>": VOCAB - 1}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="<pad>")),
                                   pad_token="<pad>", eos_token="<eos>")


def model():
    return tiny_model(seed=3, layers=2, hidden=32)


def config(out, **kw) -> SFTConfig:
    base = dict(output_dir=str(out), use_cpu=True, bf16=False, gradient_checkpointing=False,
                per_device_train_batch_size=1, gradient_accumulation_steps=2, learning_rate=LR, optim="sgd",
                lr_scheduler_type="constant", max_grad_norm=0.0, weight_decay=0.0, report_to=[], save_strategy="no",
                logging_steps=1, disable_tqdm=True, seed=0, dataloader_num_workers=0, num_train_epochs=3)
    base.update(kw)
    return SFTConfig(**base)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("trl")
    plan = build_uneven_plan(root / "p", grad_accum=2)
    rec = GradRecorder()
    trained = model()
    PlanSFTTrainer(model=trained, args=config(root / "full"), plan=plan, processing_class=tokenizer(),
                   callbacks=[rec]).train()
    return plan, rec.grads, trained, root


def test_sft_trainer_gradients_equal_the_plain_loop(run):
    plan, grads, trained, _ = run
    ref, ref_model = plain_loop_grads(plan, model(), LR)
    assert len(grads) == len(ref) == sum(PlanSampler(plan).updates_per_epoch(e) for e in range(3))
    for got, want in zip(grads, ref, strict=True):
        assert max(rel_err(got[k], want[k]) for k in want) < 1e-5
    for (name, a), b in zip(trained.named_parameters(), ref_model.parameters(), strict=True):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7), name


def test_sft_trainer_resumes_across_an_epoch_boundary_bit_identically(run):
    plan, _, trained, root = run
    step = PlanSampler(plan).updates_per_epoch(0) + 1
    out = root / "stopped"
    PlanSFTTrainer(model=model(), args=config(out, max_steps=step, save_strategy="steps", save_steps=step),
                   plan=plan, processing_class=tokenizer()).train()
    ckpt = out / f"checkpoint-{step}"
    assert json.loads((ckpt / STATE_FILE).read_text())["epoch"] == 1
    resumed = tiny_model(seed=99, layers=2, hidden=32)
    PlanSFTTrainer(model=resumed, args=config(out), plan=plan, processing_class=tokenizer()).train(
        resume_from_checkpoint=str(ckpt))
    for (name, a), b in zip(trained.named_parameters(), resumed.parameters(), strict=True):
        assert torch.equal(a, b), name


def test_sft_trainer_refuses_trl_packing_and_other_losses(run, tmp_path):
    plan = run[0]
    for kw, match in ((dict(packing=True), "already packs"), (dict(loss_type="dft"), "objective")):
        with pytest.raises(PlanMismatchError, match=match):
            PlanSFTTrainer(model=model(), args=config(tmp_path, **kw), plan=plan, processing_class=tokenizer())


@pytest.mark.parametrize("loss", ["fused", "logits"])
def test_sft_trainer_by_trls_fused_head_or_full_logits_equals_the_plain_loop(run, tmp_path, loss):
    """loss="fused": TRL's fused LM head, handed `shift_labels` and the plan's count, trains the plain loop's
    gradients (as does the full-logits path)."""
    plan = run[0]
    rec = GradRecorder()
    PlanSFTTrainer(model=model(), args=config(tmp_path, max_steps=3), plan=plan, processing_class=tokenizer(),
                   loss=loss, callbacks=[rec]).train()
    ref, _ = plain_loop_grads(plan, model(), LR, 3)
    assert len(rec.grads) == 3
    for got, want in zip(rec.grads, ref, strict=True):
        assert max(rel_err(got[k], want[k]) for k in want) < 1e-5
