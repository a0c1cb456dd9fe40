"""The RNN models' op types in the strategy space: Split/SplitV, Pack/Unpack,
StridedSlice(Grad), Tile, Transpose, ExpandDims, Reshape keeping leading or trailing axes,
softmax, the sparse softmax cross-entropy, embedding gathers and their gradient
(UnsortedSegmentSum), BatchMatMulV2, and the ConcatV2 gradient's Slice at a ConcatOffset
begin: each split along every dimension it declares in a real TF graph, against the whole
op; the expansion's bytes; rnn_lm and nmt steps with these ops split."""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from test_tf_strategy import CPUS, _rand, _split_each_dimension  # noqa: E402

from costmodel import default_cost_model  # noqa: E402
from fddps.strategy import OpConfig, Strategy, expand, resolve  # noqa: E402
from fddps.strategy.ops import coverage, kept_whole_share  # noqa: E402
from fddps.tf.strategy_graph import step_graph  # noqa: E402
from fddps.tf.strategy_rewrite import rewrite_strategy  # noqa: E402

raw = tf.raw_ops


def _ids(shape, high, seed):
    return tf.constant(np.random.default_rng(seed).integers(0, high, shape).astype(np.int32))


def _concat_grad_slice():
    """The ConcatV2 gradient's second Slice: begin from ConcatOffset(axis % rank, shapes)."""
    axis = tf.math.floormod(tf.constant(1), tf.rank(_rand([5, 3], 9)))
    offsets = raw.ConcatOffset(concat_dim=axis, shape=[tf.constant([5, 3]), tf.constant([5, 4])])
    return raw.Slice(input=_rand([5, 7], 1), begin=offsets[1], size=tf.constant([5, 4]), name="X")


def _ops():
    """name -> builder of the op named "X" (in the current graph)."""
    x3 = (5, 3, 4)
    ss = dict(begin=tf.constant([0, 1, 0]), end=tf.constant([0, 2, 0]),
              strides=tf.constant([1, 1, 1]), begin_mask=5, end_mask=5, shrink_axis_mask=2)
    return {
        "Split": lambda: raw.Split(axis=tf.constant(1), value=_rand([5, 8], 1), num_split=4,
                                   name="X"),
        "Split_rank3": lambda: raw.Split(axis=tf.constant(-2), value=_rand([5, 4, 3], 1),
                                         num_split=2, name="X"),
        "SplitV": lambda: raw.SplitV(value=_rand([5, 7], 1), size_splits=tf.constant([3, 4]),
                                     axis=tf.constant(1), num_split=2, name="X"),
        "Pack": lambda: raw.Pack(values=[_rand([5, 4], k) for k in range(3)], axis=1, name="X"),
        "Unpack": lambda: raw.Unpack(value=_rand(x3, 1), num=3, axis=1, name="X"),
        "Tile": lambda: raw.Tile(input=_rand([5, 1, 4], 1), multiples=tf.constant([1, 3, 1]),
                                 name="X"),
        "Transpose": lambda: raw.Transpose(x=_rand(x3, 1), perm=tf.constant([1, 2, 0]), name="X"),
        "ExpandDims": lambda: raw.ExpandDims(input=_rand([5, 4], 1), axis=tf.constant(1),
                                             name="X"),
        "StridedSlice": lambda: raw.StridedSlice(input=_rand(x3, 1), name="X", **ss),
        "StridedSlice_ends": lambda: raw.StridedSlice(
            input=_rand(x3, 1), begin=tf.constant([0, 1, 0]), end=tf.constant([5, 3, 4]),
            strides=tf.constant([1, 1, 1]), name="X"),
        "StridedSliceGrad": lambda: raw.StridedSliceGrad(shape=tf.constant(x3), dy=_rand([5, 4], 2),
                                                         name="X", **ss),
        "Reshape_merge": lambda: raw.Reshape(tensor=_rand([5, 3, 4], 1), shape=tf.constant([15, 4]),
                                             name="X"),
        "Reshape_unmerge": lambda: raw.Reshape(tensor=_rand([15, 4], 1),
                                               shape=tf.constant([5, 3, 4]), name="X"),
        "Reshape_squeeze": lambda: raw.Reshape(tensor=_rand([5, 1, 4], 1),
                                               shape=tf.constant([5, 4]), name="X"),
        "Softmax": lambda: raw.Softmax(logits=_rand([5, 3, 7], 1), name="X"),
        "LogSoftmax": lambda: raw.LogSoftmax(logits=_rand([5, 7], 1), name="X"),
        "SparseSoftmaxCrossEntropyWithLogits": lambda: raw.SparseSoftmaxCrossEntropyWithLogits(
            features=_rand([5, 7], 1), labels=_ids([5], 7, 2), name="X"),
        "GatherV2": lambda: raw.GatherV2(params=_rand([10, 4], 1), indices=_ids([5, 3], 10, 2),
                                         axis=tf.constant(0), name="X"),
        "UnsortedSegmentSum": lambda: raw.UnsortedSegmentSum(
            data=_rand([7, 4], 1), segment_ids=_ids([7], 3, 2), num_segments=tf.constant(3),
            name="X"),
        "Slice_concat_offset": _concat_grad_slice,
        "BatchMatMulV2": lambda: raw.BatchMatMulV2(x=_rand([3, 5, 4], 1), y=_rand([3, 4, 6], 2),
                                                   name="X"),
        "BatchMatMulV2_adj": lambda: raw.BatchMatMulV2(x=_rand([2, 3, 4, 5], 1),
                                                       y=_rand([2, 3, 6, 4], 2), adj_x=True,
                                                       adj_y=True, name="X"),
    }


#: The dimensions each case must declare (and the test splits), besides its whole axes.
DECLARED = {"Split": "n", "Split_rank3": "nc", "SplitV": "n", "Pack": "nc", "Unpack": "nc",
            "Tile": "nc", "Transpose": "nwc", "ExpandDims": "nc", "StridedSlice": "nc",
            "StridedSlice_ends": "nc", "StridedSliceGrad": "nc", "Reshape_merge": "c",
            "Reshape_unmerge": "c", "Reshape_squeeze": "nc", "Softmax": "nw", "LogSoftmax": "n",
            "SparseSoftmaxCrossEntropyWithLogits": "n", "GatherV2": "npc",
            "UnsortedSegmentSum": "kc", "Slice_concat_offset": "n", "BatchMatMulV2": "nmkc",
            "BatchMatMulV2_adj": "npmkc"}


@pytest.mark.parametrize("case", sorted(_ops()))
def test_rnn_op_splits_along_each_dimension(case):
    g = tf.Graph()
    with g.as_default():
        _ops()[case]()
    gd = g.as_graph_def()
    op = step_graph(gd, fetches=["X"]).ops["X"]
    dims = resolve(op)
    tried = _split_each_dimension(gd, dims, [f"X:{k}" for k in range(len(op.output_shapes))],
                                  case, atol=1e-6)
    assert set(dims.dims) == set(DECLARED[case]) == set(tried), dims
    if case in ("UnsortedSegmentSum", "BatchMatMulV2"):
        assert dims.reduction == {"k"}  # partial sums


def test_expansion_moves_only_the_parts_boxes():
    """Split by its sample axis after a producer split the same way on the same devices, the
    gates' Split moves nothing and each part's bytes are its share (no halo)."""
    g = tf.Graph()
    with g.as_default():
        z = raw.Relu(features=_rand([8, 16], 1), name="Z")
        raw.Split(axis=tf.constant(1), value=z, num_split=4, name="X")
    step = step_graph(g, fetches=["X"])
    cm = default_cost_model("p100")
    devs = ["/device:GPU:0", "/device:GPU:1"]
    cluster = cm.cluster(devs)
    same = Strategy({"Z": OpConfig({"n": 2}, devs), "X": OpConfig({"n": 2}, devs)}, devs[0])
    ex = expand(step, same, cluster, cm)
    rows = ex.rows.set_index("name")
    whole = step.ops["X"]
    for t in ex.tasks["X"]:
        assert rows.loc[t, "output_bytes"] == whole.output_bytes / 2
        assert rows.loc[t, "input_bytes"] == pytest.approx(whole.input_bytes / 2, abs=8)
    assert _moved(ex, "Z", "X") == 0  # equal layouts on the same devices move nothing
    # Split by sample while its producer is split by columns: each part reads half of
    # each producer part, half of which is on the other device.
    cross = Strategy({"Z": OpConfig({"c": 2}, devs), "X": OpConfig({"n": 2}, devs)}, devs[0])
    moved = _moved(expand(step, cross, cluster, cm), "Z", "X")
    assert moved == pytest.approx(8 * 16 * 4 / 2)


def _moved(ex, src, dst):
    """Bytes on the task graph's edges from ``src``'s parts to ``dst``'s."""
    g = ex.graph
    edges = (np.isin(g.src, [g.index[t] for t in ex.tasks[src]])
             & np.isin(g.dst, [g.index[t] for t in ex.tasks[dst]]))
    return float(g.bytes[edges].sum())


def test_coverage_reports_what_the_rnn_step_keeps_whole():
    import slim_models

    m = slim_models.build_training_graph("rnn_lm", 4, num_layers=2, hidden_size=16,
                                         vocab_size=20, seq_length=3)
    step = step_graph(m.graph_def, [m.train_op.name, m.loss.name])
    table = coverage(step).set_index("op_type")
    for t in ("Split", "Pack", "Unpack", "UnsortedSegmentSum", "Slice",
              "SparseSoftmaxCrossEntropyWithLogits", "MatMul", "SigmoidGrad"):
        assert table.loc[t, "kept_whole"] == 0, (t, table.loc[t, "reason"])
    share = kept_whole_share(table.reset_index())
    assert share["flops"] == 0 and share["bytes"] < 0.01 and 0 < share["ops"] < 0.5
    assert table.loc["Const", "whole_bytes"] > 0 and table.whole_bytes.sum() == pytest.approx(
        share["bytes"] * table.output_bytes.sum())


#: The op types described for the RNN models (this file's cases).
RNN_OP_TYPES = ("Split", "SplitV", "Pack", "Unpack", "Tile", "Transpose", "ExpandDims",
                "StridedSlice", "StridedSliceGrad", "Reshape", "Softmax", "LogSoftmax",
                "SparseSoftmaxCrossEntropyWithLogits", "GatherV2", "UnsortedSegmentSum", "Slice")


def _rnn_ops_split(step, devices):
    """Every op of :data:`RNN_OP_TYPES` split in two along its last dimension that has two
    rows (columns before samples), everything else whole (data parallelism's homes)."""
    from fddps.strategy.strategy import _split_where

    def choose(op, dims):
        if op.op_type not in RNN_OP_TYPES:
            return {}
        d = next((d for d in reversed(dims.dims) if dims.extent[d] >= 2), None)
        return {} if d is None else {d: 2}

    return _split_where(step, devices, choose, "rnn ops split")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["rnn_lm", "nmt"])
def test_rnn_step_with_its_ops_split_matches_unsplit(name):
    """A training step of rnn_lm (2 layers) and nmt (1 + 1 layers with attention), 3 steps,
    with the RNN op types split on two CPU devices, and under data parallelism: loss and
    variables after a step as unsplit."""
    from test_tf_strategy import _train

    from fddps.strategy import data_parallel
    from slim_models.training import build_training_graph

    model = build_training_graph(name, 4, num_layers=2 if name == "rnn_lm" else 1,
                                 hidden_size=8, vocab_size=12, seq_length=3)
    fetches = [model.train_op.name, model.loss.name]
    step = step_graph(model.graph_def, fetches)
    ref_loss, ref_vars = _train(model.graph_def, model)
    devices = CPUS[:2]
    for make in (_rnn_ops_split, data_parallel):
        strategy = make(step, devices)
        split = {step.ops[n].op_type for n, c in strategy.configs.items() if c.num_parts > 1}
        if make is _rnn_ops_split:
            # (UnsortedSegmentSum, the embedding's gradient, is colocated with the
            # embedding variable: whole with it)
            assert {"Split", "Pack", "Unpack", "Slice", "Reshape", "ExpandDims",
                    "SparseSoftmaxCrossEntropyWithLogits"} <= split, split
            if name == "nmt":  # the attention's
                assert {"Softmax", "Tile", "StridedSlice"} <= split, split
        else:
            assert {"Split", "Slice", "MatMul", "Pack", "Unpack"} <= split, split
        gd = rewrite_strategy(model.graph_def, strategy, fetches, devices)
        loss, got = _train(gd, model)
        np.testing.assert_allclose(loss, ref_loss, rtol=1e-5, err_msg=strategy.name)
        for v, want, have in zip(model.trainable_variables, ref_vars, got):
            np.testing.assert_allclose(have, want, rtol=1e-5, atol=1e-7,
                                       err_msg=f"{strategy.name}: {v.name}")
        assert {n.device for n in gd.node if "/fddps_part_" in n.name} == set(devices)


def test_coverage_experiment_reports_shares_kept_whole():
    from experiments.strategies import coverage_table

    shares = []
    table = coverage_table(["vgg16"], batch=1, shares=shares)
    (row,) = shares
    assert row["model"] == "vgg16" and row["ops"] == table.ops.sum()
    assert row["kept_whole"] == table.kept_whole.sum() > 0
    assert row["whole_flops"] == 0 and 0 < row["whole_ops"] < 0.5 and row["whole_bytes"] < 0.01
    assert "Const" in set(table.op_type) and "vgg16" in table.columns
