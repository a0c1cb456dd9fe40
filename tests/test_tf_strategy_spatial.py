"""Spatial (attribute) splits: convolutions, pools and their gradients split by height and
width with a halo, in real TensorFlow graphs, and the halo's bytes in the task graph."""

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

tf = pytest.importorskip("tensorflow")

from costmodel import default_cost_model  # noqa: E402
from fddps.strategy import (NotDescribed, OpConfig, Strategy, StrategyError,  # noqa: E402
                            attribute_split, combine, description_table, expand, resolve)
from fddps.strategy.graph import OpInfo, StepGraph  # noqa: E402
from fddps.tf.strategy_graph import step_graph  # noqa: E402
from fddps.tf.float64 import as_float64  # noqa: E402
from fddps.tf.strategy_rewrite import rewrite_strategy  # noqa: E402

CPUS = [f"/device:CPU:{i}" for i in range(4)]
CONFIG = tf.compat.v1.ConfigProto(device_count={"CPU": 4}, allow_soft_placement=False,
                                  inter_op_parallelism_threads=2, intra_op_parallelism_threads=1)
raw = tf.raw_ops
CM = default_cost_model("p100")  # GPU devices: the P100 preset, whatever this machine is
WINDOW_OPS = ["Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter", "MaxPool", "AvgPool",
              "MaxPoolGrad", "AvgPoolGrad", "DepthwiseConv2dNative",
              "DepthwiseConv2dNativeBackpropInput", "DepthwiseConv2dNativeBackpropFilter"]
X = (2, 7, 9, 3)  # 7 rows and 9 columns: uneven parts for 2 and 3 (and 2 x 2)


def _rand(shape, seed):
    return tf.constant(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


EXPLICIT = [0, 0, 2, 1, 1, 0, 0, 0]  # rows: 2 before, 1 after; columns: 1 before


def _out_shape(stride, padding, kernel, dilation=1):
    kernel = (kernel - 1) * dilation + 1  # a dilated window's effective extent
    if padding == "EXPLICIT":
        return [(X[1] + 3 - kernel) // stride + 1, (X[2] + 1 - kernel) // stride + 1]
    if padding == "SAME":
        return [-(-X[1] // stride), -(-X[2] // stride)]
    return [(X[1] - kernel) // stride + 1, (X[2] - kernel) // stride + 1]


def _build(op_type, stride, padding, kernel=3, dilation=1, fmt="NHWC"):
    """The op ``X`` of ``op_type`` in the current graph: the input ``X`` (NHWC), its rows and
    columns at the axes ``fmt`` puts them (NCHW: channels second, the same numbers)."""
    def lay(v):  # an NHWC-ordered 4-vector in fmt's order
        return [v[0], v[3], v[1], v[2]] if fmt == "NCHW" else list(v)

    win = dict(strides=lay([1, stride, stride, 1]), padding=padding)
    if fmt != "NHWC":
        win["data_format"] = fmt
    if padding == "EXPLICIT":
        win["explicit_paddings"] = sum(lay([EXPLICIT[2 * a:2 * a + 2] for a in range(4)]), [])
    conv = dict(win, **({"dilations": lay([1, dilation, dilation, 1])} if dilation != 1 else {}))
    x = lay(X)
    f = (kernel, kernel, X[3], 4)
    ks = lay([1, kernel, kernel, 1])
    y = [X[0]] + _out_shape(stride, padding, kernel, dilation)
    if op_type == "Conv2D":
        return raw.Conv2D(input=_rand(x, 1), filter=_rand(f, 2), name="X", **conv)
    if op_type == "Conv2DBackpropInput":
        return raw.Conv2DBackpropInput(input_sizes=tf.constant(x), filter=_rand(f, 2),
                                       out_backprop=_rand(lay(y + [4]), 3), name="X", **conv)
    if op_type == "Conv2DBackpropFilter":
        return raw.Conv2DBackpropFilter(input=_rand(x, 1), filter_sizes=tf.constant(f),
                                        out_backprop=_rand(lay(y + [4]), 3), name="X", **conv)
    dw = (kernel, kernel, X[3], 1)
    if op_type == "DepthwiseConv2dNative":
        return raw.DepthwiseConv2dNative(input=_rand(x, 1), filter=_rand(dw, 2), name="X", **conv)
    if op_type == "DepthwiseConv2dNativeBackpropInput":
        return raw.DepthwiseConv2dNativeBackpropInput(
            input_sizes=tf.constant(x), filter=_rand(dw, 2), out_backprop=_rand(lay(y + [X[3]]), 3),
            name="X", **conv)
    if op_type == "DepthwiseConv2dNativeBackpropFilter":
        return raw.DepthwiseConv2dNativeBackpropFilter(
            input=_rand(x, 1), filter_sizes=tf.constant(dw), out_backprop=_rand(lay(y + [X[3]]), 3),
            name="X", **conv)
    assert dilation == 1, "TensorFlow's pools have no dilations"
    if op_type == "MaxPool":
        return raw.MaxPool(input=_rand(x, 1), ksize=ks, name="X", **win)
    if op_type == "AvgPool":
        return raw.AvgPool(value=_rand(x, 1), ksize=ks, name="X", **win)
    if op_type == "MaxPoolGrad":
        x = _rand(x, 1)
        return raw.MaxPoolGrad(orig_input=x, orig_output=raw.MaxPool(input=x, ksize=ks, **win),
                               grad=_rand(lay(y + [X[3]]), 2), ksize=ks, name="X", **win)
    assert op_type == "AvgPoolGrad"
    return raw.AvgPoolGrad(orig_input_shape=tf.constant(x), grad=_rand(lay(y + [X[3]]), 2),
                           ksize=ks, name="X", **win)


def _run(gd, fetches):
    with tf.Graph().as_default() as g:
        tf.graph_util.import_graph_def(gd, name="")
        with tf.compat.v1.Session(graph=g, config=CONFIG) as sess:
            return sess.run(fetches)


def _split_each(gd, op_type, dims, splits, want, label):
    """Op ``X`` of ``gd`` split as each of ``splits`` that fits its extents, its parts on
    CPUs: checked against ``want`` (the whole op's output); yields (split, its parts)."""
    for split in splits:
        if any(dims.extent[d] < f for d, f in split.items()):
            continue
        n = int(np.prod(list(split.values())))
        out = rewrite_strategy(gd, Strategy({"X": OpConfig(split, CPUS[:n])}, CPUS[0]), ["X"], CPUS)
        parts = [n for n in out.node if n.name.startswith("X/fddps_part_") and n.op == op_type]
        assert {p.device for p in parts} <= set(CPUS[:n]) and len(parts) >= n - 1
        np.testing.assert_allclose(_run(out, "X:0"), want, rtol=1e-5, atol=1e-5,
                                   err_msg=f"{label} split {split}")
        yield split, parts


CASES = [(t, s, p, 3) for t in WINDOW_OPS for s in (1, 2) for p in ("SAME", "VALID")]
# A window narrower than its stride (ResNet's 1x1 stride-2 shortcut): rows no window reads.
CASES += [(t, 2, "VALID", 1) for t in ("Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter")]
CASES += [("MaxPool", 2, "SAME", 2), ("AvgPool", 3, "SAME", 2)]
CASES += [(t, s, "EXPLICIT", 3) for t in ("Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter")
          for s in (1, 2)]
# 2x2 stride 3 VALID: the last rows and column are read by no window (a pool's gradient
# still has the input's shape).
CASES += [(t, 3, "VALID", 2) for t in ("Conv2DBackpropInput", "MaxPoolGrad", "AvgPoolGrad",
                                        "Conv2D", "MaxPool")]


@pytest.mark.parametrize("op_type,stride,padding,kernel", CASES)
def test_window_op_split_by_height_and_width_computes_the_whole_op(op_type, stride, padding,
                                                                    kernel):
    g = tf.Graph()
    with g.as_default():
        _build(op_type, stride, padding, kernel)
    gd = g.as_graph_def()
    dims = resolve(step_graph(gd, ["X"]).ops["X"])
    assert set(dims.halo) == {"h", "w"}
    want = _run(gd, "X:0")
    splits = ({"h": 2}, {"h": 3}, {"w": 2}, {"w": 3}, {"h": 2, "w": 2}, {"n": 2})
    tried = 0
    for split, parts in _split_each(gd, op_type, dims, splits, want,
                                    f"{op_type} stride {stride} {padding}"):
        if "n" not in split:  # a spatial split runs its parts on the haloed slices, VALID
            assert all(p.attr["padding"].s == b"VALID" for p in parts)
        tried += 1
    assert tried >= 3
    assert g.as_graph_def() == gd  # the user's graph is untouched


# Dilated windows (NHWC): the halo is the effective extent (k - 1) * d + 1. TensorFlow's
# pools have no dilations; dilated depthwise backprops stay whole (see below).
DILATED_CONVS = ("Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter", "DepthwiseConv2dNative")
DILATED = [(t, s, p, 3, d, "NHWC") for t in DILATED_CONVS
           for d in (2, 3) for s in (1, 2) for p in ("SAME", "VALID")]
DILATED += [("Conv2D", s, "EXPLICIT", 3, 2, "NHWC") for s in (1, 2)]
DILATED += [("Conv2D", 3, "VALID", 2, 2, "NHWC"), ("Conv2DBackpropInput", 3, "SAME", 2, 3, "NHWC")]
# NCHW: every window op, strides 1 and 2, SAME and VALID; explicit padding; dilated.
# NCHW max pools stay whole (below).
NCHW_MAX_POOLS = ("MaxPool", "MaxPoolGrad")
NCHW = [(t, s, p, 3, 1, "NCHW") for t in WINDOW_OPS if t not in NCHW_MAX_POOLS
        for s in (1, 2) for p in ("SAME", "VALID")]
NCHW += [("Conv2D", s, "EXPLICIT", 3, 1, "NCHW") for s in (1, 2)]
NCHW += [("AvgPool", 3, "SAME", 2, 1, "NCHW")]
NCHW += [(t, s, p, 3, d, "NCHW") for t in DILATED_CONVS
         for s, p, d in ((1, "SAME", 2), (2, "VALID", 3))]


@pytest.mark.parametrize("op_type,stride,padding,kernel,dilation,fmt", DILATED + NCHW)
def test_dilated_and_nchw_window_op_split_along_each_dimension_computes_the_whole_op(
        op_type, stride, padding, kernel, dilation, fmt):
    g = tf.Graph()
    with g.as_default():
        _build(op_type, stride, padding, kernel, dilation, fmt)
    gd = g.as_graph_def()
    dims = resolve(step_graph(gd, ["X"]).ops["X"])
    assert set(dims.halo) == {"h", "w"} and not dims.whole_reason
    assert all(h.dilation == dilation and h.kernel == (kernel - 1) * dilation + 1
               for h in dims.halo.values())
    try:
        want = _run(gd, "X:0")
    except tf.errors.OpError as e:  # the unsplit graph cannot run here either
        pytest.skip(f"TensorFlow cannot run the whole op on this CPU: {e.message[:200]}")
    splits = [{d: min(3, dims.extent[d])} for d in dims.dims if dims.extent[d] > 1]
    splits += [{"h": 2}, {"w": 2}, {"h": 2, "w": 2}]
    for split, parts in _split_each(gd, op_type, dims, splits, want,
                                    f"{op_type} {fmt} stride {stride} {padding} "
                                    f"dilation {dilation}"):
        assert all(p.attr["data_format"].s == fmt.encode() for p in parts)
        if set(split) & {"h", "w"}:  # parts run on the haloed slices, VALID, still dilated
            assert all(p.attr["padding"].s == b"VALID" for p in parts)
            assert all(max(p.attr["dilations"].list.i or [1]) == dilation for p in parts)


@pytest.mark.parametrize("op_type", ["DepthwiseConv2dNativeBackpropInput",
                                     "DepthwiseConv2dNativeBackpropFilter"])
@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
def test_dilated_depthwise_backprop_keeps_its_spatial_axes_whole_and_says_why(op_type, fmt):
    """TensorFlow's CPU kernels fail on these with VALID padding (what a spatial part runs)
    and, with SAME, disagree with the same gradient through the dilated filter: kept whole."""
    g = tf.Graph()
    with g.as_default():
        _build(op_type, 1, "SAME", 3, 2, fmt)
    dims = resolve(step_graph(g, ["X"]).ops["X"])
    assert not dims.halo and {"h", "w"}.isdisjoint(dims.extent)
    assert "dilated depthwise backprop" in dims.whole_reason and "VALID" in dims.whole_reason
    with pytest.raises(StrategyError, match=r"cannot be split along 'h': its spatial axes stay "
                                            r"whole \(a dilated depthwise backprop"):
        rewrite_strategy(g, Strategy({"X": OpConfig({"h": 2}, CPUS[:2])}, CPUS[0]), ["X"], CPUS)


@pytest.mark.parametrize("op_type", NCHW_MAX_POOLS)
def test_nchw_max_pools_are_kept_whole_and_say_why(op_type):
    """TensorFlow's CPU MaxPoolGrad runs NCHW only on its own MaxPool's output (oneDNN
    pairs them): fed a slice it fails ("Default MaxPoolingGradOp only supports NHWC"), so
    neither a part of it nor the whole gradient of a split pool could run."""
    g = tf.Graph()
    with g.as_default():
        _build(op_type, 2, "SAME", 3, 1, "NCHW")
    op = step_graph(g, ["X"]).ops["X"]
    with pytest.raises(NotDescribed, match="an NCHW max pool .*runs NCHW only on its own MaxPool"):
        resolve(op)
    with pytest.raises(StrategyError, match=f"op 'X' \\({op_type}\\) cannot be split: an NCHW "
                                            "max pool"):
        rewrite_strategy(g, Strategy({"X": OpConfig({"n": 2}, CPUS[:2])}, CPUS[0]), ["X"], CPUS)
    with g.as_default():  # the CPU's refusal this stands for: the gradient of a slice
        x = _rand([2, 3, 7, 9], 1)
        win = dict(ksize=[1, 1, 3, 3], strides=[1, 1, 2, 2], padding="SAME", data_format="NCHW")
        y = raw.MaxPool(input=x, **win)
        raw.MaxPoolGrad(orig_input=x[:1], orig_output=y[:1], grad=y[:1], name="Z", **win)
    if tf.config.list_logical_devices("GPU"):
        return  # a GPU kernel may take it
    with pytest.raises(tf.errors.OpError):
        _run(g.as_graph_def(), "Z:0")


def test_description_table_shows_the_halo_of_every_window_op():
    table = description_table()
    for fmt in ("NHWC", "NCHW"):
        rows = table[table["when"] == f"data_format={fmt}"].set_index("op_type")
        for t in WINDOW_OPS:
            assert rows.loc[t, "halo"].split(",")[0] in ("forward", "backward"), (t, fmt)
            if fmt == "NCHW" and t in NCHW_MAX_POOLS:
                assert rows.loc[t, "note"].startswith("kept whole: an NCHW max pool"), t
                continue
            assert rows.loc[t, "dilated"].startswith(
                "kept whole" if t.startswith("DepthwiseConv2dNativeBackprop") else "split"), t
    nhwc = table.drop_duplicates("op_type").set_index("op_type")  # the first entry: NHWC
    assert nhwc.loc["MaxPoolGrad", "inputs"] == "nHWc, nYXc, nYXc"
    assert nhwc.loc["Conv2DBackpropFilter", "halo"] == "forward, kernel from filter_sizes"
    nchw = table[table["when"] == "data_format=NCHW"].set_index("op_type")
    assert nchw.loc["Conv2D", "inputs"] == "niHW, ..io" and nchw.loc["Conv2D", "outputs"] == "nohw"
    assert nhwc.loc["MatMul", "dilated"] == ""


def test_resolve_names_the_layout_it_has_no_description_for():
    op = OpInfo("x", "MaxPool", input_shapes=((2, 8, 8, 4),), output_shapes=((2, 4, 4, 4),),
                attrs=dict(data_format="NCHW_VECT_C", strides=(1, 2, 2, 1), ksize=(1, 2, 2, 1),
                           padding="VALID"))
    with pytest.raises(NotDescribed, match="no MaxPool description for its attributes "
                                           "\\(data_format='NCHW_VECT_C'\\)"):
        resolve(op)


# -- the task graph: halo bytes ------------------------------------------------------
GPUS = ["/device:GPU:0", "/device:GPU:1"]


def _step(conv_kernel=3, padding="SAME"):
    """x -> Relu (2x8x8x4) -> Conv2D (kxk, 4 -> 4 channels) -> Relu."""
    act, item = (2, 8, 8, 4), 4
    nbytes = float(np.prod(act) * item)
    rows = 8 - conv_kernel + 1 if padding == "VALID" else 8
    out = (2, rows, rows, 4)
    f = (conv_kernel, conv_kernel, 4, 4)
    attrs = dict(data_format="NHWC", strides=(1, 1, 1, 1), padding=padding)
    return StepGraph([
        OpInfo("x", "Const", output_shapes=(act,), output_itemsizes=(item,), output_bytes=nbytes),
        OpInfo("f", "Const", output_shapes=(f,), output_itemsizes=(item,)),
        OpInfo("a", "Relu", inputs=(("x", 0),), input_shapes=(act,), output_shapes=(act,),
               input_itemsizes=(item,), output_itemsizes=(item,), flops=np.prod(act),
               input_bytes=nbytes, output_bytes=nbytes),
        OpInfo("c", "Conv2D", inputs=(("a", 0), ("f", 0)), input_shapes=(act, f),
               output_shapes=(out,), input_itemsizes=(item, item), output_itemsizes=(item,),
               attrs=attrs, flops=2.0 * np.prod(out) * np.prod(f[:3]),
               input_bytes=nbytes, output_bytes=float(np.prod(out) * item)),
        OpInfo("r", "Relu", inputs=(("c", 0),), input_shapes=(out,), output_shapes=(out,),
               input_itemsizes=(item,), output_itemsizes=(item,), flops=np.prod(out))])


def _edges(ex):
    g = ex.graph
    return {(g.names[s], g.names[t]): b for s, t, b in zip(g.src, g.dst, g.bytes)}


def _split_h(step, names):
    configs = {n: OpConfig({}, (GPUS[0],)) for n in step.ops}
    configs.update({n: OpConfig({"h": 2}, GPUS) for n in names})
    return Strategy(configs, GPUS[0])


def test_expansion_charges_the_halo_rows_and_nothing_for_rows_held():
    cm = CM
    step = _step()
    ex = expand(step, _split_h(step, ["a", "c", "r"]), cm.cluster(GPUS), cm)
    e = _edges(ex)
    row = 2 * 1 * 8 * 4 * 4  # one row of the activation: batch 2, 8 columns, 4 channels, float32
    # Conv part 0 (rows 0-3) reads rows -1..4: row 4 from the Relu part on GPU 1, and back.
    assert e["a/fddps_part_1", "c/fddps_part_0"] == row
    assert e["a/fddps_part_0", "c/fddps_part_1"] == row
    assert e["a/fddps_part_0", "c/fddps_part_0"] == e["a/fddps_part_1", "c/fddps_part_1"] == 0
    # Equal layouts (the conv's output rows to the next Relu's): nothing moves.
    assert ("c/fddps_part_0", "r/fddps_part_1") not in e
    assert e["c/fddps_part_0", "r/fddps_part_0"] == e["c/fddps_part_1", "r/fddps_part_1"] == 0
    # A part's time is the cost model's at its own shape: its rows plus the halo row read.
    rows = ex.rows.set_index("name")
    f_bytes = 3 * 3 * 4 * 4 * 4
    assert rows.loc["c/fddps_part_0", "input_bytes"] == 5 * row + f_bytes
    assert rows.loc["c/fddps_part_0", "flops"] == pytest.approx(step.ops["c"].flops / 2)
    g = ex.graph
    whole = expand(step, _split_h(step, []), cm.cluster(GPUS), cm).graph
    own = cm.op_times(rows.loc[["c/fddps_part_0"]].reset_index(), "GPU")[0]
    assert own < whole.cost[whole.index["c"], 0]
    # Its task also pays for concatenating its rows with the halo row (two pieces).
    concat = cm.op_times(pd.DataFrame([dict(name="x", op_type="ConcatV2", flops=0.0,
                                             input_bytes=5 * row, output_bytes=5 * row,
                                             param_bytes=0.0)]), "GPU")[0]
    assert g.cost[g.index["c/fddps_part_0"], 0] == pytest.approx(own + concat)
    assert ex.simulate(cm.cluster(GPUS)).makespan > 0


def test_a_window_without_halo_moves_nothing_between_equal_layouts():
    cm = CM
    step = _step(conv_kernel=1, padding="VALID")
    e = _edges(expand(step, _split_h(step, ["a", "c", "r"]), cm.cluster(GPUS), cm))
    assert sum(b for (s, t), b in e.items() if s.startswith("a/") and t.startswith("c/")) == 0
    assert ("a/fddps_part_1", "c/fddps_part_0") not in e


def test_filter_gradient_split_by_rows_gives_partial_sums_that_are_reduced():
    g = tf.Graph()
    with g.as_default():
        _build("Conv2DBackpropFilter", 1, "SAME")
    step = step_graph(g, ["X"])
    assert {"h", "w", "n"} <= resolve(step.ops["X"]).reduction
    cm = CM
    configs = {n: OpConfig({}, (GPUS[0],)) for n in step.ops}
    configs["X"] = OpConfig({"h": 2}, GPUS)
    ex = expand(step, Strategy(configs, GPUS[0]), cm.cluster(GPUS), cm)
    assert not any("fddps_reduce" in n for n in ex.graph.names)  # nothing reads X's whole value
    with g.as_default():
        tf.identity(g.get_tensor_by_name("X:0"), name="Y")
    step = step_graph(g, ["Y"])
    configs = {n: OpConfig({}, (GPUS[0],)) for n in step.ops}
    configs["X"] = OpConfig({"h": 2}, GPUS)
    ex = expand(step, Strategy(configs, GPUS[0]), cm.cluster(GPUS), cm)
    reduce = [n for n in ex.graph.names if "fddps_reduce" in n]
    assert len(reduce) == 1
    e = _edges(ex)
    assert e["X/fddps_part_1", reduce[0]] == 3 * 3 * 3 * 4 * 4  # the whole filter's partial


# -- bad input ---------------------------------------------------------------------
def test_split_factor_larger_than_the_spatial_extent_names_the_op_and_dimension():
    g = tf.Graph()
    with g.as_default():
        raw.Conv2D(input=_rand((2, 3, 9, 3), 1), filter=_rand((3, 3, 3, 4), 2),
                   strides=[1, 1, 1, 1], padding="VALID", name="X")  # 1 row, 7 columns
    with pytest.raises(StrategyError, match=r"op 'X': split factor 2 of dimension 'h' is larger "
                                            r"than the dimension \(1\)"):
        rewrite_strategy(g, Strategy({"X": OpConfig({"h": 2}, CPUS[:2])}, CPUS[0]), ["X"], CPUS)
    g = tf.Graph()
    with g.as_default():
        raw.Conv2D(input=_rand(X, 1), filter=_rand((3, 3, 3, 4), 2), strides=[1, 1, 1, 1],
                   dilations=[1, 1, 2, 1], padding="SAME", name="X")  # dilated along w only
    op = step_graph(g, ["X"]).ops["X"]
    halo = resolve(op).halo
    assert (halo["h"].dilation, halo["h"].kernel) == (1, 3)
    assert (halo["w"].dilation, halo["w"].kernel) == (2, 5)
    op.attrs["dilations"] = (1, 1, 2, 2)  # a dilation TensorFlow refuses: on the channels
    assert resolve(op).whole_reason == "dilations (1, 1, 2, 2) (not on the spatial axes)"


# -- a training step with every convolution split by rows ------------------------------
def _cnn():
    """Conv-BN-ReLU, max pool (3x3/2 SAME), depthwise conv (3x3/1 SAME), conv (3x3/2 VALID),
    ReLU, average pool (2x2/1 SAME), dense, softmax cross-entropy, momentum: a real step."""
    g = tf.Graph()
    with g.as_default():
        tf.compat.v1.set_random_seed(3)
        x = _rand([4, 16, 15, 3], 1)
        labels = tf.one_hot(tf.constant([0, 1, 2, 3]), 5)
        w1 = tf.compat.v1.get_variable("w1", [3, 3, 3, 8], use_resource=True)
        gamma = tf.compat.v1.get_variable("gamma", [8], initializer=tf.ones_initializer(),
                                          use_resource=True)
        beta = tf.compat.v1.get_variable("beta", [8], initializer=tf.zeros_initializer(),
                                         use_resource=True)
        wd = tf.compat.v1.get_variable("wd", [3, 3, 8, 1], use_resource=True)
        w2 = tf.compat.v1.get_variable("w2", [3, 3, 8, 8], use_resource=True)
        w3 = tf.compat.v1.get_variable("w3", [3 * 3 * 8, 5], use_resource=True)
        h = tf.nn.conv2d(x, w1, 1, "SAME")
        h, _, _ = tf.compat.v1.nn.fused_batch_norm(h, gamma, beta, is_training=True)
        h = tf.nn.max_pool2d(tf.nn.relu(h), 3, 2, "SAME")               # 8 x 8
        h = tf.nn.depthwise_conv2d(h, wd, [1, 1, 1, 1], "SAME")
        h = tf.nn.relu(tf.nn.conv2d(h, w2, 2, "VALID"))                  # 3 x 3
        h = tf.nn.avg_pool2d(h, 2, 1, "SAME")
        logits = tf.matmul(tf.reshape(h, [4, -1]), w3)
        loss = tf.reduce_mean(tf.nn.softmax_cross_entropy_with_logits(labels=labels,
                                                                      logits=logits), name="loss")
        train = tf.compat.v1.train.MomentumOptimizer(0.1, 0.9).minimize(loss, name="train")
        init = tf.compat.v1.global_variables_initializer()
    names = {n.name for n in g.as_graph_def().node}
    reads = [f"{v.op.name}/Read/ReadVariableOp:0" for v in (w1, gamma, beta, wd, w2, w3)]
    assert all(r[:-2] in names for r in reads)
    return g, SimpleNamespace(train=train.name, loss="loss:0", init=init.name, reads=reads, feed={})


@pytest.mark.parametrize("k", [2, 3, 4])
def test_cnn_training_step_with_every_convolution_split_by_rows_matches_unsplit(k, tf_train_step):
    g, model = _cnn()
    fetches = [model.train, model.loss]
    step = step_graph(g, fetches)
    strategy = attribute_split(step, CPUS[:k])
    split = {step.ops[n].op_type for n, c in strategy.configs.items() if c.split.get("h", 1) > 1}
    assert set(WINDOW_OPS) | {"FusedBatchNormV3", "FusedBatchNormGradV3", "Relu"} <= split
    gd = rewrite_strategy(g, strategy, fetches, CPUS[:k])
    want = tf_train_step(g.as_graph_def(), model, CONFIG)
    got = tf_train_step(gd, model, CONFIG)
    np.testing.assert_allclose(got.loss, want.loss, rtol=1e-5)
    assert all(np.abs(a - b).max() > 1e-4 for a, b in zip(want.initial, want.variables))
    for name, a, b in zip(model.reads, want.variables, got.variables):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6, err_msg=name)
    used = {n.device for n in gd.node if "/fddps_part_" in n.name}
    assert used == set(CPUS[:k])
    # A halo read slices the neighbour's part on the neighbour's device: only its rows move.
    halo = [n for n in gd.node if "/fddps_halo_" in n.name and n.op == "ConcatV2"]
    assert halo
    cm = CM
    cluster = cm.cluster([d.replace("CPU", "GPU") for d in CPUS[:k]])
    on_gpus = Strategy({n: OpConfig(c.split, [d.replace("CPU", "GPU") for d in c.devices])
                        for n, c in strategy.configs.items()},
                       strategy.default_device.replace("CPU", "GPU"))
    assert expand(step, on_gpus, cluster, cm).simulate(cluster).makespan > 0


def _dilated_cnn():
    """NHWC: a dilated 3x3 convolution (rate 2, SAME) - batch norm - ReLU, a dilated one
    (rate 3, VALID) - ReLU, a dilated strided one (rate 2, stride 2, SAME), average pool,
    dense, softmax cross-entropy, momentum; their gradients are dilated backprops."""
    g = tf.Graph()
    with g.as_default():
        tf.compat.v1.set_random_seed(5)
        x = _rand([4, 16, 15, 3], 1)
        labels = tf.one_hot(tf.constant([0, 1, 2, 3]), 5)
        var = lambda name, shape, **kw: tf.compat.v1.get_variable(name, shape, use_resource=True,
                                                                  **kw)
        w1, w2, w3 = var("w1", [3, 3, 3, 8]), var("w2", [3, 3, 8, 8]), var("w3", [3, 3, 8, 6])
        gamma = var("gamma", [8], initializer=tf.ones_initializer())
        beta = var("beta", [8], initializer=tf.zeros_initializer())
        w4 = var("w4", [5 * 5 * 6, 5])
        h = tf.nn.conv2d(x, w1, 1, "SAME", dilations=2)                     # 16 x 15
        h, _, _ = tf.compat.v1.nn.fused_batch_norm(h, gamma, beta, is_training=True)
        h = tf.nn.relu(tf.nn.conv2d(tf.nn.relu(h), w2, 1, "VALID", dilations=3))  # 10 x 9
        h = tf.nn.conv2d(h, w3, 2, "SAME", dilations=2)                     # 5 x 5
        h = tf.nn.avg_pool2d(h, 2, 1, "SAME")
        logits = tf.matmul(tf.reshape(h, [4, -1]), w4)
        loss = tf.reduce_mean(tf.nn.softmax_cross_entropy_with_logits(labels=labels,
                                                                      logits=logits), name="loss")
        train = tf.compat.v1.train.MomentumOptimizer(0.1, 0.9).minimize(loss, name="train")
        init = tf.compat.v1.global_variables_initializer()
    reads = [f"{v}/Read/ReadVariableOp:0" for v in ("w1", "gamma", "beta", "w2", "w3", "w4")]
    return g, SimpleNamespace(train=train.name, loss="loss:0", init=init.name, reads=reads, feed={})


def _nchw_cnn():
    """NCHW throughout: convolution, batch norm, ReLU, average pool (3x3/2 SAME),
    depthwise convolution, a dilated convolution (rate 2, VALID) + bias, ReLU, max pool
    (2x2/1 VALID: kept whole, see above), dense, softmax cross-entropy, momentum."""
    g = tf.Graph()
    with g.as_default():
        tf.compat.v1.set_random_seed(7)
        x = _rand([4, 3, 16, 15], 1)
        labels = tf.one_hot(tf.constant([0, 1, 2, 3]), 5)
        var = lambda name, shape, **kw: tf.compat.v1.get_variable(name, shape, use_resource=True,
                                                                  **kw)
        w1, b2, wd = var("w1", [3, 3, 3, 8]), var("b2", [6]), var("wd", [3, 3, 8, 1])
        gamma = var("gamma", [8], initializer=tf.ones_initializer())
        beta = var("beta", [8], initializer=tf.zeros_initializer())
        w2, w3 = var("w2", [3, 3, 8, 6]), var("w3", [6 * 3 * 3, 5])
        nchw = dict(data_format="NCHW")
        h = tf.nn.conv2d(x, w1, 1, "SAME", **nchw)                                # 16 x 15
        h, _, _ = tf.compat.v1.nn.fused_batch_norm(h, gamma, beta, is_training=True, **nchw)
        h = tf.nn.avg_pool2d(tf.nn.relu(h), 3, 2, "SAME", **nchw)                  # 8 x 8
        h = tf.nn.depthwise_conv2d(h, wd, [1, 1, 1, 1], "SAME", **nchw)
        h = tf.nn.conv2d(h, w2, 1, "VALID", dilations=2, **nchw)                  # 4 x 4
        h = tf.nn.relu(tf.nn.bias_add(h, b2, **nchw))
        h = tf.nn.max_pool2d(h, 2, 1, "VALID", **nchw)                            # 3 x 3
        logits = tf.matmul(tf.reshape(h, [4, -1]), w3)
        loss = tf.reduce_mean(tf.nn.softmax_cross_entropy_with_logits(labels=labels,
                                                                      logits=logits), name="loss")
        train = tf.compat.v1.train.MomentumOptimizer(0.1, 0.9).minimize(loss, name="train")
        init = tf.compat.v1.global_variables_initializer()
    reads = [f"{v}/Read/ReadVariableOp:0" for v in ("w1", "wd", "gamma", "beta", "w2", "b2", "w3")]
    return g, SimpleNamespace(train=train.name, loss="loss:0", init=init.name, reads=reads, feed={})


def _nchw_rows(step, devices):
    """Every op split by rows in NCHW: layout ops (a ``data_format``) along ``h``; the
    element-wise ops between them along axis 2, which their generic names call ``w``."""
    def rank4(op):
        return "data_format" not in op.attrs and len(op.output_shapes[0] or ()) == 4

    by_h = attribute_split(step, devices, ("h",), only=lambda op: op.attrs.get("data_format"))
    return combine(by_h, attribute_split(step, devices, ("w",), only=rank4), name="NCHW rows")


def _check_step(train_step, g, model, strategy, k, split_types):
    """Rewrite ``strategy`` (on ``k`` CPUs), run one step (``train_step``: the fixture):
    loss and variables as unsplit; the ops of ``split_types`` split. Returns the step and
    the rewritten GraphDef."""
    fetches = [model.train, model.loss]
    step = step_graph(g, fetches)
    split = {step.ops[n].op_type for n, c in strategy.configs.items() if c.num_parts > 1}
    assert set(split_types) <= split, set(split_types) - split
    try:
        want = train_step(g.as_graph_def(), model, CONFIG)
    except tf.errors.OpError as e:
        pytest.skip(f"TensorFlow cannot run the unsplit step on this CPU: {e.message[:200]}")
    gd = rewrite_strategy(g, strategy, fetches, CPUS[:k])
    got = train_step(gd, model, CONFIG)
    np.testing.assert_allclose(got.loss, want.loss, rtol=1e-5)
    assert all(np.abs(a - b).max() > 1e-4 for a, b in zip(want.initial, want.variables))
    for name, a, b in zip(model.reads, want.variables, got.variables):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6, err_msg=name)
    assert {n.device for n in gd.node if "/fddps_part_" in n.name} == set(CPUS[:k])
    return step, gd


@pytest.mark.parametrize("k", [2, 4])
def test_dilated_cnn_training_step_split_by_rows_matches_unsplit(k, tf_train_step):
    g, model = _dilated_cnn()
    step = step_graph(g, [model.train, model.loss])
    strategy = attribute_split(step, CPUS[:k])
    dilated = {n for n, op in step.ops.items() if max(op.attrs.get("dilations") or [1]) > 1}
    assert {step.ops[n].op_type for n in dilated} == {"Conv2D", "Conv2DBackpropInput",
                                                     "Conv2DBackpropFilter"}
    assert all(strategy.config(n).split.get("h", 1) > 1 for n in dilated)
    _, gd = _check_step(tf_train_step, g, model, strategy, k, ["Conv2D", "Conv2DBackpropInput",
                                                "Conv2DBackpropFilter", "FusedBatchNormV3",
                                                "FusedBatchNormGradV3", "AvgPool", "Relu"])
    assert [n for n in gd.node if "/fddps_halo_" in n.name and n.op == "ConcatV2"]


@pytest.mark.parametrize("k", [2, 4])
def test_nchw_cnn_training_step_split_by_rows_matches_unsplit(k, tf_train_step):
    g, model = _nchw_cnn()
    step = step_graph(g, [model.train, model.loss])
    strategy = _nchw_rows(step, CPUS[:k])
    nchw = [n for n, op in step.ops.items() if op.attrs.get("data_format") == "NCHW"]
    whole = {step.ops[n].op_type for n in nchw if strategy.config(n).num_parts == 1}
    assert whole == {"MaxPool", "MaxPoolGrad"}  # NCHW max pools stay whole
    relu = next(n for n, op in step.ops.items() if op.op_type == "Relu")
    assert strategy.config(relu).split == {"w": k}  # axis 2: the rows
    _check_step(tf_train_step, g, model, strategy, k,
                ["Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter", "BiasAdd", "BiasAddGrad",
                 "FusedBatchNormV3", "FusedBatchNormGradV3", "AvgPool", "AvgPoolGrad",
                 "DepthwiseConv2dNative", "DepthwiseConv2dNativeBackpropInput",
                 "DepthwiseConv2dNativeBackpropFilter", "Relu", "ReluGrad"])


@pytest.mark.slow
def test_resnet50_step_with_every_window_op_split_by_rows_and_columns_matches_unsplit(
        tf_train_step):
    """ResNet-50 (CIFAR size, batch 8) on 4 devices: every convolution, pool, their
    gradients and the element-wise ops between them split 2 x 2 by height and width.

    Batch norm stays whole here: split by sample or by rows, its statistics are
    closer to float64 than the fused kernel's (mean error 9e-9 against 3.6e-8 on
    conv1's), but the ~4e-7 relative change of its output moves this step's
    variables by up to 1e-2 (the same for the sample split data parallelism
    uses); batch norm split by rows is checked exactly in the small CNN above.
    """
    from slim_models.training import build_training_graph

    m = build_training_graph("resnet50", 8, dataset="cifar10")
    model = SimpleNamespace(train=m.train_op.name, loss=m.loss.name, init=m.init_op.name, feed={},
                            reads=[f"{v.op.name}/Read/ReadVariableOp:0"
                                   for v in m.trainable_variables])
    fetches = [model.train, model.loss]
    before = tf.compat.v1.GraphDef()
    before.CopyFrom(m.graph_def)
    step = step_graph(m.graph_def, fetches)
    strategy = attribute_split(step, CPUS, ("h", "w"),
                               only=lambda op: not op.op_type.startswith("FusedBatchNorm"))
    halved = [n for n, c in strategy.configs.items() if c.split == {"h": 2, "w": 2}]
    assert {step.ops[n].op_type for n in halved} >= {"Conv2D", "Conv2DBackpropInput",
                                                     "Conv2DBackpropFilter", "MaxPool",
                                                     "MaxPoolGrad", "Relu", "ReluGrad"}
    gd = rewrite_strategy(m.graph_def, strategy, fetches, CPUS)
    want, got = tf_train_step(m.graph_def, model, CONFIG), tf_train_step(gd, model, CONFIG)
    # Fifty layers of float32 rounding in another summation order: 1.2e-5 apart with
    # TensorFlow's Eigen kernels (a CPU without AVX2, no oneDNN), closer with oneDNN's.
    np.testing.assert_allclose(got.loss, want.loss, rtol=1e-4)
    # The update is compared in float64: ResNet-50's float32 step is chaotic (one
    # input ulp moves its momentum slots by up to 13x their size), so a float32
    # tolerance on the variables passes or fails with the CPU's summation order.
    want, got = (tf_train_step(as_float64(g), model, CONFIG) for g in (m.graph_def, gd))
    np.testing.assert_allclose(got.loss, want.loss, rtol=1e-9)
    for name, a, b in zip(model.reads, want.variables, got.variables):
        np.testing.assert_allclose(b, a, rtol=1e-9, atol=1e-11, err_msg=name)
    assert m.graph_def == before


@pytest.mark.slow
def test_cnn_step_split_by_rows_runs_across_two_local_cluster_workers(tf_train_step):
    from fddps.tf import local_cluster

    g, model = _cnn()
    fetches = [model.train, model.loss]
    want = tf_train_step(g.as_graph_def(), model, CONFIG)
    with local_cluster(2, threads_per_worker=1) as cluster:
        strategy = attribute_split(step_graph(g, fetches), cluster.devices)
        gd = rewrite_strategy(g, strategy, fetches, cluster.devices)
        assert {n.device for n in gd.node if "/fddps_part_" in n.name} == set(cluster.devices)
        got = tf_train_step(gd, model, cluster.session_config(), cluster.target)
    np.testing.assert_allclose(got.loss, want.loss, rtol=1e-5)
    for name, a, b in zip(model.reads, want.variables, got.variables):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6, err_msg=name)
