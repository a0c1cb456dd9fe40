"""Smoke test of experiments.contention (issue 17): local CPU devices and the Fig. 4 setting."""

import pytest

pytest.importorskip("tensorflow")


@pytest.mark.slow
def test_contention_experiment_smoke(tmp_path, capsys):
    from experiments import contention

    out = tmp_path / "contention.csv"
    res = contention.main(["--quick", "--parts", "local", "fig4", "--devices", "2",
                           "--algorithms", "heft", "--steps", "1", "--warmup", "1",
                           "--fig4-models", "resnet50", "--fig4-batch", "2", "--no-progress",
                           "--out", str(out)])
    text = capsys.readouterr().out
    assert "load average at start" in text and "Fig. 4 setting" in text
    local, fig4 = res["local"], res["fig4"]
    # Both core models, with the single-device baseline, on 2 devices.
    assert set(local.cores) == {"shared", "own"} and set(local.algorithm) == {"single", "heft"}
    assert (local.measured > 0).all() and (local.predicted > 0).all()
    single = local[local.algorithm == "single"]
    assert (single.predicted_speedup == 1.0).all()
    # Sharing this process's cores never predicts more than the devices' own cores do.
    heft = local[local.algorithm == "heft"].set_index("cores")
    assert heft.loc["shared", "predicted_speedup"] <= heft.loc["own", "predicted_speedup"] + 1e-9
    # A shared NIC never makes a schedule faster; its floor is positive where bytes cross.
    assert (fig4.step_nic >= fig4.step_free * (1 - 1e-9)).all()
    assert set(fig4.rank_free) <= {1} and set(fig4.rank_nic) <= {1}
    for name in ("contention_local.csv", "contention_fig4.csv", "contention.png"):
        assert (tmp_path / name).stat().st_size > 0
