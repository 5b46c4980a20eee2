"""The Axolotl plugin, run through Axolotl's own training entry point (`python -m axolotl.cli.train config.yml`) on
CPU with a tiny Llama built from a config: its steps' losses and final weights equal `PlanTrainer`'s on the same
plan, its eval loss is the eval plan's exact token mean, it resumes exactly from its own checkpoint, and it refuses
a tokenizer other than the plan's.

Axolotl pins its own transformers and TRL, so it runs from a separate venv: `$PLANCC_AXOLOTL_VENV` (default
/tmp/plancc-axolotl-venv, built by `make axolotl-venv`, several GB of downloads). The tests build it when missing
only with `PLANCC_AXOLOTL_INSTALL=1` (the suite stays offline-quick otherwise), and skip, saying why, when it is
not there or cannot be built (no network, no room). The reference runs in this venv.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

import plancc
from plancc.runtime import evaluate_plan
from tests.support import REPO
from tests.support.axolotl import axolotl_python as venv_python
from tests.support.training import rel_err

pytestmark = pytest.mark.slow  # builds a venv once, runs Axolotl in subprocesses

ROOT = REPO
LR, STEPS = 0.5, 3


@pytest.fixture(scope="session")
def axolotl_python() -> Path:
    return venv_python()


def write_model_and_tokenizer(where: Path, *, eos: str = "<|im_end|>") -> Path:
    """A tiny random Llama and the built-in byte-level tokenizer saved as a Hugging Face model directory."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from plancc.scan.sources.tokenizer import _builtin

    where.mkdir(parents=True)
    tok = _builtin()
    tok.save(str(where / "tokenizer.json"))
    (where / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": eos, "pad_token": "<|pad|>",
        "bos_token": "<|bos|>"}))
    torch.manual_seed(0)
    ids = {t: tok.token_to_id(t) for t in ("<|bos|>", eos, "<|pad|>")}
    cfg = LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=False, bos_token_id=ids["<|bos|>"], eos_token_id=ids[eos],
                      pad_token_id=ids["<|pad|>"])
    LlamaForCausalLM(cfg).save_pretrained(where)
    return where


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("axolotl")
    model = write_model_and_tokenizer(root / "model")
    plan = plancc.compile([{"path": str(ROOT / "examples" / "data" / "chat.jsonl"), "chat_template": "chatml"}],
                          root / "plan", tokenizer=str(model), sequence_len=256, long="truncate", mode="packed",
                          world_size=1, grad_accum=2, val_set_size=4, epochs=1, seed=0, max_dropped=1.0,
                          cache_dir=root / "cache")
    return root, model, plan.path


def axolotl_yaml(path: Path, model: Path, plan: Path, out: Path, **extra) -> Path:
    """A user's Axolotl config with the plugin: its datasets (what the plan was compiled from) stay in it."""
    lines = [f"base_model: {model}", "tokenizer_type: PreTrainedTokenizerFast",
             "plugins:", "  - plancc.integrations.axolotl.PlanccPlugin", f"plancc_plan: {plan}",
             "datasets:", f"  - path: {ROOT / 'examples' / 'data' / 'chat.jsonl'}", "    type: chat_template",
             "    ds_type: json", "sequence_len: 256", "micro_batch_size: 1", "gradient_accumulation_steps: 2",
             f"learning_rate: {LR}", "optimizer: sgd", "lr_scheduler: constant", "max_grad_norm: 0.0",
             "weight_decay: 0.0", "warmup_steps: 0", "bf16: false", "fp16: false", "tf32: false",
             "logging_steps: 1", "seed: 0", "dataloader_num_workers: 0", f"output_dir: {out}"]
    lines += [f"{k}: {json.dumps(v)}" for k, v in extra.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def run_axolotl(python: Path, config: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": "", "HF_HUB_OFFLINE": "1",
           "WANDB_DISABLED": "true", "AXOLOTL_DO_NOT_TRACK": "1", "DO_NOT_TRACK": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run([str(python), "-m", "axolotl.cli.train", str(config)], env=env, capture_output=True,
                          text=True, timeout=1200)


def weights(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def reference(model_dir: Path, plan: Path, out: Path):
    """`PlanTrainer` on the same plan and model, with the same optimizer settings: (losses, trained model)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainingArguments

    from plancc.runtime.hf import PlanTrainer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    args = TrainingArguments(output_dir=str(out), use_cpu=True, gradient_accumulation_steps=2, learning_rate=LR,
                             optim="sgd", lr_scheduler_type="constant", max_grad_norm=0.0, weight_decay=0.0,
                             report_to=[], save_strategy="no", logging_steps=1, disable_tqdm=True, seed=0,
                             dataloader_num_workers=0, max_steps=STEPS)
    trainer = PlanTrainer(model=model, args=args, plan=plan, processing_class=tokenizer,
                          pad_token_id=tokenizer.pad_token_id)
    trainer.train()
    return [h["loss"] for h in trainer.state.log_history if "loss" in h], model, tokenizer


def test_axolotl_trains_on_the_plan_like_plan_trainer(axolotl_python, setup):
    root, model_dir, plan = setup
    out = root / "run"
    config = axolotl_yaml(root / "run.yml", model_dir, plan, out, max_steps=STEPS, save_strategy="steps",
                          save_steps=STEPS, eval_strategy="steps", eval_steps=STEPS)
    done = run_axolotl(axolotl_python, config)
    assert done.returncode == 0, done.stderr[-3000:]
    history = json.loads((out / f"checkpoint-{STEPS}" / "trainer_state.json").read_text())["log_history"]
    losses = [h["loss"] for h in history if "loss" in h]
    want, ref_model, tokenizer = reference(model_dir, plan, root / "ref")
    assert len(losses) == len(want) == STEPS
    for got, expected in zip(losses, want, strict=True):
        assert abs(got - expected) <= 1e-5 * abs(expected), (losses, want)
    trained = weights(out)
    for name, p in ref_model.named_parameters():
        assert rel_err(trained[name], p.detach()) < 1e-5, name
    # Axolotl's evals (at start, and at its schedule) are the eval plan's exact token mean
    eval_loss = next(h["eval_loss"] for h in history if "eval_loss" in h and h["step"] == STEPS)
    assert abs(eval_loss - evaluate_plan(ref_model, plan, pad_token_id=tokenizer.pad_token_id).loss) < 1e-5


def test_axolotl_resumes_from_its_checkpoint_exactly(axolotl_python, setup):
    root, model_dir, plan = setup
    full, part = root / "full", root / "part"
    assert run_axolotl(axolotl_python, axolotl_yaml(root / "full.yml", model_dir, plan, full,
                                                    max_steps=STEPS, save_strategy="no")).returncode == 0
    first = run_axolotl(axolotl_python, axolotl_yaml(root / "p1.yml", model_dir, plan, part, max_steps=2,
                                                     save_strategy="steps", save_steps=2))
    assert first.returncode == 0, first.stderr[-3000:]
    assert json.loads((part / "checkpoint-2" / "plancc_sampler.json").read_text())["update"] == 2
    resumed = run_axolotl(axolotl_python, axolotl_yaml(
        root / "p2.yml", model_dir, plan, part, max_steps=STEPS, save_strategy="no",
        resume_from_checkpoint=str(part / "checkpoint-2")))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a, b = weights(full), weights(part)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_axolotl_with_another_tokenizer_is_refused(axolotl_python, setup):
    root, _, plan = setup
    other = write_model_and_tokenizer(root / "other", eos="<|eos|>")  # same vocabulary, another eos
    done = run_axolotl(axolotl_python, axolotl_yaml(root / "other.yml", other, plan, root / "o", max_steps=1))
    assert done.returncode != 0
    assert "its token ids mean nothing under another tokenizer" in done.stderr + done.stdout
