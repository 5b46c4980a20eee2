"""TRL: `PlanDPOTrainer` and `PlanKTOTrainer` train a tiny Llama (from a config: no download) on preference plans
of real Alpaca pairs with the plain loop's loss at every step (fp32, relative 1e-5), `evaluate()` gives the exact
eval pair mean and reward accuracy of an independent reference, and resume is bit for bit; plans of one kind are
refused by the other kinds' trainers."""

from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer, pre_tokenizers
from tokenizers.models import WordLevel
from transformers import PreTrainedTokenizerFast
from trl import DPOConfig, KTOConfig, SFTConfig

from benchmarks.preference_data import alpaca_pairs, build_preference_plan, tokenize_pairs, unpaired
from plancc.errors import PlanMismatchError
from plancc.runtime import PlanCollator, PlanSampler, load_tokens, model_inputs
from plancc.runtime.preference import kl_reference_point, preference_loss, sequence_logps
from plancc.runtime.trl import PlanSFTTrainer
from plancc.runtime.trl_preference import PlanDPOTrainer, PlanKTOTrainer
from plancc.store.parquet import sample_arrays
from plancc.store.plan import verified_plan
from tests.support.preference import BETA, one_at_a_time, reference_pair_loss
from tests.support.training import tiny_model

pytestmark = pytest.mark.slow  # trains TRL's trainers

VOCAB, LR, STEPS = 260, 0.05, 4


def tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer over the plans' byte ids (b0 .. b255, then the end and pad tokens), in memory."""
    vocab = {**{f"b{i}": i for i in range(256)}, "<eos>": 256, "<pad>": 257}
    tok = Tokenizer(WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")


def model():
    return tiny_model(seed=5, vocab=VOCAB, layers=2, hidden=32)


def common(out, **kw) -> dict:
    base = dict(output_dir=str(out), use_cpu=True, bf16=False, gradient_checkpointing=False,
                per_device_train_batch_size=1, gradient_accumulation_steps=2, learning_rate=LR, optim="sgd",
                lr_scheduler_type="constant", max_grad_norm=0.0, weight_decay=0.0, report_to=[], save_strategy="no",
                logging_steps=1, disable_tqdm=True, seed=0, dataloader_num_workers=0, beta=BETA,
                max_steps=STEPS)
    base.update(kw)
    return base


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    root = tmp_path_factory.mktemp("trl_pref")
    tok = tokenize_pairs(alpaca_pairs(200, seed=4), lambda t: list(t.encode()), 256, limit=384)
    settings = dict(mode="packed", micro_batch_size=1, sequence_len=384, grad_accum=2, val_set_size=6)
    return {"pairs": str(build_preference_plan(root / "pairs", tok, **settings)),
            "kto": str(build_preference_plan(root / "kto", unpaired(tok), **settings))}


def plain_loop_losses(plan: str, loss_type: str, steps: int) -> list[float]:
    """Each update's loss trained by hand on the plan's microbatches, SGD between updates."""
    policy, ref = model(), model().eval()
    opt = torch.optim.SGD(policy.parameters(), lr=LR)
    sampler, collator, tokens = PlanSampler(plan), PlanCollator.from_plan(plan), load_tokens(plan)
    batches = [collator(mb, tokens) for mb in sampler]
    out = []
    for update in range(steps):
        mine = [b for b in batches if b["plan"]["update"] == update]
        kw = {}
        if loss_type == "kto":
            with torch.no_grad():
                kl = [(sequence_logps(policy(**model_inputs(b["kl"])).logits, b["kl"])[0],
                       sequence_logps(ref(**model_inputs(b["kl"])).logits, b["kl"])[0]) for b in mine]
            kw["kl"] = kl_reference_point([p for p, _ in kl], [r for _, r in kl])
        total = 0.0
        for b in mine:
            with torch.no_grad():
                reference = sequence_logps(ref(**model_inputs(b)).logits, b)
            loss = preference_loss(sequence_logps(policy(**model_inputs(b)).logits, b), reference, b,
                                   loss_type=loss_type, beta=BETA, **kw)
            loss.backward()
            total += float(loss)
        opt.step()
        opt.zero_grad(set_to_none=True)
        out.append(total)
    return out


def logged_losses(trainer) -> list[float]:
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


@pytest.mark.parametrize("loss_type", ["sigmoid", "ipo"])
def test_dpo_trainer_losses_equal_the_plain_loop(plans, tmp_path, loss_type):
    trainer = PlanDPOTrainer(model=model(), ref_model=model().eval(), plan=plans["pairs"], processing_class=tokenizer(),
                             args=DPOConfig(**common(tmp_path, loss_type=loss_type)))
    trainer.train()
    got, want = logged_losses(trainer), plain_loop_losses(plans["pairs"], loss_type, STEPS)
    assert len(got) == STEPS
    assert max(abs(a - b) / abs(b) for a, b in zip(got, want, strict=True)) < 1e-5


def test_kto_trainer_losses_equal_the_plain_loop(plans, tmp_path):
    trainer = PlanKTOTrainer(model=model(), ref_model=model().eval(), plan=plans["kto"], processing_class=tokenizer(),
                             args=KTOConfig(**common(tmp_path)))
    trainer.train()
    got, want = logged_losses(trainer), plain_loop_losses(plans["kto"], "kto", STEPS)
    assert len(got) == STEPS
    assert max(abs(a - b) / abs(b) for a, b in zip(got, want, strict=True)) < 1e-5


def test_dpo_evaluate_is_the_exact_eval_pair_mean(plans, tmp_path):
    policy, ref = model(), model().eval()
    trainer = PlanDPOTrainer(model=policy, ref_model=ref, plan=plans["pairs"], processing_class=tokenizer(),
                             args=DPOConfig(**common(tmp_path)))
    metrics = trainer.evaluate()
    plan = verified_plan(plans["pairs"])
    tokens, s = load_tokens(plan), sample_arrays(plan.samples_table())
    ids = plan.eval().sample_ids.tolist()
    pairs = [(c, r) for c, r in zip(ids[0::2], ids[1::2], strict=True)]
    assert all(s.pair_id[c] == s.pair_id[r] for c, r in pairs) and len(pairs) == 6
    logps, ref_logps = one_at_a_time(policy, tokens, plan.settings.shift), one_at_a_time(ref, tokens, "sample")
    with torch.no_grad():
        want = float(reference_pair_loss(logps, ref_logps, pairs, "sigmoid"))
        margins = [(logps(c)[0] - ref_logps(c)[0]) - (logps(r)[0] - ref_logps(r)[0]) for c, r in pairs]
    assert abs(metrics["eval_loss"] - want) / want < 1e-5
    assert metrics["eval_pairs"] == 6
    assert metrics["eval_rewards/accuracies"] == pytest.approx(sum(float(m) > 0 for m in margins) / 6)


def test_dpo_trainer_resumes_bit_identically(plans, tmp_path):
    full = model()
    PlanDPOTrainer(model=full, ref_model=model().eval(), plan=plans["pairs"], processing_class=tokenizer(),
                   args=DPOConfig(**common(tmp_path / "full"))).train()
    out = tmp_path / "stopped"
    PlanDPOTrainer(model=model(), ref_model=model().eval(), plan=plans["pairs"], processing_class=tokenizer(),
                   args=DPOConfig(**common(out, max_steps=2, save_strategy="steps", save_steps=2))).train()
    resumed = tiny_model(seed=99, vocab=VOCAB, layers=2, hidden=32)
    PlanDPOTrainer(model=resumed, ref_model=model().eval(), plan=plans["pairs"], processing_class=tokenizer(),
                   args=DPOConfig(**common(out))).train(resume_from_checkpoint=str(out / "checkpoint-2"))
    for (name, a), b in zip(full.named_parameters(), resumed.parameters(), strict=True):
        assert torch.equal(a, b), name


def test_plans_reach_only_their_own_trainer(plans, tmp_path):
    with pytest.raises(PlanMismatchError, match="PlanKTOTrainer"):
        PlanDPOTrainer(model=model(), plan=plans["kto"], processing_class=tokenizer(),
                       args=DPOConfig(**common(tmp_path)))
    with pytest.raises(PlanMismatchError, match=r"preference data.*PlanDPOTrainer"):
        PlanSFTTrainer(model=model(), plan=plans["pairs"], processing_class=tokenizer(),
                       args=SFTConfig(**{k: v for k, v in common(tmp_path).items() if k != "beta"}))
    with pytest.raises(PlanMismatchError, match="loss_type"):
        PlanDPOTrainer(model=model(), plan=plans["pairs"], processing_class=tokenizer(),
                       args=DPOConfig(**common(tmp_path, loss_type="kto")))
