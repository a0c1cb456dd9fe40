"""The CPU preset calibrated on this machine: `fddps calibrate`, `costmodel.calibrate_cpu()`,
its cache, and `place()` using it (issue 28).

conftest.py points FDDPS_CACHE_DIR at an empty folder of the suite's own; each test
here gets a fresh one. The tests time a few small ops with tiny budgets and assert
what was written, read back and said, never how fast anything ran.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

import costmodel
from costmodel import calibrate
from costmodel.errors import CostModelError

#: A few ops, two sizes of each class the quick tests fit (and one tiny op for the overhead).
FEW_OPS = (
    ("tiny", "AddV2", {"shape": [1, 4, 4, 16]}),
    ("mm small", "MatMul", dict(m=16, k=32, n=32)),
    ("mm large", "MatMul", dict(m=256, k=256, n=256)),
    ("relu small", "Relu", {"shape": [4, 16, 16, 16]}),
    ("relu large", "Relu", {"shape": [16, 32, 32, 16]}),
    ("mean", "Mean", {"shape": [16, 32, 32, 16], "axes": [1, 2]}),
)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("FDDPS_CACHE_DIR", str(folder))
    return folder


def _measured():
    """A synthetic measured table: three tiny ops at 1 us; convolutions and Relus whose
    rate grows with size (as on a real CPU)."""
    rows = [dict(label=f"tiny{i}", op_type="AddV2", flops=256, input_bytes=2048,
                 output_bytes=1024, seconds=1e-6) for i in range(3)]
    for flops, rate in ((1e6, 1e10), (1e8, 5e10), (1e9, 1e11)):
        rows.append(dict(label=f"conv {flops:g}", op_type="Conv2D", flops=flops,
                         input_bytes=flops / 100, output_bytes=flops / 100,
                         seconds=1e-6 + flops / rate))
    for nbytes, rate in ((1e4, 5e9), (1e6, 4e10), (1e8, 2e10)):
        rows.append(dict(label=f"relu {nbytes:g}", op_type="Relu", flops=0, input_bytes=nbytes / 2,
                         output_bytes=nbytes / 2, seconds=1e-6 + nbytes / rate))
    return pd.DataFrame(rows)


def test_fitted_efficiency_depends_on_the_ops_size_and_reproduces_the_times():
    m = _measured()
    p = calibrate.fit_cpu_preset(m, costmodel.cpu_preset(2))
    assert p.overhead == pytest.approx(1e-6)
    curves = dict(p.efficiency_curves)
    assert set(curves) == {"conv_forward/fp32", "elementwise"}
    conv = [e for _, e in curves["conv_forward/fp32"]]
    assert conv == sorted(conv) and conv[-1] / conv[0] == pytest.approx(10)  # 10 -> 100 GFLOP/s
    # The tiny ops (no slower than the overhead: efficiency 1), then the Relus: fastest
    # from the cache at 1 MB (the streaming bandwidth), slower beyond it.
    tiny, *relu = [e for _, e in curves["elementwise"]]
    assert tiny == 1.0 and relu[1] == 1.0 and relu[0] < relu[2] < relu[1]
    assert p.memory_bandwidth == pytest.approx(4e10)
    # The preset predicts the measured ops back, and sizes in between by interpolation.
    # (the tiny ops at the overhead, plus their bytes at the streaming bandwidth).
    t = p.op_times(m)
    assert np.allclose(t[3:], m.seconds[3:], rtol=1e-6)
    assert np.allclose(t[:3], m.seconds[:3], rtol=0.1)
    mid = pd.DataFrame({"op_type": ["Conv2D"], "flops": [1e7], "input_bytes": [1e5],
                        "output_bytes": [1e5]})
    assert 1e7 / 5e10 < p.op_times(mid)[0] - 1e-6 < 1e7 / 1e10
    # 1000 times the FLOPs at 10 times the rate: 100 times the work.
    work = p.op_times(m.iloc[[3, 5]]) - p.overhead
    assert work[1] / work[0] == pytest.approx(100)


def test_efficiency_curves_round_trip_and_bad_ones_are_named():
    p = calibrate.fit_cpu_preset(_measured(), costmodel.cpu_preset(2))
    again = costmodel.DevicePreset.from_dict(json.loads(json.dumps(p.to_dict())))
    assert again == p and hash(again) == hash(p)
    base = costmodel.cpu_preset(2)
    with pytest.raises(CostModelError, match="'elementwise'.*strictly increasing"):
        replace(base, efficiency_curves={"elementwise": [[3, 0.5], [3, 0.6]]})
    with pytest.raises(CostModelError, match="'matmul/fp32'.*outside"):
        replace(base, efficiency_curves={"matmul/fp32": [[3, 1.5]]})
    with pytest.raises(CostModelError, match="'relu'"):
        replace(base, efficiency_curves={"relu": [[3, 0.5]]})
    with pytest.raises(CostModelError, match="seconds"):
        calibrate.fit_cpu_preset(_measured().drop(columns="seconds"))


def test_cache_path_is_per_cpu_model_cores_and_tensorflow(cache, monkeypatch):
    from pathlib import Path

    here = calibrate.cache_path()
    assert here.parent == cache and here.name.startswith("cpu-") and here.suffix == ".json"
    key = calibrate.cpu_key()
    assert f"{key['cores']}cores" in here.name and f"tf{key['tensorflow']}" in here.name
    assert calibrate.cache_path({**key, "cores": key["cores"] + 1}) != here
    fake = Path(__file__).parent / "data" / "cpuinfo" / "avx2-2.0GHz"
    monkeypatch.setenv("FDDPS_CPUINFO", str(fake))
    assert calibrate.cache_path() != here  # another CPU model: another file
    monkeypatch.delenv("FDDPS_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache / "xdg"))
    assert calibrate.cache_dir() == cache / "xdg" / "fddps"


def test_calibrate_cpu_times_ops_writes_the_cache_and_reads_it_back(cache, tmp_path):
    messages = []
    out = tmp_path / "cm.json"
    p = costmodel.calibrate_cpu(seconds=0.5, ops=FEW_OPS, output=out, progress=messages.append)
    path = calibrate.cache_path()
    assert path.is_file() and str(path) in messages[-2] and str(out) in messages[-1]
    assert costmodel.cached_cpu_calibration() == p
    assert calibrate.load_cpu_calibration(out) == p
    data = json.loads(path.read_text())
    meta = data["meta"]
    assert meta["kind"] == "cpu calibration" and meta["cores"] == calibrate.cpu_key()["cores"]
    measured = pd.DataFrame(meta["measured"])
    assert list(measured.label) == [label for label, _, _ in FEW_OPS]
    assert (measured.seconds > 0).all() and (measured["rounds"] >= 3).all()
    # The time fitted is the geometric mean of the warm and the cold one (cold >= warm).
    assert (measured.cold_seconds >= measured.warm_seconds).all()
    assert np.allclose(measured.seconds, np.sqrt(measured.warm_seconds * measured.cold_seconds))
    assert (measured.chain >= 2).all()
    # FLOPs and bytes as place() counts them: 2mnk for a MatMul.
    assert measured.flops[measured.label == "mm large"].item() == 2 * 256 ** 3
    curves = dict(p.efficiency_curves)
    assert {"matmul/fp32", "elementwise", "reduction"} <= set(curves)
    # One point per size group: the two MatMuls are three decades apart, and so are the
    # element-wise ops (the tiny AddV2 and the two Relus).
    assert len(curves["matmul/fp32"]) == 2 and len(curves["elementwise"]) == 3
    # The saved file is a cost model the commands accept (--cost-model).
    cm = costmodel.CostModel.load(out)
    assert cm.devices["CPU"] == p and "GPU" in cm.devices


def test_calibrate_cpu_refuses_a_bad_budget_and_an_unknown_op(cache):
    from fddps.errors import FddpsError

    with pytest.raises(CostModelError, match="seconds > 0"):
        costmodel.calibrate_cpu(seconds=0)
    with pytest.raises(FddpsError, match="'Cholesky'"):
        costmodel.calibrate_cpu(seconds=0.1, ops=[("x", "Cholesky", {"shape": [4, 4]})], cache=False)
    assert not calibrate.cache_path().exists()


@pytest.fixture(scope="module")
def small_step():
    """A small two-layer training GraphDef and its fetches."""
    import tensorflow as tf

    v1 = tf.compat.v1
    g = tf.Graph()
    with g.as_default():
        x = tf.random.stateless_normal([64, 256], seed=[1, 2], name="x")
        w1 = v1.get_variable("w1", [256, 256], use_resource=True)
        w2 = v1.get_variable("w2", [256, 10], use_resource=True)
        loss = tf.reduce_mean(tf.square(tf.matmul(tf.nn.relu(tf.matmul(x, w1)), w2)), name="loss")
        v1.train.GradientDescentOptimizer(0.1).minimize(loss, name="train")
    return g.as_graph_def(), ["train", "loss"]


def test_place_uses_the_cached_calibration_and_says_so(cache, small_step):
    import fddps

    gd, fetches = small_step
    before = fddps.place(gd, ["/device:CPU:0"], fetches=fetches)
    assert before.info["cpu_calibration"] is None
    assert "analytic CPU preset; run `fddps calibrate`" in before.summary()
    preset = calibrate.fit_cpu_preset(_measured(), costmodel.cpu_preset(2))
    path = calibrate.save_cpu_calibration(preset, calibrate.cache_path())
    after = fddps.place(gd, ["/device:CPU:0"], fetches=fetches)
    assert after.info["cpu_calibration"] == str(path)
    assert f"CPU preset: calibrated on this machine ({path})" in after.summary()
    assert after.makespan != pytest.approx(before.makespan, rel=1e-3)
    # Same ops, other times: the calibrated preset's, not the analytic one's.
    cm = costmodel.default_cost_model()
    assert cm.devices["CPU"] == preset and cm.meta["cpu_calibration"] == str(path)
    assert costmodel.default_cost_model(calibrated=False).devices["CPU"] == costmodel.presets["cpu"]
    # A cost model given by the user is used as given: no calibration, no note.
    mine = fddps.place(gd, ["/device:CPU:0"], costmodel.CostModel({"CPU": "cpu"}), fetches=fetches)
    assert mine.info["cpu_calibration"] is None and "CPU preset" not in mine.summary()
    assert mine.makespan == pytest.approx(before.makespan)


def test_an_unreadable_cache_is_reported_and_ignored(cache, small_step):
    import fddps

    path = calibrate.cache_path()
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    with pytest.warns(RuntimeWarning, match="ignoring the CPU calibration cache.*fddps calibrate"):
        p = fddps.place(small_step[0], ["/device:CPU:0"], fetches=small_step[1])
    assert p.info["cpu_calibration"] is None and "analytic CPU preset" in p.summary()
    path.write_text(json.dumps(costmodel.default_cost_model(calibrated=False).to_dict()))
    with pytest.warns(RuntimeWarning, match="not a CPU calibration"):
        assert costmodel.cached_cpu_calibration() is None


def test_cli_calibrate_prints_the_fit_and_caches_it(cache, tmp_path, capsys, monkeypatch):
    from fddps.cli import main

    monkeypatch.setattr(calibrate, "CPU_CALIBRATION_OPS", FEW_OPS)
    assert main(["calibrate", "--seconds", "0.5"]) == 0
    text = capsys.readouterr().out
    path = calibrate.cache_path()
    assert path.is_file() and f"cached at {path}" in text
    assert "per-op overhead" in text and "matmul/fp32" in text and "GFLOP/s" in text
    assert "timing 6 ops" in text
    out = tmp_path / "cal.json"
    path.unlink()
    assert main(["calibrate", "--seconds", "0.5", "--no-cache", "--output", str(out)]) == 0
    assert not path.exists() and costmodel.CostModel.load(out).devices["CPU"].efficiency_curves
    assert main(["calibrate", "--no-cache"]) == 2
    assert "--no-cache without --output" in capsys.readouterr().err


def test_calibrate_experiment_smoke(cache, tmp_path, monkeypatch, capsys):
    """experiments/calibrate.py end to end, with a tiny op list and budget."""
    from experiments import calibrate as experiment

    monkeypatch.setattr(calibrate, "CPU_CALIBRATION_OPS", FEW_OPS)
    out = tmp_path / "calibrate.csv"
    assert experiment.main(["--repeats", "1", "--seconds", "0.3", "--steps", "2",
                            "--graphdefs", "vgg16", "--graphdef-batch", "1",
                            "--graphdef-steps", "1", "--out", str(out)]) == 0
    df = pd.read_csv(out)
    assert list(df.workload) == ["Keras quick start, batch 32", "vgg16 GraphDef, batch 1"]
    assert df.run.nunique() == 1
    assert (df[["predicted_before_ms", "predicted_after_ms", "measured_ms"]] > 0).all(axis=None)
    assert np.allclose(df.ratio_after, df.predicted_after_ms / df.measured_ms)
    assert df.summary_line.str.startswith("CPU preset: calibrated on this machine (").all()
    md = out.with_suffix(".md").read_text()
    assert "python -m experiments.calibrate --repeats 1" in md and "| median |" in md
    # The experiment's temporary cache is gone, and the test's own was never written.
    assert not calibrate.cache_path().exists()
