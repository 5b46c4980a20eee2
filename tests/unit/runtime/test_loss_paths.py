"""The loss without every token's logits: the chunked cross entropy equals `token_loss_sum` on the full logits
(values and gradients, relative 1e-5), and so do the model's own loss and a fused loss patched into the model,
each handed the plan's count; `PlanTrainer` trains the same by every path."""

from __future__ import annotations

import types

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import TrainingArguments

from benchmarks.synthetic import build_plan
from plancc.runtime import (
    PlanCollator,
    PlanMismatchError,
    PlanSampler,
    load_tokens,
    token_loss_sum,
    verified_plan,
)
from plancc.runtime.chunked_loss import chunked_loss_sum
from plancc.runtime.evaluate import evaluate_plan
from plancc.runtime.forward import LOSS_PATHS, microbatch_loss, output_head
from plancc.runtime.hf import PlanTrainer
from tests.runtime.test_hf import GradRecorder
from tests.support import REPO
from tests.support.training import grads_of, plain_loop_grads, rel_err, tiny_model

LR = 0.5


def reference(hidden, weight, bias, labels, scale=1.0, softcap=None):
    z = torch.nn.functional.linear(hidden, weight, bias).float() * scale
    if softcap:
        z = softcap * torch.tanh(z / softcap)
    return token_loss_sum(z, labels)


def value_and_grads(fn, *tensors):
    leaves = [t.detach().clone().requires_grad_(t.is_floating_point()) if t is not None else None for t in tensors]
    out = fn(*leaves)
    out.backward()
    return out.detach(), [None if t is None or not t.is_floating_point() else t.grad for t in leaves]


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 3), width=st.integers(1, 40), vocab=st.integers(2, 70), chunk=st.integers(1, 50),
       bias=st.booleans(), transform=st.sampled_from([(1.0, None), (0.5, None), (1.0, 3.0), (2.0, 1.5)]),
       seed=st.integers(0, 2**16))
def test_chunked_cross_entropy_equals_full_logits(rows, width, vocab, chunk, bias, transform, seed):
    g = torch.Generator().manual_seed(seed)
    hidden, weight = torch.randn(rows, width, 8, generator=g), torch.randn(vocab, 8, generator=g)
    b = torch.randn(vocab, generator=g) if bias else None
    labels = torch.randint(0, vocab, (rows, width), generator=g)
    labels[torch.rand(rows, width, generator=g) < 0.4] = -100
    scale, softcap = transform
    want, want_g = value_and_grads(lambda h, w, bb: reference(h, w, bb, labels, scale, softcap), hidden, weight, b)
    got, got_g = value_and_grads(lambda h, w, bb: chunked_loss_sum(h, w, labels, bias=bb, scale=scale,
                                                                   softcap=softcap, chunk=chunk), hidden, weight, b)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)
    for a, e in zip(got_g, want_g, strict=True):
        assert (a is None) == (e is None)
        if a is not None:
            assert torch.allclose(a, e, rtol=1e-4, atol=1e-6)
    with torch.no_grad():  # no gradients asked: the sum alone
        assert torch.allclose(chunked_loss_sum(hidden, weight, labels, bias=b, scale=scale, softcap=softcap,
                                               chunk=chunk), want, rtol=1e-5, atol=1e-5)


def test_chunked_cross_entropy_in_bf16_matches_the_upcast_logits():
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 30, 16, generator=g).bfloat16()
    weight = torch.randn(50, 16, generator=g).bfloat16()
    labels = torch.randint(0, 50, (2, 30), generator=g)
    want, (gh, gw) = value_and_grads(lambda h, w: reference(h, w, None, labels), hidden, weight)
    got, (ch, cw) = value_and_grads(lambda h, w: chunked_loss_sum(h, w, labels, chunk=7), hidden, weight)
    assert ch.dtype == cw.dtype == torch.bfloat16
    assert torch.allclose(got, want, rtol=1e-5)
    assert rel_err(cw.float(), gw.float()) < 1e-2 and rel_err(ch.float(), gh.float()) < 1e-2  # bf16 round-off


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    return build_plan(tmp_path_factory.mktemp("paths"), n=16, data_seed=5, max_len=16, mode="packed",
                      sequence_len=32, grad_accum=2, val_set_size=4)


def batches(plan):
    plan = verified_plan(plan)
    collator, tokens = PlanCollator.from_plan(plan), load_tokens(plan)
    return [collator(mb, tokens) for mb in PlanSampler(plan)]


@pytest.mark.parametrize("path", [p for p in LOSS_PATHS if p != "logits"])
def test_every_path_gives_the_full_logits_loss_and_gradients(plan, path):
    for batch in batches(plan)[:3]:
        out = {}
        for p in ("logits", path):
            model = tiny_model(seed=1)
            _, loss = microbatch_loss(model, batch, batch["num_items_in_batch"], path=p, world_size=2)
            loss.backward()
            out[p] = loss.detach(), grads_of(model)
        (want, want_g), (got, got_g) = out["logits"], out[path]
        assert rel_err(got, want) < 1e-5
        assert max(rel_err(got_g[k], want_g[k]) for k in want_g) < 1e-5


def test_eval_loss_is_the_same_by_every_path(plan):
    model = tiny_model(seed=2)
    losses = [evaluate_plan(model, plan, loss=p).loss for p in LOSS_PATHS]
    assert max(losses) - min(losses) < 1e-6 * max(losses)


def test_a_head_that_is_not_a_plain_linear_is_refused(plan):
    model = tiny_model()
    model.lm_head = torch.nn.Sequential(model.lm_head)
    with pytest.raises(PlanMismatchError, match="loss='logits'"):
        output_head(model)


def patch_fused_loss(model, received: list):
    """A stand-in for a fused linear cross entropy patched into the model's forward (as Liger and
    cut-cross-entropy patch it): the backbone, then the chunked loss from the hidden states and the head's weight
    divided by the `num_items_in_batch` it is handed, which it records. No logits are built."""

    def forward(self, input_ids=None, labels=None, shift_labels=None, num_items_in_batch=None, **kwargs):
        hidden = self.model(input_ids=input_ids, **kwargs).last_hidden_state
        received.append(int(num_items_in_batch))
        loss_sum = chunked_loss_sum(hidden, self.lm_head.weight, shift_labels, bias=self.lm_head.bias)
        return {"loss": loss_sum / num_items_in_batch, "logits": None}

    model.forward = types.MethodType(forward, model)
    return model


def args_for(out, **kw):
    base = dict(output_dir=str(out), use_cpu=True, per_device_train_batch_size=1, gradient_accumulation_steps=2,
                learning_rate=LR, optim="sgd", lr_scheduler_type="constant", max_grad_norm=0.0, weight_decay=0.0,
                report_to=[], save_strategy="no", logging_steps=1, disable_tqdm=True, seed=0,
                dataloader_num_workers=0, max_steps=2)
    base.update(kw)
    return TrainingArguments(**base)


def plan_counts(plan, updates):
    return [int(b["num_items_in_batch"]) for b in batches(plan) if b["plan"]["update"] < updates]


@pytest.mark.slow
def test_trainer_feeds_a_fused_loss_the_plans_count(plan, tmp_path):
    """loss="model": a fused loss patched into the model gets each microbatch's plan count and trains exactly as
    the plain loop; a compute_loss_func gets it too."""
    ref, _ = plain_loop_grads(plan, tiny_model(seed=3), LR, 2)
    received: list[int] = []
    rec = GradRecorder()
    PlanTrainer(model=patch_fused_loss(tiny_model(seed=3), received), args=args_for(tmp_path / "m"), plan=plan,
                loss="model", callbacks=[rec]).train()
    assert received == plan_counts(plan, 2)
    for got, want in zip(rec.grads, ref, strict=True):
        assert max(rel_err(got[k], want[k]) for k in want) < 1e-5

    seen: list[int] = []

    def loss_func(outputs, labels, num_items_in_batch):
        seen.append(int(num_items_in_batch))
        return token_loss_sum(outputs.logits[:, :-1], labels[:, 1:]) / num_items_in_batch

    rec = GradRecorder()
    PlanTrainer(model=tiny_model(seed=3), args=args_for(tmp_path / "f"), plan=plan, compute_loss_func=loss_func,
                callbacks=[rec]).train()
    assert seen == plan_counts(plan, 2)
    for got, want in zip(rec.grads, ref, strict=True):
        assert max(rel_err(got[k], want[k]) for k in want) < 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("path", LOSS_PATHS)
def test_trainer_trains_the_plain_loop_by_every_path(plan, tmp_path, path):
    ref, ref_model = plain_loop_grads(plan, tiny_model(seed=3), LR, 2)
    rec = GradRecorder()
    model = tiny_model(seed=3)
    trainer = PlanTrainer(model=model, args=args_for(tmp_path), plan=plan, loss=path, callbacks=[rec])
    trainer.train()
    for got, want in zip(rec.grads, ref, strict=True):
        assert max(rel_err(got[k], want[k]) for k in want) < 1e-5
    assert abs(trainer.evaluate()["eval_loss"] - evaluate_plan(ref_model, plan, loss="logits").loss) < 1e-5


def test_trainer_refuses_an_unknown_loss_path(plan, tmp_path):
    with pytest.raises(ValueError, match="chunked, logits, model"):
        PlanTrainer(model=tiny_model(), args=args_for(tmp_path), plan=plan, loss="fused")


@pytest.mark.slow
def test_the_128k_vocabulary_case_trains_in_a_fraction_of_the_full_logits_memory():
    """benchmarks/bench_loss_memory.py's `small` case (4M parameters, vocabulary 128256, 2 x 2048 tokens), one
    update by the chunked path in a fresh process: peak RSS under 1.5 GB (the full logits alone are 2.1 GB)."""
    import json
    import subprocess
    import sys

    bench = REPO / "benchmarks" / "bench_loss_memory.py"
    out = subprocess.run([sys.executable, str(bench), "--one", "small", "chunked", "0", "--updates", "1"],
                         check=True, capture_output=True, text=True, timeout=1800).stdout
    result = json.loads(out.strip().splitlines()[-1])
    assert result["peak_mb"] < 1500, result
    assert 11.0 < result["losses"][0] < 12.5  # about ln(128256) = 11.76 at random init
