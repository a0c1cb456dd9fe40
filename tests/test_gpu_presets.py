"""GPU presets: op classes, TF32/FP32, the K80, and the fit to the committed kernel table."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

import costmodel
from costmodel import CostModelError, DevicePreset, presets
from costmodel import hardware, kernels


def conv_ops(op_type="Conv2D", flops=(1e11, 2e11, 4e11)):
    return pd.DataFrame({"op_type": op_type, "flops": list(flops), "input_bytes": 1e6,
                         "output_bytes": 1e6})


# -- op classes and precision ---------------------------------------------------------------
def test_op_classes():
    assert hardware.op_class("Conv2D") == "conv_forward"
    assert hardware.op_class("Conv2DBackpropInput") == "conv_input_grad"
    assert hardware.op_class("Conv2DBackpropFilter") == "conv_filter_grad"
    assert hardware.op_class("BatchMatMulV2") == "matmul"
    assert hardware.op_class("FusedBatchNormGradV3") == "reduction"
    assert hardware.op_class("Relu") == hardware.op_class("ApplyAdam") == "elementwise"
    assert hardware.op_class("Identity") == "no_work"


def test_tf32_is_the_default_where_there_are_tensor_cores_and_fp32_can_be_chosen():
    h100, fp32 = presets["h100"], presets["h100:fp32"]
    assert h100.precision == "tf32" and fp32.precision == "fp32" and fp32.name == "h100:fp32"
    assert fp32 == h100.with_precision("fp32") and fp32.with_precision("tf32") == h100
    assert presets["p100"].precision == presets["k80"].precision == "fp32"
    # The roofline alone (the named preset's FP32 convolutions go through the kernel model,
    # tests/test_gpu_kernel_model.py).
    cm_fp32 = costmodel.default_cost_model(gpu="h100:fp32")
    np.testing.assert_allclose(cm_fp32.op_times(conv_ops(), "GPU"), fp32.op_times(conv_ops()))
    h100 = hardware._DATASHEET_PRESETS["h100"]
    fp32 = h100.with_precision("fp32")
    ops = conv_ops()
    # Compute bound: TF32 runs at the tensor peak, FP32 at the FP32 peak (both at 60%).
    t32 = h100.op_times(ops) - h100.overhead
    f32 = fp32.op_times(ops) - fp32.overhead
    np.testing.assert_allclose(t32, ops.flops / (h100.tensor_flops * 0.6))
    np.testing.assert_allclose(f32, ops.flops / (h100.peak_flops * 0.6))
    # Element-wise ops do not change with the precision.
    relu = conv_ops("Relu", flops=(1e6,))
    assert h100.op_times(relu)[0] == fp32.op_times(relu)[0]
    with pytest.raises(CostModelError, match="'p100' has no TF32 tensor cores"):
        presets["p100"].with_precision("tf32")
    with pytest.raises(CostModelError, match="precision must be one of"):
        presets["h100"].with_precision("fp16")


def test_k80_is_one_gk210():
    k80 = presets["k80"]
    assert (k80.peak_flops, k80.memory_bandwidth, k80.memory) == (4.37e12, 240e9, 12e9)
    assert k80.tensor_flops == 0 and "GK210" in k80.source and "Tofu" in k80.source
    ops = conv_ops()
    assert (k80.op_times(ops) > presets["p100"].op_times(ops)).all()


def test_class_efficiencies_apply_to_their_class_and_precision_only():
    base = hardware._DATASHEET_PRESETS["h100"]  # the roofline alone
    p = DevicePreset(**{**base.to_dict(), "efficiencies": {
        "conv_forward/tf32": 0.25, "conv_forward/fp32": 0.75, "elementwise": 0.9}})
    fwd, grad = conv_ops("Conv2D"), conv_ops("Conv2DBackpropInput")
    np.testing.assert_allclose(p.op_times(fwd) - p.overhead, fwd.flops / (base.tensor_flops * 0.25))
    np.testing.assert_allclose(p.with_precision("fp32").op_times(fwd) - p.overhead,
                               fwd.flops / (base.peak_flops * 0.75))
    np.testing.assert_allclose(p.op_times(grad), base.op_times(grad))  # no entry: 0.6
    copy = pd.DataFrame({"op_type": ["AddV2"], "flops": [1e3], "input_bytes": [2e9],
                         "output_bytes": [1e9]})
    assert p.op_times(copy)[0] - p.overhead == pytest.approx(3e9 / (base.memory_bandwidth * 0.9))
    assert p.efficiency("conv_input_grad", "tf32") == base.compute_efficiency
    with pytest.raises(CostModelError, match="efficiency key 'conv_forward'"):
        DevicePreset(**{**base.to_dict(), "efficiencies": {"conv_forward": 0.5}})
    with pytest.raises(CostModelError, match="must be in \\(0, 1\\]"):
        DevicePreset(**{**base.to_dict(), "efficiencies": {"matmul/tf32": 1.5}})


def test_saved_presets_round_trip_and_old_files_keep_their_meaning(tmp_path):
    p = DevicePreset(**{**presets["a100"].to_dict(), "efficiencies": {"matmul/tf32": 0.4},
                        "precision": "fp32"})
    d = json.loads(json.dumps(p.to_dict()))
    assert DevicePreset.from_dict(d) == p
    # A cost model saved before precision and efficiencies existed: TF32 as it was.
    old = {k: v for k, v in presets["a100"].to_dict().items() if k not in ("precision", "efficiencies")}
    restored = DevicePreset.from_dict(old)
    assert restored.precision == "tf32" and restored.efficiencies == ()
    ops = conv_ops("MatMul")
    np.testing.assert_allclose(restored.op_times(ops) - restored.overhead,
                               ops.flops / (restored.tensor_flops * restored.compute_efficiency))
    cm = costmodel.default_cost_model(gpu=p)
    path = cm.save(tmp_path / "cm.json")
    assert costmodel.CostModel.load(path).devices["GPU"] == p


def test_calibrate_fits_each_class():
    base = hardware._DATASHEET_PRESETS["v100"]  # the roofline alone
    true = DevicePreset(**{**base.to_dict(), "overhead": 8e-6, "efficiencies": {
        "conv_forward/fp32": 0.7, "conv_filter_grad/fp32": 0.35, "matmul/fp32": 0.8}})
    rng = np.random.default_rng(3)
    parts = [pd.DataFrame({"op_type": t, "flops": rng.uniform(1e10, 1e11, 12),
                           "input_bytes": 1e6, "output_bytes": 1e6})
             for t in ("Conv2D", "Conv2DBackpropFilter", "MatMul")]
    parts.append(pd.DataFrame({"op_type": "Identity", "flops": 0.0, "input_bytes": [4.0] * 5,
                               "output_bytes": 4.0}))
    measured = pd.concat(parts, ignore_index=True)
    measured["seconds"] = true.op_times(measured)
    cal = base.calibrate(measured)
    assert cal.overhead == pytest.approx(8e-6)
    for key, eff in (("conv_forward/fp32", 0.7), ("conv_filter_grad/fp32", 0.35),
                     ("matmul/fp32", 0.8)):
        assert dict(cal.efficiencies)[key] == pytest.approx(eff, rel=1e-6)


# -- the kernel table and the fit -----------------------------------------------------------
def test_presets_are_the_fit_of_the_committed_kernel_table():
    """Re-fit every GPU of costmodel/data/gpu_kernels.csv and compare with the named presets."""
    table = kernels.load_kernel_table()
    assert len(table) >= 3 and table.source.str.len().min() > 20  # every row says where it is from
    for name, datasheet in hardware._DATASHEET_PRESETS.items():
        fitted = kernels.fit_efficiencies(table, datasheet)
        assert dict(presets[name].efficiencies) == pytest.approx(fitted, abs=1e-3), name
        assert set(fitted) <= {k for k, _ in presets[name].efficiencies} | set(fitted)
    # Every GPU of the table is a preset; the fitted presets are nowhere worse than the datasheet's.
    for gpu in set(table.gpu):
        s = kernels.error_summary(table, {"before": hardware._DATASHEET_PRESETS[gpu],
                                          "after": presets[gpu]}).set_index(
            ["preset", "op_class", "precision"]).median_abs_error
        assert (s["after"] <= s["before"] + 1e-12).all(), gpu
    assert dict(presets["v100"].efficiencies)  # DeepBench's V100 rows are enough to fit some


def _synthetic_table(truth: DevicePreset, path):
    """Kernel rows timed by a known preset (what a GPU would measure if the model were exact)."""
    shapes = {
        "conv_forward": ["N=64 C=64 H=56 W=56 K=64 R=3 S=3 stride=1 pad=1",
                         "N=64 C=256 H=56 W=56 K=64 R=1 S=1 stride=1 pad=0",
                         "N=64 C=512 H=28 W=28 K=128 R=1 S=1 stride=1 pad=0"],
        "conv_filter_grad": ["N=64 C=64 H=56 W=56 K=64 R=3 S=3 stride=1 pad=1",
                             "N=64 C=128 H=28 W=28 K=128 R=3 S=3 stride=1 pad=1",
                             "N=64 C=256 H=14 W=14 K=256 R=3 S=3 stride=1 pad=1"],
        "matmul": ["M=64 N=1000 K=2048", "M=4096 N=4096 K=4096", "M=64 N=4096 K=25088"],
        "elementwise": ["bytes=100000000", "bytes=400000000", "bytes=25000000"],
    }
    rows = []
    for precision in ("tf32", "fp32"):
        for cls, ss in shapes.items():
            if cls == "elementwise" and precision == "tf32":
                continue
            for s in ss:
                f = pd.DataFrame([kernels.kernel_features(cls, s)])
                t = truth.with_precision(precision).op_times(f)[0] - truth.overhead  # the kernel alone
                rows.append(dict(gpu=truth.name, op_class=cls, shape=s, precision=precision,
                                 seconds=t, source="synthetic: timed by a known preset"))
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def test_fit_recovers_known_efficiencies_per_class_and_precision(tmp_path):
    truth_eff = {"conv_forward/tf32": 0.26, "conv_forward/fp32": 0.74, "conv_filter_grad/tf32": 0.18,
                 "conv_filter_grad/fp32": 0.55, "matmul/tf32": 0.5, "matmul/fp32": 0.85,
                 "elementwise": 0.8}
    truth = DevicePreset(**{**hardware._DATASHEET_PRESETS["h100"].to_dict(), "efficiencies": truth_eff})
    table = kernels.load_kernel_table(_synthetic_table(truth, tmp_path / "k.csv"))
    fitted = kernels.fit_efficiencies(table, hardware._DATASHEET_PRESETS["h100"])
    assert fitted == pytest.approx(truth_eff, rel=0.02)
    # Fewer kernels than the threshold: the class is left out.
    assert kernels.fit_efficiencies(table.iloc[:2], "h100") == {}
    # The datasheet preset's errors before, the fitted one's after.
    after = DevicePreset(**{**hardware._DATASHEET_PRESETS["h100"].to_dict(), "efficiencies": fitted})
    s = kernels.error_summary(table, {"before": hardware._DATASHEET_PRESETS["h100"], "after": after})
    assert (s[s.preset == "after"].median_abs_error < 0.02).all()
    assert (s[s.preset == "before"].median_abs_error > 0).any()
    # The compute-bound 3x3 convolution: the datasheet preset (60% of TF32) is 2.3x too fast.
    e = kernels.prediction_errors(table, hardware._DATASHEET_PRESETS["h100"])
    row = e[(e.op_class == "conv_forward") & (e.precision == "tf32") & e["shape"].str.contains("R=3")]
    assert row.ratio.iloc[0] == pytest.approx(0.26 / 0.6, rel=1e-6)


def test_bad_kernel_tables_name_the_row(tmp_path):
    good = "gpu,op_class,shape,precision,seconds,source\n"
    cases = {"p100,convolution,M=1 N=1 K=1,fp32,1e-3,x\n": "row 2: unknown op class 'convolution'",
             "p100,matmul,M=1 N=1,fp32,1e-3,x\n": "row 2: kernel shape 'M=1 N=1' of a matmul row lacks",
             "p100,matmul,M=1 N=1 K=1,fp16,1e-3,x\n": "row 2: precision 'fp16'",
             "p100,matmul,M=1 N=1 K=1,fp32,0,x\n": "row 2: seconds must be > 0"}
    for k, (row, message) in enumerate(cases.items()):
        path = tmp_path / f"t{k}.csv"
        path.write_text(good + row)
        with pytest.raises(CostModelError, match=message.replace("(", "\\(")):
            kernels.load_kernel_table(path)
    (tmp_path / "nosrc.csv").write_text("gpu,op_class,shape,precision,seconds\n")
    with pytest.raises(CostModelError, match="no column 'source'"):
        kernels.load_kernel_table(tmp_path / "nosrc.csv")


# -- experiments/gpu_kernels.py ------------------------------------------------------------
def test_committed_conv_layers_parse_and_cover_the_three_models():
    from experiments import gpu_kernels

    layers = gpu_kernels.conv_layers()
    assert set(layers.model) == {"resnet50", "vgg16", "inception_v3"}
    # ResNet-50: 49 + 4 shortcut convolutions; VGG-16: 13; Inception-V3: 94 + 2 in the aux head.
    assert layers.groupby("model")["count"].sum().to_dict() == {"inception_v3": 96, "resnet50": 53,
                                                                "vgg16": 13}
    assert layers["first"].sum() == 3  # one per model reads the images
    for cls in gpu_kernels.CONV_CLASSES:
        f = pd.DataFrame([kernels.kernel_features(cls, s) for s in layers["shape"]])
        assert (f.flops > 0).all() and (f.input_bytes > 0).all()
    assert all(s.startswith("N=64 ") for s in layers["shape"])


def test_gpu_kernels_says_clearly_when_there_is_no_torch_or_gpu(monkeypatch):
    import sys
    import types

    from experiments import gpu_kernels

    monkeypatch.setitem(sys.modules, "torch", None)  # import torch fails
    with pytest.raises(SystemExit, match="needs PyTorch with CUDA"):
        gpu_kernels.main(["--repeats", "1"])
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(is_available=lambda: False))
    monkeypatch.setitem(sys.modules, "torch", fake)
    with pytest.raises(SystemExit, match="sees no CUDA GPU"):
        gpu_kernels.main([])


def test_gpu_kernels_report_before_and_after_per_model(tmp_path):
    """Layers 'measured' by a known H100 (TF32 convs at 26%, FP32 at 74%): the datasheet preset is
    off, the preset fitted to the table is not, per model and per op class."""
    from experiments import gpu_kernels

    truth = DevicePreset(**{**hardware._DATASHEET_PRESETS["h100"].to_dict(), "efficiencies": {
        "conv_forward/tf32": 0.26, "conv_forward/fp32": 0.74, "conv_input_grad/tf32": 0.3,
        "conv_input_grad/fp32": 0.7, "conv_filter_grad/tf32": 0.2, "conv_filter_grad/fp32": 0.6}})
    layers = gpu_kernels.conv_layers()
    rows = []
    for precision in ("tf32", "fp32"):
        for cls in gpu_kernels.CONV_CLASSES:
            for s in layers["shape"]:
                t = truth.with_precision(precision).op_times(
                    pd.DataFrame([kernels.kernel_features(cls, s)]))[0] - truth.overhead
                rows.append(dict(gpu="h100", op_class=cls, shape=s, precision=precision, seconds=t,
                                 source="synthetic"))
    path = tmp_path / "h100.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    df = gpu_kernels.report(kernels.load_kernel_table(path), out=tmp_path / "errors.csv")
    assert set(df.model) == {"all kernels", "resnet50", "vgg16", "inception_v3"}
    after = df[df.preset == "after"]
    before = df[(df.preset == "before") & (df.model == "all kernels")].set_index(
        ["op_class", "precision"])
    assert (after.median_abs_error < 0.05).all()
    assert before.loc[("conv_forward", "tf32"), "median_ratio"] < 0.7  # 60% of TF32: too fast
    assert (tmp_path / "errors.csv").exists()
