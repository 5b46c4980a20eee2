"""One meaning of "updates": the optimizer steps the trainer runs (complete updates plus the kept tail).

The compile summary, the manifest, the `updates` metric, `inspect metrics`, `inspect plan`'s --update range, the
runtime sampler (plain loop and full-update stream) and a real `PlanTrainer` must all count the same number, for
every layout: packed/padded, several world_size x grad_accum, with and without --drop-last, tail or not.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from benchmarks.synthetic import build_plan
from plancc.build.run import write_plan_dir
from plancc.cli import app
from plancc.cli.summary import compile_summary
from plancc.config.settings import PlanSettings
from plancc.core import layout
from plancc.errors import PlanccError
from plancc.planner.pipeline import compile_plan
from plancc.review.inspect import plan_view, read_metrics
from plancc.runtime import PlanSampler
from plancc.store.parquet import sample_arrays
from plancc.store.scan_record import ScanRecord
from tests.support.plans import write_samples_file


def samples(lengths: list[int], seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    length = np.asarray(lengths, dtype=np.int64)
    return pa.table({
        "sample_id": pa.array(np.arange(length.size) * 2 + 1, pa.int64()),
        "length": pa.array(length, pa.int32()),
        "label_count": pa.array(np.maximum(length // 2, 1), pa.int32()),
        "first_label_supervised": pa.array(rng.random(length.size) < 0.2),
        "token_hash": pa.array(rng.integers(0, 2**63, length.size).astype(np.uint64)),
    })


def summary_updates(manifest: dict, metrics: list[dict]) -> dict[int, int]:
    """The `updates` column of each epoch row of the compile summary."""
    lines = compile_summary("p", manifest, metrics)
    head = next(i for i, line in enumerate(lines) if line.startswith("epoch "))
    rows = [line.split() for line in lines[head + 1:head + 1 + len(manifest["epochs"])]]
    return {int(r[0]): int(r[2].replace(",", "")) for r in rows}


def optimizer_steps(sampler: PlanSampler) -> int:
    """Steps a plain loop takes in the sampler's epoch: one at the last micro-step of each update."""
    return sum(mb.last_in_update for mb in sampler)


def assert_one_count(plan: Path, manifest: dict, metrics: list[dict]) -> list[int]:
    """Every count of updates per epoch agrees with the trainer's (`layout.optimizer_updates`); returns them."""
    W, G = manifest["settings"]["world_size"], manifest["settings"]["grad_accum"]
    after = {m["epoch"]: m for m in metrics if m["stage"] == "after"}
    shown = summary_updates(manifest, metrics)
    counts = []
    for e in manifest["epochs"]:
        epoch, batches = e["epoch"], e["batches"]
        want = layout.optimizer_updates(batches, W, G)
        assert want == layout.rank_walk(batches, W, G).updates
        assert e["updates"] == after[epoch]["updates"] == shown.get(epoch, want) == want
        complete = after[epoch]["complete_updates"]
        assert complete == batches // (W * G) and want - complete == (batches % (W * G) > 0)
        assert read_metrics(plan, epoch)[-1]["updates"] == want
        assert plan_view(plan, epoch=epoch, update=want - 1, limit=1).matching > 0
        with pytest.raises(PlanccError, match=f"--update {want} is out of range: the plan has {want:,} updates"):
            plan_view(plan, epoch=epoch, update=want)
        assert {r["update"] for r in plan_view(plan, epoch=epoch, limit=0).rows} == set(range(want))
        for rank in range(W):
            plain = PlanSampler(plan, rank=rank, world_size=W, epoch=epoch)
            full = PlanSampler(plan, rank=rank, world_size=W, epoch=epoch, full_updates=True)
            assert plain.updates_per_epoch() == full.updates_per_epoch() == optimizer_steps(plain) == want
            assert optimizer_steps(full) == want and len(full) == want * G
        counts.append(want)
    return counts


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lengths=st.lists(st.integers(2, 64), min_size=1, max_size=60), mode=st.sampled_from(["packed", "padded"]),
       W=st.integers(1, 3), G=st.integers(1, 3), mbs=st.integers(1, 3), drop_last=st.booleans(),
       seed=st.integers(0, 3))
def test_every_count_of_updates_is_the_trainers(tmp_path_factory, lengths, mode, W, G, mbs, drop_last, seed):
    table = samples(lengths, seed)
    ps = PlanSettings(mode=mode, sequence_len=64, micro_batch_size=mbs, world_size=W, grad_accum=G,
                      drop_last=drop_last, epochs=2, seed=seed)
    s = sample_arrays(table)
    try:
        epochs = compile_plan(s, ps)
    except PlanccError:  # --drop-last with less than one update: refused at compile, nothing to count
        assume(False)
    plan = tmp_path_factory.mktemp("u") / "plan"
    manifest = write_plan_dir(plan, table, s, ps, epochs, ScanRecord(), None).to_json()
    metrics = read_metrics(plan)
    assert_one_count(plan, manifest, metrics)
    if drop_last:
        assert all(m["excluded_tail_microbatches"] == 0 for m in metrics if m["stage"] == "after")


def test_the_reported_case_keep_last_tail_is_counted_by_the_cli(tmp_path):
    """The tester's report: a kept tail was trained but not counted (summary "updates 10", trainer 11)."""
    src = write_samples_file(tmp_path, 5, 200, 200)
    cli = CliRunner()
    out = tmp_path / "p"
    res = cli.invoke(app, ["compile", str(src), "-o", str(out), "--sequence-len", "256", "--world-size", "2",
                           "--grad-accum", "2", "--epochs", "1"])
    assert res.exit_code == 0, res.output
    manifest = json.loads((out / "manifest.json").read_text())
    batches = manifest["epochs"][0]["batches"]
    assert batches % 4, "the fixture must leave an incomplete final update"
    want = batches // 4 + 1
    row = next(line for line in res.stdout.splitlines() if line.startswith("0 "))
    assert row.split()[2] == str(want)
    metrics = json.loads(cli.invoke(app, ["inspect", "metrics", str(out), "--json"]).stdout)["metrics"]
    assert {m["stage"]: m["updates"] for m in metrics}["after"] == want
    tail = cli.invoke(app, ["inspect", "plan", str(out), "--update", str(want - 1), "--json", "--limit", "0"])
    assert tail.exit_code == 0, tail.output
    assert {m["update"] for m in json.loads(tail.stdout)["microbatches"]} == {want - 1}
    past = cli.invoke(app, ["inspect", "plan", str(out), "--update", str(want)])
    assert past.exit_code == 2 and f"the plan has {want} updates (0..{want - 1})" in past.output
    assert optimizer_steps(PlanSampler(out, rank=0, world_size=2)) == want


# ---------------------------------------------------------------- a real Trainer


TRAINER_LAYOUTS = {  # (mode, world_size, grad_accum, drop_last, samples); the run replays on 1 process
    "packed-w1g2-tail": ("packed", 1, 2, False, 15),
    "packed-w1g2-drop": ("packed", 1, 2, True, 15),
    "padded-w2g1-elastic-tail": ("padded", 2, 1, False, 10),
    "padded-w1g3-complete": ("padded", 1, 3, False, 12),
}


@pytest.mark.slow  # trains a real PlanTrainer per layout
@pytest.mark.parametrize("name", list(TRAINER_LAYOUTS))
def test_plan_trainer_runs_exactly_the_counted_updates(name, tmp_path):
    """A real `PlanTrainer` (tiny Llama, CPU) takes the manifest's updates per epoch, epoch after epoch."""
    from transformers import TrainingArguments

    from plancc.runtime.hf import PlanTrainer
    from tests.support.training import tiny_model

    mode, W, G, drop_last, n = TRAINER_LAYOUTS[name]
    plan = build_plan(tmp_path, n=n, data_seed=2, max_len=16, mode=mode, micro_batch_size=2, sequence_len=16,
                      world_size=W, grad_accum=G, drop_last=drop_last, epochs=2)
    manifest = json.loads((plan / "manifest.json").read_text())
    counts = assert_one_count(plan, manifest, read_metrics(plan))
    assert any(e["batches"] % (W * G) for e in manifest["epochs"]) == name.endswith("tail")
    for epochs in (1, 2):
        args = TrainingArguments(output_dir=str(tmp_path / f"run{epochs}"), use_cpu=True, report_to=[],
                                 gradient_accumulation_steps=W * G, num_train_epochs=epochs, save_strategy="no",
                                 optim="sgd", learning_rate=0.1, disable_tqdm=True, dataloader_num_workers=0)
        trainer = PlanTrainer(model=tiny_model(seed=1), args=args, plan=plan)
        trainer.train()
        assert trainer.state.global_step == trainer.state.max_steps == sum(counts[:epochs])
