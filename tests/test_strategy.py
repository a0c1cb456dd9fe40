"""fddps.strategy: op descriptions, strategies, validation, expansion to the task graph."""

import numpy as np
import pandas as pd
import pytest

from costmodel import default_cost_model
from fddps.strategy import (OP_DESCRIPTIONS, OpConfig, Strategy, StrategyError, coverage,
                            data_parallel, description_table, expand, parameter_split, parts,
                            resolve, validate, whole_placement)
from fddps.strategy.graph import OpInfo, StepGraph

tf = pytest.importorskip("tensorflow")

REQUIRED = ["Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter", "DepthwiseConv2dNative",
            "DepthwiseConv2dNativeBackpropInput", "DepthwiseConv2dNativeBackpropFilter", "MatMul",
            "BiasAdd", "BiasAddGrad", "FusedBatchNormV3", "FusedBatchNormGradV3", "Relu",
            "ReluGrad", "Mul", "Sub", "AddV2", "AddN", "MaxPool", "AvgPool", "MaxPoolGrad",
            "AvgPoolGrad", "Pad", "ConcatV2", "Slice", "Reshape", "SoftmaxCrossEntropyWithLogits",
            "Mean", "Sum", "L2Loss", "ResourceApplyMomentum"]
GPUS = [f"/device:GPU:{i}" for i in range(4)]


@pytest.fixture(scope="module")
def cm():
    return default_cost_model("p100")


@pytest.fixture(scope="module")
def vgg():
    from fddps.tf.strategy_graph import step_graph
    from slim_models.training import build_training_graph

    g = build_training_graph("vgg16", 4, dataset="cifar10")
    return step_graph(g.graph_def, fetches=[g.train_op.name, g.loss.name])


def test_registry_covers_the_required_op_types():
    assert set(REQUIRED) <= set(OP_DESCRIPTIONS)
    table = description_table()
    assert set(REQUIRED) <= set(table["op_type"])
    conv = table[table.op_type == "Conv2D"].iloc[0]
    assert conv.inputs == "nHWi, ..io" and conv.outputs == "nhwo"
    assert conv.halo == "forward, kernel from filter"


def test_resolve_reads_dimensions_reductions_and_broadcasts():
    conv = resolve(OpInfo("f", "Conv2DBackpropFilter", input_shapes=((8, 4, 4, 3), (4,), (8, 4, 4, 16)),
                          output_shapes=((3, 3, 3, 16),), attrs={"data_format": "NHWC"}))
    assert conv.reduction == {"n"} and conv.extent == {"i": 3, "o": 16, "n": 8}
    assert conv.inputs[1] == ("shape", 0)
    mm = resolve(OpInfo("m", "MatMul", input_shapes=((5, 8), (3, 5)), output_shapes=((8, 3),),
                        attrs={"transpose_a": True, "transpose_b": True}))
    assert mm.extent == {"n": 8, "c": 3, "k": 5} and mm.reduction == {"k"}
    mul = resolve(OpInfo("x", "Mul", input_shapes=((8, 1, 1, 6), (6,)), output_shapes=((8, 4, 4, 6),)))
    assert mul.inputs == (("n", None, None, "c"), ("c",)) and mul.extent["h"] == 4
    mean = resolve(OpInfo("m", "Mean", input_shapes=((8, 4), (1,)), output_shapes=((4,),),
                          const_values={1: (0,)}))
    assert mean.reduction == {"n"} and mean.outputs == (("c",),)


def test_coverage_counts_described_and_kept_whole(vgg):
    table = coverage(vgg).set_index("op_type")
    counts = vgg.op_type_counts()
    assert table["ops"].sum() == len(vgg)
    for t in ("Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter", "MatMul", "ReluGrad"):
        assert table.loc[t, "described"] == counts[t] > 0
    assert table.loc["Const", "kept_whole"] == counts["Const"]
    assert "no description" in table.loc["Const", "reason"]


def test_validation_names_what_is_wrong(vgg):
    conv = next(n for n, op in vgg.ops.items() if op.op_type == "Conv2D")
    const = next(n for n, op in vgg.ops.items() if op.op_type == "Const")
    d = GPUS[:2]
    cases = [({"nope": OpConfig({}, d[:1])}, "'nope', which is not in the step"),
             ({const: OpConfig({"n": 2}, d)}, f"{const!r} \\(Const\\) cannot be split"),
             ({conv: OpConfig({"z": 2}, d)}, "has no dimension 'z'; its dimensions are n, o, i, h, w"),
             ({conv: OpConfig({"i": 4}, d * 2)}, "factor 4 of dimension 'i' is larger than the dimension \\(3\\)"),
             ({conv: OpConfig({"o": 3}, d + d[:1])}, "larger than the number of devices \\(2\\)"),
             ({conv: OpConfig({"n": 2}, d[:1])}, "2 parts but 1 devices"),
             ({conv: OpConfig({"n": 2}, ["/device:GPU:0", "/device:GPU:7"])}, "device '/device:GPU:7'")]
    for configs, message in cases:
        with pytest.raises(StrategyError, match=message):
            validate(Strategy(configs, d[0]), vgg, d)
    group = next(op.group for op in vgg.ops.values() if op.op_type == "ResourceApplyMomentum")
    tied = [n for n, op in vgg.ops.items() if op.group == group and op.tied]
    with pytest.raises(StrategyError, match="share colocation group"):
        validate(Strategy({tied[0]: OpConfig({}, d[1:])}, d[0]), vgg, d)


def test_parts_are_uneven_like_array_split():
    op = OpInfo("y", "Relu", inputs=(), input_shapes=((5, 3),), output_shapes=((5, 3),))
    boxes = [p.box for p in parts(op, OpConfig({"n": 2, "c": 2}, GPUS))]
    assert boxes[0] == {"n": (0, 3), "c": (0, 2)} and boxes[3] == {"n": (3, 5), "c": (2, 3)}


def test_whole_placement_expands_to_the_unsplit_graph(vgg, cm):
    from fddps.simulate import simulate
    from fddps.tf.read import read_graph_def
    from slim_models.training import build_training_graph

    cluster = cm.cluster(GPUS[:2])
    ex = expand(vgg, whole_placement({}, GPUS[0]), cluster, cm)
    assert ex.graph.num_ops == len(vgg) and float(ex.graph.bytes.sum()) == 0  # one device
    g = build_training_graph("vgg16", 4, dataset="cifar10")
    og, _ = read_graph_def(g.graph_def, cm, cluster, fetches=[g.train_op.name, g.loss.name],
                           splits=False)
    ref = simulate(og, cluster, [0] * og.num_ops)
    assert ex.simulate(cluster).makespan == pytest.approx(ref.makespan, rel=1e-9)


def test_data_parallel_reduces_every_weight_gradient_once_per_other_device(vgg, cm):
    k = 4
    cluster = cm.cluster(GPUS[:k])
    strategy = data_parallel(vgg, GPUS[:k])
    ex = expand(vgg, strategy, cluster, cm)
    g = ex.graph
    dev = np.array([cluster.index[ex.placement[n]] for n in g.names])
    into_reduce = np.array(["fddps_reduce" in g.names[j] for j in g.dst])
    cross = dev[g.src] != dev[g.dst]
    reduced = float(g.bytes[into_reduce & cross].sum())
    grads = sum(op.input_bytes - 16 for op in vgg.ops.values()  # lr, momentum: scalars
                if op.op_type == "ResourceApplyMomentum")
    assert reduced == pytest.approx((k - 1) * grads, rel=1e-3)
    # Each sample part's time is the cost model's at its own shape (its kernel shape too:
    # batch 4 over 4 devices, N=1).
    conv = next(n for n, op in vgg.ops.items() if op.op_type == "Conv2D")
    op = vgg.ops[conv]
    assert op.kernel_shape.startswith("N=4 ")
    whole = cm.op_times(pd.DataFrame([dict(op_type="Conv2D", flops=op.flops,
                                           input_bytes=op.input_bytes, output_bytes=op.output_bytes,
                                           kernel_shape=op.kernel_shape)]), "GPU")[0]
    part_costs = [g.cost[g.index[t], 0] for t in ex.tasks[conv]]
    assert len(part_costs) == k and all(c < whole for c in part_costs) and sum(part_costs) > whole
    rows = ex.rows.set_index("name").loc[ex.tasks[conv]]
    assert all(s == "N=1 " + op.kernel_shape[len("N=4 "):] for s in rows.kernel_shape)
    np.testing.assert_allclose(cm.op_times(rows.reset_index(), "GPU"), part_costs, rtol=1e-12)
    timeline = ex.simulate(cluster)
    assert timeline.makespan > 0 and (timeline.peak_memory > 0).all()


def test_data_parallel_sums_each_gradient_where_its_variable_lives(vgg, cm):
    """As on a parameter server: a weight's gradient sum (TF's AddN, colocated
    with the weight decay's gradient) runs on its variable's device, so the
    summed gradient never travels; the weight decay's L2Loss stays by its weight."""
    strategy = data_parallel(vgg, GPUS[:4])
    updates = [op for op in vgg.ops.values() if op.op_type == "ResourceApplyMomentum"]
    assert len({strategy.config(op.name).devices for op in updates}) == 4  # variables spread
    for op in updates:
        grad = op.inputs[3][0]  # (var, accum, lr, grad, momentum)
        assert strategy.config(grad).devices == strategy.config(op.name).devices, grad
    decays = [op for op in vgg.ops.values() if op.op_type == "L2Loss"]
    assert decays
    for op in decays:
        assert strategy.config(op.name).devices == strategy.config(op.inputs[0][0]).devices


def test_sharded_variable_holds_its_share_and_gradients_reduce_scatter(vgg, cm):
    d = GPUS[:2]
    cluster = cm.cluster(d)
    base = data_parallel(vgg, d)
    apply = max((op for op in vgg.ops.values() if op.op_type == "ResourceApplyMomentum"),
                key=lambda op: op.input_bytes)
    tied = [n for n, op in vgg.ops.items() if op.group == apply.group and op.tied]
    configs = dict(base.configs)
    configs.update({n: OpConfig({"c": 2}, d) for n in tied})
    ex = expand(vgg, Strategy(configs, d[0]), cluster, cm)
    var_parts = [t for n in tied if vgg.ops[n].op_type == "VarHandleOp" for t in ex.tasks[n]]
    assert sorted({ex.placement[t] for t in var_parts}) == d
    for n in tied:  # the weights and their momentum slot: each device holds half of each
        if vgg.ops[n].op_type == "VarHandleOp":
            mem = [ex.graph.memory[ex.graph.index[t]] for t in ex.tasks[n]]
            assert mem == pytest.approx([vgg.ops[n].param_bytes / 2] * 2)
    assert ex.simulate(cluster).makespan > 0


def test_parameter_split_moves_less_than_data_parallel_on_vgg(vgg, cm):
    cluster = cm.cluster(GPUS[:2])
    dp = expand(vgg, data_parallel(vgg, GPUS[:2]), cluster, cm).simulate(cluster)
    ps = expand(vgg, parameter_split(vgg, GPUS[:2]), cluster, cm).simulate(cluster)
    # VGG-16's weights (134 MB) dwarf its activations at batch 4: splitting them moves less.
    assert ps.transfers.bytes.sum() < dp.transfers.bytes.sum()


@pytest.mark.slow
def test_sample_split_batch_norm_exchanges_its_statistics(cm):
    from fddps.tf.strategy_graph import step_graph
    from slim_models.training import build_training_graph

    g = build_training_graph("resnet50", 4, dataset="cifar10")
    step = step_graph(g.graph_def, fetches=[g.train_op.name, g.loss.name])
    cluster = cm.cluster(GPUS[:2])
    ex = expand(step, data_parallel(step, GPUS[:2]), cluster, cm)
    bn = next(n for n, op in step.ops.items() if op.op_type == "FusedBatchNormV3")
    channels = step.ops[bn].output_shapes[0][3]
    stats = [f"{t}/stats" for t in ex.tasks[bn]]
    out = {(ex.graph.names[s], ex.graph.names[t]): b
           for s, t, b in zip(ex.graph.src, ex.graph.dst, ex.graph.bytes)}
    assert out[stats[0], ex.tasks[bn][1]] == 2 * 4 * channels
    assert ex.simulate(cluster).makespan > 0


@pytest.mark.filterwarnings("ignore::costmodel.ProfileCoverageWarning")  # the Placeholders
def test_splitting_a_profiled_op_on_one_device_never_shortens_the_step():
    """Parts on the op's own device cost at least the measured whole: with a profiled
    cost model the parts scale the op's measurement (``profile_name``), not the
    type's fit, which had made two halves of ResNet-50's late convolutions a third
    of the measured op and so a split on one device "faster"."""
    from costmodel import fit_cost_model

    mm = OpInfo("mm", "MatMul", inputs=(("x", 0), ("w", 0)),
                input_shapes=((64, 512), (512, 512)), output_shapes=((64, 512),),
                input_itemsizes=(4, 4), output_itemsizes=(4,),
                flops=2 * 64 * 512 * 512, input_bytes=4 * (64 * 512 + 512 * 512),
                output_bytes=4 * 64 * 512)
    x = OpInfo("x", "Placeholder", output_shapes=((64, 512),), output_itemsizes=(4,),
               output_bytes=4 * 64 * 512)
    w = OpInfo("w", "Placeholder", output_shapes=((512, 512),), output_itemsizes=(4,),
               output_bytes=4 * 512 * 512)
    step = StepGraph([x, w, mm])
    # Many MatMuls teach the type's fit a fast rate; "mm" itself measured 20x slower.
    rng = np.random.default_rng(0)
    n = rng.integers(64, 1024, 30)
    others = pd.DataFrame({"name": [f"other{i}" for i in range(30)], "op_type": "MatMul",
                           "flops": 2.0 * n * 512 * 512, "input_bytes": 4.0 * (n * 512 + 512 * 512),
                           "output_bytes": 4.0 * n * 512})
    others["seconds"] = 5e-6 + others["flops"] / 50e9
    slow = pd.DataFrame([dict(name="mm", op_type="MatMul", flops=mm.flops,
                              input_bytes=mm.input_bytes, output_bytes=mm.output_bytes,
                              seconds=20 * (5e-6 + mm.flops / 50e9))])
    measured = pd.concat([others, slow], ignore_index=True).assign(status="timed",
                                                                   device_type="CPU")
    cm = fit_cost_model(measured, base=default_cost_model())
    devices = ["/device:CPU:0", "/device:CPU:1"]
    cluster = cm.cluster(devices)
    whole = Strategy({}, devices[0])
    halves = Strategy({"mm": OpConfig({"n": 2}, (devices[0], devices[0]))}, devices[0])
    t_whole = expand(step, whole, cluster, cm).simulate(cluster).makespan
    t_halves = expand(step, halves, cluster, cm).simulate(cluster).makespan
    assert t_whole >= float(slow.seconds[0])
    assert t_halves >= t_whole
    # The searches' incremental evaluator costs the parts alike, from scratch and by delta.
    from fddps.search import StrategyEvaluator

    ev = StrategyEvaluator(step, cluster, cm)
    assert ev.reset(halves).makespan == pytest.approx(t_halves)
    ev.reset(whole)
    assert ev.propose({"mm": halves.config("mm")}).makespan == pytest.approx(t_halves)


def test_part_kernel_shape_of_batch_and_channel_parts_and_none_for_rows():
    """A convolution's part split by batch or output channels gets its own kernel shape (the
    GPU presets' kernel model times it at that shape); one split by rows reads a halo and pads
    only at the image's border, which a shape string cannot say: None (FLOPs and bytes)."""
    from costmodel.kernel_model import tf_kernel_shape
    from fddps.strategy.expand import _tensor_box
    from fddps.strategy.graph import OpInfo
    from fddps.strategy.kernel_shape import part_kernel_shape
    from fddps.strategy.ops import resolve

    attrs = {"data_format": "NHWC", "strides": (1, 1, 1, 1), "padding": "SAME"}
    shapes = ((8, 32, 32, 3), (3, 3, 3, 16))
    op = OpInfo("c", "Conv2D", input_shapes=shapes, output_shapes=((8, 32, 32, 16),), attrs=attrs,
                kernel_shape=tf_kernel_shape("Conv2D", shapes, (8, 32, 32, 16), attrs))
    dims = resolve(op)

    def shape_of(**split):
        box = {d: split.get(d, (0, dims.extent[d])) for d in dims.dims}
        ins = [_tensor_box(m, s, box) for m, s in zip(dims.inputs, op.input_shapes)]
        outs = [_tensor_box(m, s, box) for m, s in zip(dims.outputs, op.output_shapes)]
        return part_kernel_shape(op, dims, box, ins, outs)

    assert shape_of() == op.kernel_shape
    assert shape_of(n=(0, 2)) == op.kernel_shape.replace("N=8 ", "N=2 ")
    assert shape_of(o=(4, 12)) == op.kernel_shape.replace("K=16 ", "K=8 ")
    assert shape_of(h=(0, 16)) is None
    assert part_kernel_shape(OpInfo("c", "Conv2D", input_shapes=shapes), dims, {}, [], []) is None
