"""Smoke test of experiments/strategy_equality.py (issue 12's equality matrix)."""

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("tensorflow")

from experiments import strategy_equality as se  # noqa: E402


def test_difference_is_the_tests_allclose_criterion():
    b = np.array([0.0, 0.05, 1.0, -30.0], dtype=np.float32)
    for a in (b + np.float32(9.9e-7), b * (1 + 9e-6) + 9e-7, b + np.float32(1.2e-6),
              b * (1 + 2e-5)):
        rel, _ = se.differences({"x": a}, {"x": b})["x"]
        try:
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
            close = True
        except AssertionError:
            close = False
        assert (rel <= se.RTOL) == close, (a, rel)


def test_verdicts_compare_each_quantity_with_its_own_rounding_spread():
    def cell(w, v):
        return {"loss (step)": (0.0, 0.0), "loss (next)": (1e-6, 0.0), "w": (w, 0.0),
                "v": (v, 0.0)}

    spread = cell(1e-4, 1e-7)
    assert se.summarize(cell(1e-6, 1e-6), spread)["verdict"] == "equal at 1e-5"
    row = se.summarize(cell(3e-4, 1e-6), spread)
    assert row["verdict"] == "equal to float32 rounding"
    assert row["rounding_ratio"] == pytest.approx(3.0)
    assert row["worst_quantity"] == row["worst_var"] == "w"
    # v is 100x above its own spread, though below w's: not rounding.
    row = se.summarize(cell(1e-4, 2e-5), spread)
    assert row["verdict"] == "DIFFERS" and row["ratio_quantity"] == "v"
    assert se.summarize(cell(3e-4, 0.0), cell(0.0, 0.0))["verdict"] == "DIFFERS"
    assert se.summarize(cell(3e-4, 0.0))["verdict"] == "DIFFERS"  # no spread measured


def test_ulp_perturbation_moves_every_value_by_one_ulp():
    x = np.random.default_rng(3).uniform(-1, 1, (4, 5)).astype(np.float32)
    y = se.ulp_perturbed(x)
    assert y.dtype == np.float32 and (y != x).all()
    assert (np.abs(y - x) == np.spacing(np.abs(np.minimum(np.abs(x), np.abs(y))))).all()
    assert (y > x).any() and (y < x).any()
    np.testing.assert_array_equal(se.ulp_perturbed(x), y)
    x64 = x.astype(np.float64)
    y64 = se.ulp_perturbed(x64, dtype=np.float64)
    assert y64.dtype == np.float64 and (np.abs(y64 - x64) <= np.spacing(np.abs(x64))).all()
    assert (y64 != x64).all()


@pytest.mark.slow
def test_experiment_passes_data_parallel_vgg16_and_flags_a_wrong_learning_rate(tmp_path):
    import slim_models

    out = tmp_path / "eq.csv"
    rows = se.run_network("vgg16", 2, ["data_parallel"], ["cpu4"], out=out, kernel_probe=True)
    df = pd.read_csv(out)
    assert list(df.columns[:len(se.COLUMNS)]) == se.COLUMNS
    assert list(df.strategy) == ["spread:repeat"] + [
        f"spread:input_ulp{k}" for k in range(se.ROUNDING_DRAWS)] + [
        "spread:threads", "spread:onednn_off", "spread:f64_input_ulp", "data_parallel"]
    cell = rows[-1]
    assert cell["status"] == "ok" and cell["cluster"] == "cpu4" and cell["devices"] == 4
    assert cell["verdict"] == "equal at 1e-5" and cell["pass_1e5"]
    assert cell["verdict_kernels"] == "equal at 1e-5"
    # oneDNN off is the same step on other kernels: the loss during it agrees.
    assert df.loss_step_rel[df.strategy == "spread:onednn_off"].item() < 1e-5
    assert 0 < cell["worst_rel"] <= 1e-5  # sums were reordered, within float32
    assert cell["ops_split"] > 0 and cell["ops"] > df.ops[0]
    # The one-ulp input perturbation does move the step.
    assert (df.worst_rel[1:1 + se.ROUNDING_DRAWS] > 0).any()

    # A graph that is wrong by a learning rate of 0.02 instead of 0.01 is flagged.
    model = slim_models.build_training_graph("vgg16", 2, dataset="cifar10")
    wrong = slim_models.build_training_graph("vgg16", 2, dataset="cifar10", learning_rate=0.02)
    variables = se.variable_names(model.graph_def)
    ref = se.run_step(model.graph_def, model, variables)
    spread = se.differences(
        se.run_step(model.graph_def, model, variables,
                    images=se.ulp_perturbed(se.unsplit_images(model))), ref)
    row = se.summarize(se.differences(se.run_step(wrong.graph_def, model, variables), ref),
                       spread, [v.op.name for v in model.trainable_variables])
    assert row["verdict"] == "DIFFERS" and not row["pass_1e5"]
    assert row["loss_step_rel"] <= 1e-5 < 1e-4 < row["loss_next_rel"]
    assert row["trainable_rel"] > 1e-5 and row["worst_var"]

    # In float64 the data-parallel rewrite agrees to ~1e-16 and the wrong graph does not.
    assert cell["verdict_f64"] == "equal in float64" and cell["f64_worst_rel"] < 1e-12
    from fddps.tf.float64 import as_float64

    gd64 = as_float64(model.graph_def)
    variables = se.variable_names(gd64)
    ref64 = se.run_step(gd64, model, variables)
    images64 = se.unsplit_images(model, graph_def=gd64)
    assert images64.dtype == np.float64
    spread64 = se.differences(se.run_step(gd64, model, variables,
                                          images=se.ulp_perturbed(images64, 0, np.float64)), ref64)
    row64 = se.summarize_float64(se.differences(
        se.run_step(as_float64(wrong.graph_def), model, variables), ref64), spread64)
    assert row64["verdict_f64"] == "DIFFERS" and row64["f64_worst_rel"] > 1e-4

