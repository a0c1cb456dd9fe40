"""The cost model without TensorFlow: presets, links, memory, fits on synthetic truth, files."""

import json
import math
import re
import subprocess
import sys
import warnings

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

import costmodel
from costmodel import (CostModel, CostModelError, LinkModel, OpTimeModel, Profile, ProfileError,
                       ProfileMismatchError, default_cost_model, fit_cost_model, iterated_mean,
                       presets)
from fddps.errors import FddpsError

W0 = "/job:worker/replica:0/task:0/device:CPU:0"
W1 = "/job:worker/replica:0/task:1/device:CPU:0"


def op_frame(n, op_type="Conv2D", seed=0, prefix="op"):
    """A synthetic op table with the columns fddps.tf.op_table provides."""
    rng = np.random.default_rng(seed)
    flops = rng.uniform(1e6, 5e9, n)
    inb = flops / rng.uniform(20, 200, n)
    outb = inb * rng.uniform(0.3, 1.0, n)
    return pd.DataFrame({"name": [f"{prefix}{i}" for i in range(n)], "op_type": op_type,
                         "flops": flops, "input_bytes": inb, "output_bytes": outb,
                         "param_bytes": 0.0, "shapes_known": True, "requested_device": "",
                         "colocation_group": None})


def truth(ops, latency=20e-6, per_flop=1 / 40e9, per_byte=1 / 8e9):
    return latency + ops["flops"] * per_flop + (ops["input_bytes"] + ops["output_bytes"]) * per_byte


# -- presets -----------------------------------------------------------------------------
def test_named_presets_exist_and_document_their_source():
    for name in ("p100", "v100", "a100", "h100", "cpu"):
        p = presets[name]
        assert isinstance(p, costmodel.DevicePreset) and p.source
        assert p.peak_flops > 0 and p.memory_bandwidth > 0 and p.memory > 0
    for name in ("pcie3", "pcie4", "nvlink", "10gbe", "100gbe", "grpc-loopback"):
        p = presets[name]
        assert isinstance(p, costmodel.LinkPreset) and p.source and p.bandwidth > 0
    # Newer GPUs are faster on a big MatMul; PCIe 4 beats PCIe 3, 100 GbE beats 10 GbE.
    mm = op_frame(1, "MatMul")
    t = [presets[g].op_times(mm)[0] for g in ("p100", "v100", "a100", "h100")]
    assert t == sorted(t, reverse=True)
    assert presets["pcie4"].bandwidth > presets["pcie3"].bandwidth
    assert presets["100gbe"].bandwidth > presets["10gbe"].bandwidth
    with pytest.raises(CostModelError, match="unknown preset 'tpu9'"):
        presets["tpu9"]


def test_roofline_no_work_ops_cost_only_the_overhead_and_work_grows_with_flops():
    p = presets["v100"]
    ops = pd.DataFrame({"op_type": ["Identity", "Reshape", "MatMul", "MatMul"],
                        "flops": [0, 0, 1e9, 2e9], "input_bytes": [4e8, 4e8, 1e6, 1e6],
                        "output_bytes": [4e8, 4e8, 1e6, 1e6]})
    t = p.op_times(ops)
    assert t[0] == t[1] == p.overhead
    assert t[3] > t[2] > p.overhead
    # The roofline alone (the preset's FP32 MatMuls go through its kernel model, whose
    # efficiency grows with the kernel): doubling FLOPs doubles the time above the overhead.
    roof = replace(p, kernel_model="")
    t = roof.op_times(ops)
    assert (t[3] - p.overhead) == pytest.approx(2 * (t[2] - p.overhead))


def test_calibration_recovers_known_efficiencies():
    base = presets["cpu"]
    rng = np.random.default_rng(1)
    big = op_frame(60, "Conv2D", seed=2)
    small = pd.DataFrame({"name": [f"id{i}" for i in range(20)], "op_type": "Identity", "flops": 0.0,
                          "input_bytes": 64.0, "output_bytes": 64.0})
    # Truth: a device reaching 30% of peak compute, 80% of memory bandwidth, 7 us per op.
    true = costmodel.DevicePreset("t", "CPU", base.peak_flops, base.memory_bandwidth, base.memory,
                                  overhead=7e-6, compute_efficiency=0.3, memory_efficiency=0.8)
    mem = pd.DataFrame({"name": [f"add{i}" for i in range(40)], "op_type": "AddV2",
                        "flops": rng.uniform(1e4, 1e5, 40), "input_bytes": rng.uniform(1e6, 1e8, 40)})
    mem["output_bytes"] = mem["input_bytes"] / 2
    measured = pd.concat([big, small, mem], ignore_index=True)
    measured["seconds"] = true.op_times(measured) * rng.uniform(0.97, 1.03, len(measured))
    cal = base.calibrate(measured)
    assert cal.overhead == pytest.approx(7e-6, rel=0.05)
    assert cal.compute_efficiency == pytest.approx(0.3, rel=0.1)
    assert cal.memory_efficiency == pytest.approx(0.8, rel=0.1)
    assert "calibrated on" in cal.source


# -- links -------------------------------------------------------------------------------
def test_links_follow_hosts_and_device_types():
    cm = default_cost_model()
    assert cm.link("/device:GPU:0", "/job:localhost/replica:0/task:0/device:GPU:0") == (0.0, math.inf)
    assert cm.transfer_time(1e9, "/gpu:1", "/device:GPU:1") == 0.0
    pcie, eth = presets["pcie3"], presets["10gbe"]
    assert cm.link("/device:GPU:0", "/device:GPU:3") == (pcie.latency, pcie.bandwidth)
    assert cm.link("/device:CPU:0", "/device:GPU:3") == (pcie.latency, pcie.bandwidth)
    # Different task = different host, whatever the device types.
    assert cm.link(W0, W1) == (eth.latency, eth.bandwidth)
    assert cm.link("/job:worker/task:0/device:GPU:0",
                   "/job:worker/task:1/device:GPU:0") == (eth.latency, eth.bandwidth)
    assert cm.transfer_time(1e6, W0, W1) == pytest.approx(eth.latency + 1e6 / eth.bandwidth)
    assert np.allclose(cm.transfer_time(np.array([0.0, 1e6]), W0, W1),
                       eth.latency + np.array([0.0, 1e6]) / eth.bandwidth)
    nv = default_cost_model(links={"same_host:GPU-GPU": "nvlink"})
    assert nv.link("/device:GPU:0", "/device:GPU:1")[1] == presets["nvlink"].bandwidth
    with pytest.raises(CostModelError, match="cannot read device name"):
        cm.link("/job:worker/task:x/device:CPU:0", W0)
    with pytest.raises(CostModelError, match="no device type"):
        cm.link("/job:worker/task:0", W0)


def test_cost_model_builds_a_cluster_with_its_links_and_capacities():
    cm = default_cost_model()
    names = ["/job:worker/task:0/device:GPU:0", "/job:worker/task:0/device:GPU:1",
             "/job:worker/task:1/device:GPU:0"]
    c = cm.cluster(names)
    assert c.latency[0, 1] == presets["pcie3"].latency
    assert c.bandwidth[0, 2] == presets["10gbe"].bandwidth
    assert c.devices[0].memory == presets["p100"].memory
    assert c.devices[0].host == c.devices[1].host != c.devices[2].host
    # GPUs' copy engines move tensors; CPU tasks spend their own time on it.
    assert not c.transfer_compute.any()
    cpus = cm.cluster([W0, W1, "/job:worker/replica:0/task:1/device:GPU:0"])
    assert cpus.transfer_compute.tolist() == [[0, 1, 0], [1, 0, 0], [0, 0, 0]]


def test_link_model_recovers_latency_and_bandwidth():
    rng = np.random.default_rng(3)
    sizes = np.repeat(np.logspace(0, 7.5, 12), 8)
    rows = []
    for src, dst, lat, bw in ((W0, W1, 4e-4, 1.2e9), (W1, W0, 2e-4, 0.9e9)):
        sec = (lat + sizes / bw) * rng.normal(1.0, 0.05, sizes.size)
        rows.append(pd.DataFrame({"src": src, "dst": dst, "bytes": sizes, "seconds": sec}))
    df = pd.concat(rows, ignore_index=True)
    df.loc[5, "seconds"] *= 20  # one disturbed transfer: the robust mean ignores it
    fit = LinkModel().fit(df).links_.set_index("src")
    assert fit.loc[W0, "latency"] == pytest.approx(4e-4, rel=0.2)
    assert fit.loc[W0, "bandwidth"] == pytest.approx(1.2e9, rel=0.05)
    assert fit.loc[W1, "bandwidth"] == pytest.approx(0.9e9, rel=0.05)
    assert (fit["r2"] > 0.99).all()
    cm = fit_cost_model(transfers=df)
    lat, bw = cm.link(W0, W1)
    assert bw == pytest.approx(1.2e9, rel=0.05)
    # A measured pair wins over the rules; pairs not measured keep them.
    assert cm.link("/job:worker/task:2/device:CPU:0", W0) == (presets["10gbe"].latency,
                                                             presets["10gbe"].bandwidth)
    with pytest.raises(CostModelError, match="at least 2 sizes"):
        LinkModel().fit(df[df["bytes"] == df["bytes"].iloc[0]])


# -- op times ------------------------------------------------------------------------------
@pytest.mark.reads_cpu
def test_op_time_regression_predicts_held_out_ops_of_known_truth():
    """Per-type linear truth with 5% noise: held-out ops predicted within 10% (median) / 25% (max)."""
    rng = np.random.default_rng(4)
    conv = op_frame(120, "Conv2D", seed=5)
    add = op_frame(80, "AddV2", seed=6, prefix="add")
    add["flops"] /= 100
    ops = pd.concat([conv, add], ignore_index=True)
    t_true = np.where(ops["op_type"] == "Conv2D", truth(ops), truth(ops, 5e-6, 0.0, 1 / 3e9))
    measured = ops.assign(seconds=t_true * rng.normal(1.0, 0.05, len(ops)), status="timed",
                          device_type="CPU")
    train = rng.random(len(ops)) < 0.7
    cm = fit_cost_model(measured[train])
    held = ops[~train].assign(name=lambda d: "new_" + d["name"])  # never profiled by name
    pred = cm.op_times(held, "CPU")
    rel = np.abs(pred - t_true[~train]) / t_true[~train]
    assert np.median(rel) < 0.10 and rel.max() < 0.25
    assert cm.last_report.counts == {"regression": int((~train).sum())}


@pytest.mark.reads_cpu
def test_profiled_op_keeps_its_time_and_scales_to_another_batch_size():
    """A per-op efficiency the type's fit cannot see is carried from one batch size to another."""
    rng = np.random.default_rng(7)
    ops8 = op_frame(100, "Conv2D", seed=8)
    quirk = rng.uniform(0.5, 2.0, len(ops8))          # each op's own efficiency
    t8 = truth(ops8).to_numpy() * quirk
    measured = ops8.assign(seconds=t8, status="timed", device_type="CPU")
    cm = fit_cost_model(measured)
    assert np.array_equal(cm.op_times(ops8, "CPU"), t8)
    assert cm.last_report.counts == {"profile": 100}
    ops16 = ops8.assign(flops=ops8["flops"] * 2, input_bytes=ops8["input_bytes"] * 2,
                        output_bytes=ops8["output_bytes"] * 2)
    t16 = truth(ops16).to_numpy() * quirk
    pred = cm.op_times(ops16, "CPU")
    assert cm.last_report.counts == {"profile-scaled": 100}
    rel = np.abs(pred - t16) / t16
    assert np.median(rel) < 0.05
    # Without the per-op profile (regression alone) the quirk is lost.
    alone = cm.op_times(ops16.assign(name="other_" + ops16["name"]), "CPU")
    assert np.median(np.abs(alone - t16) / t16) > 3 * np.median(rel)


@pytest.mark.reads_cpu
def test_scaling_to_another_batch_ignores_bytes_that_do_not_grow_with_it():
    """TF's CPU Conv2DBackpropInput on tiny maps: time tracks the (constant) filter
    bytes across ops, yet each op's time doubles with the batch. The type's fit
    credits the filter bytes; scaling by it would keep batch 16 at batch 8's times."""
    rng = np.random.default_rng(3)
    n = 40
    filt = rng.uniform(1e5, 1e7, n)                   # filter bytes: same at every batch
    act_per_image = 2e4 * rng.uniform(0.5, 2.0, n)    # activation bytes per image

    def ops(batch):
        act = act_per_image * batch
        return pd.DataFrame({"name": [f"bpi{i}" for i in range(n)], "op_type": "Conv2DBackpropInput",
                             "flops": act * 50, "input_bytes": filt + act, "output_bytes": act})

    ops8, ops16 = ops(8), ops(16)
    t8 = 5e-6 + filt * 1e-9 * 8           # proportional to filter bytes and to the batch
    t16 = 5e-6 + filt * 1e-9 * 16
    cm = fit_cost_model(ops8.assign(seconds=t8, status="timed", device_type="CPU"))
    pred = cm.op_times(ops16, "CPU")
    assert cm.last_report.counts == {"profile-scaled": n}
    assert abs(pred.sum() / t16.sum() - 1) < 0.02
    assert np.median(np.abs(pred - t16) / t16) < 0.02


@pytest.mark.reads_cpu
def test_pruned_ops_stay_zero_and_unseen_types_fall_back_counted(recwarn):
    ops = op_frame(30, "Conv2D", seed=9)
    measured = ops.assign(seconds=truth(ops), status="timed", device_type="CPU")
    pruned = pd.DataFrame({"name": ["folded"], "op_type": ["Mul"], "flops": [10.0],
                           "input_bytes": [8.0], "output_bytes": [4.0], "seconds": [0.0],
                           "status": ["pruned"], "device_type": ["CPU"]})
    cm = fit_cost_model(pd.concat([measured, pruned], ignore_index=True))
    new = pd.DataFrame({"name": ["folded", "sm1", "sm2"], "op_type": ["Mul", "Softmax", "Softmax"],
                        "flops": [10.0, 1e6, 2e6], "input_bytes": [8.0, 4e5, 8e5],
                        "output_bytes": [4.0, 4e5, 8e5]})
    with pytest.warns(costmodel.ProfileCoverageWarning, match="2 of 3 ops"):
        t = cm.op_times(new, "CPU")
    assert t[0] == 0.0
    assert np.all(t[1:] > 0) and t[2] > t[1]     # estimated, never silently zero
    rep = cm.last_report
    assert rep.counts == {"profile": 1, "fallback": 2} and rep.fallback_ops == ["sm1", "sm2"]
    # The fallback is the preset calibrated on the profile.
    assert np.allclose(t[1:], cm.compute["CPU"].calibrated_.op_times(new.iloc[1:]))
    # GPU was never profiled: the analytic preset answers, counted as such.
    cm.op_times(new, "GPU")
    assert cm.last_report.counts == {"analytic": 3}


@pytest.mark.reads_cpu
def test_op_times_reject_unknown_device_types_and_missing_columns():
    cm = default_cost_model()
    ops = op_frame(3)
    with pytest.raises(CostModelError, match="knows no device type 'TPU'"):
        cm.op_times(ops, "TPU")
    with pytest.raises(CostModelError, match="no column 'flops'"):
        cm.op_times(ops.drop(columns=["flops"]), "CPU")
    with pytest.raises(CostModelError, match="op 'op1' has an invalid measured time"):
        fit_cost_model(ops.assign(seconds=[1e-3, -1.0, 1e-3], status="timed", device_type="CPU"))


def test_iterated_mean_ignores_outliers():
    x = np.array([[1.0, 1.02, 0.98, 1.01, 25.0], [2.0, 2.0, np.nan, 2.0, 2.0], [np.nan] * 5])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mean, std, kept = iterated_mean(x)
    assert mean[0] == pytest.approx(1.0025) and kept[0] == 4
    assert mean[1] == 2.0 and kept[1] == 4
    assert np.isnan(mean[2]) and kept[2] == 0


# -- memory ------------------------------------------------------------------------------
@pytest.mark.reads_cpu
def test_memory_defaults_to_params_and_outputs_and_scales_measured_transients():
    ops = op_frame(3)
    ops["param_bytes"] = [100.0, 0.0, 0.0]
    cm = default_cost_model()
    persistent, transient = cm.memory(ops)
    assert np.array_equal(persistent, [100.0, 0.0, 0.0])
    assert np.array_equal(transient, ops["output_bytes"].to_numpy())
    measured = ops.assign(seconds=1e-3, status="timed", device_type="CPU",
                          transient_bytes=[np.nan, 3 * ops["output_bytes"][1], 0.0])
    fitted = fit_cost_model(measured)
    _, t = fitted.memory(ops)
    assert t[1] == pytest.approx(3 * ops["output_bytes"][1])      # outputs + temporaries
    assert t[0] == ops["output_bytes"][0] and t[2] == ops["output_bytes"][2]
    _, t2 = fitted.memory(ops.assign(output_bytes=ops["output_bytes"] * 2))
    assert t2[1] == pytest.approx(6 * ops["output_bytes"][1])     # batch doubled
    assert default_cost_model().device_memory("GPU") == presets["p100"].memory
    with pytest.raises(CostModelError, match="param_bytes"):
        cm.memory(ops.drop(columns=["param_bytes"]))


# -- files -------------------------------------------------------------------------------
def fitted_model():
    rng = np.random.default_rng(10)
    ops = pd.concat([op_frame(40, "Conv2D", seed=11), op_frame(3, "Tile", seed=12, prefix="t")],
                    ignore_index=True)
    measured = ops.assign(seconds=truth(ops) * rng.uniform(0.9, 1.1, len(ops)), status="timed",
                          device_type="CPU", transient_bytes=ops["output_bytes"] * 1.5)
    sizes = np.logspace(0, 7, 8)
    transfers = pd.DataFrame({"src": W0, "dst": W1, "bytes": sizes, "seconds": 3e-4 + sizes / 1e9})
    return ops, fit_cost_model(measured, transfers=transfers,
                               graph=costmodel.graph_fingerprint(ops), meta={"note": "test"})


@pytest.mark.reads_cpu
def test_save_load_round_trips_exactly(tmp_path):
    ops, cm = fitted_model()
    for model in (default_cost_model(), cm):
        path = model.save(tmp_path / "model.json")
        json.loads(path.read_text())          # plain JSON, human-readable
        back = CostModel.load(path, ops=ops)
        assert back == model and back.to_dict() == model.to_dict()
        for dtype in ("CPU", "GPU"):
            assert np.array_equal(back.op_times(ops, dtype), model.op_times(ops, dtype))
        assert back.link(W0, W1) == model.link(W0, W1)
        assert all(np.array_equal(a, b) for a, b in zip(back.memory(ops), model.memory(ops)))
    assert '"kind": "linear"' in path.read_text()


@pytest.mark.reads_cpu
def test_corrupt_or_foreign_files_get_a_clear_error_naming_the_file(tmp_path):
    ops, cm = fitted_model()
    path = cm.save(tmp_path / "model.json")
    truncated = tmp_path / "truncated.json"
    truncated.write_text(path.read_text()[:500])
    with pytest.raises(ProfileError, match="truncated.json.*not valid JSON") as err:
        CostModel.load(truncated)
    assert isinstance(err.value, FddpsError) and err.value.path.endswith("truncated.json")
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"hello": 1}))
    with pytest.raises(ProfileError, match="other.json.*not an fddps cost model"):
        CostModel.load(other)
    broken = json.loads(path.read_text())
    del broken["devices"]["CPU"]["peak_flops"]
    bad = tmp_path / "broken.json"
    bad.write_text(json.dumps(broken))
    with pytest.raises(ProfileError, match="broken.json.*corrupt"):
        CostModel.load(bad)
    with pytest.raises(ProfileError, match="missing.json"):
        CostModel.load(tmp_path / "missing.json")
    another_graph = op_frame(40, "MatMul", seed=13, prefix="mm")
    with pytest.raises(ProfileMismatchError, match="model.json.*another graph.*'mm0'"):
        CostModel.load(path, ops=another_graph)


def test_profile_files_round_trip_and_reject_other_graphs(tmp_path):
    ops = op_frame(5)
    prof = Profile(pd.DataFrame({"name": ops["name"], "op_type": "Conv2D",
                                 "status": ["timed"] * 4 + ["pruned"],
                                 "seconds": [1e-3, 2e-3, 3e-3, 4e-3, 0.0],
                                 "transient_bytes": [1.0, np.nan, 3.0, 4.0, np.nan]}),
                   meta={"device_type": "CPU", "steps": 3})
    back = Profile.load(prof.save(tmp_path / "p.json"))
    pd.testing.assert_frame_equal(back.ops, prof.ops)
    assert back.meta == prof.meta and back.coverage == 0.8
    joined = back.join(ops)
    assert list(joined["seconds"]) == [1e-3, 2e-3, 3e-3, 4e-3, 0.0]
    with pytest.raises(ProfileMismatchError, match="another graph"):
        back.join(op_frame(5, prefix="x"))
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ProfileError, match="bad.json"):
        Profile.load(tmp_path / "bad.json")


def test_costmodel_does_not_import_tensorflow():
    code = "import sys, costmodel; costmodel.default_cost_model(); assert 'tensorflow' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_cpu_preset_reads_a_faked_cpuinfo(monkeypatch, tmp_path):
    from conftest import CPUS
    from costmodel.hardware import cpu_preset

    monkeypatch.setenv("FDDPS_CPUINFO", str(CPUS["avx2-2.0GHz"]))
    avx2 = cpu_preset(2)
    assert avx2.peak_flops == 2 * 2.0e9 * 32 and "E5-2683 v4" in avx2.source
    assert presets["cpu"].source.startswith("FDDPS_CPUINFO=")   # the named presets follow it
    monkeypatch.setenv("FDDPS_CPUINFO", str(CPUS["avx512-3.5GHz"]))
    assert cpu_preset(2).peak_flops == 2 * 3.5e9 * 64          # clock from 'cpu MHz'
    assert presets["cpu"].peak_flops == cpu_preset().peak_flops
    monkeypatch.setenv("FDDPS_CPUINFO", str(tmp_path / "missing"))
    with pytest.raises(CostModelError, match="FDDPS_CPUINFO=.*missing.*cannot be read"):
        cpu_preset()
    monkeypatch.delenv("FDDPS_CPUINFO")
    assert presets["cpu"].source.startswith("this machine")


@pytest.mark.reads_cpu
def test_a_part_of_a_profiled_op_scales_that_ops_measurement():
    """A part of a split op (its row names the op in ``profile_name``) gets the op's
    measurement scaled by its work, not the type's fit: two halves cost the
    whole plus the type's fixed cost, never less than the measured whole."""
    ops = op_frame(40, "Conv2D", seed=5)
    slow = truth(ops).to_numpy() * 4.0               # every op 4x slower than its type's fit
    slow[0] *= 3.0                                   # and op0 much slower again
    cm = fit_cost_model(ops.assign(seconds=slow, status="timed", device_type="CPU"))
    op0 = ops.iloc[0]
    half = pd.DataFrame([dict(op0, name=f"{op0['name']}/part_{j}", profile_name=op0["name"],
                              flops=op0["flops"] / 2, input_bytes=op0["input_bytes"] / 2,
                              output_bytes=op0["output_bytes"] / 2) for j in range(2)])
    parts = cm.op_times(half, "CPU")
    assert cm.last_report.counts == {"profile-scaled": 2}
    assert parts.sum() >= slow[0] and parts.sum() < 1.1 * slow[0]
    # The same rows without the link are costed by the type's fit, far below the measurement.
    fit = cm.op_times(half.drop(columns="profile_name"), "CPU")
    assert cm.last_report.counts == {"regression": 2}
    assert fit.sum() < 0.5 * slow[0]


def test_a_few_ops_ratio_to_the_preset_holds_near_their_size_and_fades_a_decade_beyond():
    """A type timed on too few ops for a fit gets its measured/preset ratio; the
    ratio says nothing about ops 100x larger (RATIO_REACH decades beyond: the
    calibrated preset alone), and half of it, in log, half a decade beyond."""
    moved = np.geomspace(1e4, 1e8, 60)
    relu = pd.DataFrame({"name": [f"r{i}" for i in range(moved.size)], "op_type": "Relu",
                         "flops": 0.0, "input_bytes": moved / 2, "output_bytes": moved / 2})
    relu["seconds"] = 1e-6 + moved / 10e9
    sizes = np.array([1e5, 1.2e5, 1.5e5])
    few = pd.DataFrame({"name": [f"s{i}" for i in range(3)], "op_type": "Slice", "flops": 0.0,
                        "input_bytes": sizes * 2 / 3, "output_bytes": sizes / 3,
                        "seconds": 3 * (1e-6 + sizes / 10e9)})
    model = OpTimeModel(presets["cpu"], size_curves=True).fit(
        pd.concat([relu, few], ignore_index=True).assign(status="timed"))
    fitted = model.type_models_["Slice"]
    assert fitted["kind"] == "ratio" and fitted["sizes"] == pytest.approx(np.log10([1e5, 1.5e5]))
    ratio = fitted["ratio"]
    assert 2.5 < ratio < 3.5
    probe = pd.DataFrame({"name": ["in", "half", "far"], "op_type": "Slice", "flops": 0.0,
                          "input_bytes": np.array([1.2e5, 1.5e5 * 10 ** 0.5, 1.5e7]) * 2 / 3})
    probe["output_bytes"] = probe["input_bytes"] / 2
    t = model.predict(probe)
    preset = model.calibrated_.op_times(probe)
    assert t == pytest.approx(preset * np.array([ratio, ratio ** 0.5, 1.0]))


def test_size_curves_price_an_op_type_never_profiled_at_its_own_size():
    """Many small elementwise ops stream at 2 GB/s, a few large ones at 20 GB/s: with
    size curves (what fit_cost_model does for CPUs) an unprofiled 20 MB
    ConcatV2 costs what large ops cost, not the small ops' median."""
    rng = np.random.default_rng(3)
    small = 10 ** rng.uniform(4, 5, 200)
    large = 10 ** rng.uniform(6, 7, 20)
    moved = np.concatenate([small, large])
    relu = pd.DataFrame({"name": [f"r{i}" for i in range(moved.size)], "op_type": "Relu",
                         "flops": 0.0, "input_bytes": moved / 2, "output_bytes": moved / 2,
                         "status": "timed", "device_type": "CPU"})
    relu["seconds"] = 2e-6 + moved / np.where(moved < 1e6, 2e9, 20e9)
    concat = pd.DataFrame({"name": ["c"], "op_type": ["ConcatV2"], "flops": [0.0],
                           "input_bytes": [1e7], "output_bytes": [1e7]})
    expected = 2e-6 + 2e7 / 20e9
    cm = fit_cost_model(relu)
    assert cm.compute["CPU"].size_curves
    with pytest.warns(costmodel.ProfileCoverageWarning):
        curved = float(cm.op_times(concat, "CPU")[0])
    assert curved == pytest.approx(expected, rel=0.2)
    flat = OpTimeModel(cm.compute["CPU"].preset).fit(relu)
    assert float(flat.predict(concat)[0]) > 3 * expected
    # The preset says what timed its ops, with no date: one profile fits one preset.
    source = cm.compute["CPU"].calibrated_.source
    assert "220 ops timed by the profile" in source
    assert re.search(r"\d{4}-\d\d-\d\d", source) is None
    again = OpTimeModel(cm.compute["CPU"].preset, size_curves=True).fit(relu)
    assert again.calibrated_ == cm.compute["CPU"].calibrated_


def test_a_measurement_is_matched_by_name_and_type():
    """A row with a profiled op's name but another type is another op: a rewritten
    graph keeps a split op's name on the IdentityN that gathers its parts, which
    must not cost the measured convolution."""
    ops = op_frame(40, "Conv2D", seed=5)
    slow = truth(ops).to_numpy() * 4.0
    cm = fit_cost_model(ops.assign(seconds=slow, status="timed", device_type="CPU"))
    op0 = ops.iloc[0]
    same = pd.DataFrame([dict(op0)])
    assert cm.op_times(same, "CPU")[0] == pytest.approx(slow[0])
    assert cm.last_report.counts == {"profile": 1}
    gather = pd.DataFrame([dict(op0, op_type="IdentityN", flops=0.0)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", costmodel.ProfileCoverageWarning)
        cm.op_times(gather, "CPU")
    assert set(cm.last_report.counts) <= {"regression", "fallback"}


def test_times_read_names_is_true_exactly_where_renaming_a_row_can_change_its_time():
    # A profile matches ops by name (renamed rows fall back to the fit); a preset times
    # rows by their other columns. Callers cost rows alike but for names once on its word.
    ops = op_frame(20, "Conv2D", seed=3)
    measured = ops.assign(seconds=truth(ops).to_numpy() * np.linspace(0.5, 2.0, len(ops)),
                          status="timed", device_type="CPU")
    profiled = fit_cost_model(measured)
    renamed = ops.assign(name="other_" + ops["name"])
    assert profiled.times_read_names("CPU") and profiled.times_read_names("cpu")
    assert not np.array_equal(profiled.op_times(ops, "CPU"), profiled.op_times(renamed, "CPU"))
    preset = costmodel.default_cost_model("p100")
    assert not preset.times_read_names("GPU")
    assert np.array_equal(preset.op_times(ops, "GPU"), preset.op_times(renamed, "GPU"))
    with pytest.raises(CostModelError, match="TPU"):
        preset.times_read_names("TPU")
