"""benchmarks/bench_training.py --quick on generated data: plancc's loss trained as W=1 x G=8 and as 2 simulated
ranks x G=4 gives the same curves to round-off; the naive mean-of-means loop does not."""

from __future__ import annotations

import csv
import json
import random

import pytest

from benchmarks import bench_training
from examples.make_example_data import conversation, instruction, write

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench-training")
    rng = random.Random(3)
    alpaca = tmp / "alpaca.json"
    alpaca.write_text(json.dumps([instruction(rng) for _ in range(160)]))
    write(tmp / "chat.jsonl", [conversation(rng) for _ in range(120)])
    out = tmp / "out"
    results = bench_training.main(["--quick", "--data", str(alpaca), "--chat", str(tmp / "chat.jsonl"), "--out",
                                   str(out), "--threads", "1"])
    return results[0], out


def test_elastic_replay_and_two_ranks_train_alike_to_round_off(quick):
    runs, _ = quick
    d = bench_training.differences(runs["a"], runs["b"])
    assert len(runs["a"].train) == 30 and sorted(runs["a"].evals) == [0, 10, 20, 30]
    assert d["train_max_rel"] < 1e-4 and d["eval_max_rel"] < 1e-4 and d["params_rel"] < 1e-4


def test_the_naive_loop_trains_another_model(quick):
    runs, _ = quick
    d = bench_training.differences(runs["a"], runs["c"])
    same = bench_training.differences(runs["a"], runs["b"])
    assert d["train_max_abs"] > 1e-3 and d["eval_max_abs"] > 1e-3
    assert d["params_rel"] > 100 * same["params_rel"]
    # the loss the naive loop reports is not the token mean of its own updates
    assert max(abs(r - t) for r, t in zip(runs["c"].reported, runs["c"].train, strict=True)) > 1e-3


def test_it_writes_the_plot_and_tables(quick):
    out = quick[1]
    assert (out / "training-loss.png").read_bytes()[:4] == b"\x89PNG"
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert {r["pair"] for r in rows} == {"(a) vs (b)", "(a) vs (c)"}
    curves = list(csv.DictReader((out / "curves.csv").open()))
    assert len(curves) == 3 * 31
    assert "| (a) vs (c) |" in (out / "results.md").read_text()
