"""Smoke run of experiments/table7.py: ResNet-50 at CIFAR size, batch 2, on 2 devices (~30 s)."""

from __future__ import annotations

import pandas as pd
import pytest

pytest.importorskip("tensorflow")

from experiments import table7  # noqa: E402


def test_table7_smoke(tmp_path, capsys):
    out = tmp_path / "t7.csv"
    results, splits, table6 = table7.main(["--models", "resnet50", "--batch", "2", "--devices", "2",
                                           "--out", str(out), "--no-progress"])
    text = capsys.readouterr().out
    assert "Table 7" in text and "paper" in text and "s in all" in text
    saved = pd.read_csv(out)
    assert list(saved.strategy) == list(table7.STRATEGIES)
    assert (saved.status == "ok").all() and (saved.step_seconds > 0).all()
    assert saved.split_candidates.iloc[0] > 0  # the graph carries candidates
    t = saved.set_index("strategy").step_seconds
    # Splitting never makes the step longer; D-DPS(-F) never splits.
    assert t["fddps"] <= t["fddps:split=False"]
    assert t["fddps:improve=False"] <= t["fddps:improve=False,split=False"]
    assert saved.set_index("strategy").splits[["fddps:split=False", "mpdps"]].eq(0).all()
    assert (tmp_path / "t7_splits.csv").exists() and (tmp_path / "t7.png").stat().st_size > 0
    assert "| model | batch |" in (tmp_path / "t7.md").read_text()
    assert table6.empty  # no VGG-16 in this run
    row = table7.summary(results).iloc[0]
    assert row["model"] == "resnet50" and row["D-DPS(-F) s"] == "0.735"


def test_table7_vgg16_splits_and_table6(tmp_path, capsys):
    """VGG-16 at the paper's batch on 4 GPUs: its big convolutions are split (~10 s)."""
    results, splits, table6 = table7.main(["--models", "vgg16", "--out", str(tmp_path / "t7.csv"),
                                           "--no-progress", "--no-plot"])
    t = results.set_index("strategy").step_seconds
    assert t["fddps"] < t["fddps:split=False"]
    fd = splits[splits.strategy == "fddps"]
    assert len(fd) == results.set_index("strategy").splits["fddps"] > 0
    assert set(fd.op_type) <= {"Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter", "MatMul"}
    assert not fd.op.duplicated().any()  # at most one decision per op
    assert table6.paper_op.tolist() == ["Conv1_1", "Conv1_2", "Conv1_2bp", "Conv1_2bp", "Relu1_2",
                                        "Pool1", "Fc6"]
    assert (table6.time_ms > 0).all()
    assert "Table 6, VGG-16" in capsys.readouterr().out
