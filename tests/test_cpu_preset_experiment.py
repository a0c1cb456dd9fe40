"""Smoke run of experiments/cpu_preset.py (the CPU preset fitted to this machine)."""

import numpy as np
import pandas as pd
import pytest


@pytest.mark.slow
def test_cpu_preset_experiment_smoke(tmp_path, capsys):
    from experiments import cpu_preset

    out = tmp_path / "cpu_preset.csv"
    assert cpu_preset.main(["--models", "vgg16", "--batch", "2", "--steps", "2", "--warmup", "1",
                            "--out", str(out)]) == 0
    df = pd.read_csv(out)
    assert list(df.model) == ["vgg16"] and df.step_ops.iloc[0] > 100
    assert (df[["measured_ms", "one_core_ms", "assumed_ms", "fitted_ms"]] > 0).all(axis=None)
    # One model: nothing to hold out; the overhead fitted to its own step makes
    # up what the op times leave (it is never negative, so never shorter).
    assert np.isnan(df.held_out_ms.iloc[0])
    assert df.fitted_ms.iloc[0] >= df.measured_ms.iloc[0] * (1 - 1e-9)
    printed = capsys.readouterr().out
    assert "fitted on vgg16" in printed and "| vgg16 |" in printed
    assert out.with_suffix(".png").exists()
