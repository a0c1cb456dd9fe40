"""Intra-op splitting in TensorFlow: candidates from shapes, the GraphDef rewrite, place().

Every split graph is run for one training step on four CPU devices
(``tf_config``: Grappler off, so nodes keep their names in the partition
graphs) and must give the unsplit graph's loss and variables (rtol 1e-5), with
every node running on the device it was given.
"""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
v1 = tf.compat.v1

from costmodel import default_cost_model  # noqa: E402
from fddps.errors import GraphError  # noqa: E402
from fddps.strategy import expand, parts, simulate_strategy, validate  # noqa: E402
from fddps.strategy.fddps_splits import (SplitDecision, dimension_letter, part_name,  # noqa: E402
                                         slice_name, split_strategy)
from fddps.tf import make_cluster, op_table, place, read_graph_def  # noqa: E402
from fddps.tf.devices import same_device  # noqa: E402
from fddps.tf.split_rewrite import split_graph_def, split_node_names  # noqa: E402
from fddps.tf.strategy_graph import step_graph  # noqa: E402

CPUS = ["/device:CPU:0", "/device:CPU:1", "/device:CPU:2", "/device:CPU:3"]
FETCHES = ["train", "loss"]


def conv_net(batch=6, size=8, channels=(6, 5), classes=3, seed=0):
    """Two 3x3 convolutions (so both backprops are in the step), mean, dense, momentum SGD.

    Batch 6 and 6/5/3 channels: 4 parts are uneven on every dimension.
    """
    g = tf.Graph()
    with g.as_default():
        v1.set_random_seed(seed)
        x = v1.placeholder(tf.float32, [batch, size, size, 3], name="images")
        y = v1.placeholder(tf.int32, [batch], name="labels")
        h = x
        for k, cout in enumerate(channels, 1):
            w = v1.get_variable(f"conv{k}/w", [3, 3, h.shape[-1], cout], use_resource=True)
            h = tf.nn.relu(tf.nn.conv2d(h, w, 1, "SAME", name=f"conv{k}/Conv2D"))
        h = tf.reduce_mean(h, [1, 2])
        w = v1.get_variable("fc/w", [channels[-1], classes], use_resource=True)
        logits = tf.matmul(h, w, name="logits")
        xent = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)
        loss = tf.reduce_mean(xent, name="loss")
        v1.train.MomentumOptimizer(0.1, 0.9).minimize(loss, name="train")
        v1.global_variables_initializer()
    rng = np.random.RandomState(seed)
    gd = g.as_graph_def()
    return SimpleNamespace(
        graph_def=gd, loss="loss:0", train="train", init="init",
        feed={"images:0": rng.randn(batch, size, size, 3).astype(np.float32),
              "labels:0": rng.randint(0, classes, batch).astype(np.int32)},
        reads=[f"{n.name}/Read/ReadVariableOp:0" for n in gd.node if n.op == "VarHandleOp"])


@pytest.fixture(scope="module")
def net():
    return conv_net()


@pytest.fixture(scope="module")
def reference(net, tf_train_step, tf_config):
    return tf_train_step(net.graph_def, net, tf_config(4))


class ConvHeavy:
    """The default cost model with the work of convolutions and MatMuls 10^4 times
    slower: splitting them across the CPUs pays. Their per-op overhead (the time
    of the same op doing no work) is kept, as every part pays it again."""

    def __init__(self):
        self.base = default_cost_model()

    def op_times(self, ops, device_type):
        t = self.base.op_times(ops, device_type)
        idle = self.base.op_times(ops.assign(flops=0.0, input_bytes=0.0, output_bytes=0.0),
                                  device_type)
        heavy = ops["op_type"].str.startswith("Conv2D") | (ops["op_type"] == "MatMul")
        return np.where(heavy.to_numpy(), idle + (t - idle) * 1e4, t)

    def __getattr__(self, name):
        return getattr(self.base, name)


def assert_same_step(ref, got, names):
    assert got.loss == pytest.approx(ref.loss, rel=1e-5)
    for name, a, b in zip(names, ref.variables, got.variables):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6, err_msg=name)


def assert_same_step_in_float64(original, graph_def, model, train_step, config):
    """The same check with both graphs widened to float64, where reordered sums cannot
    hide a mistake: agreement to 1e-10."""
    from fddps.tf.float64 import as_float64

    ref = train_step(as_float64(original), model, config)
    got = train_step(as_float64(graph_def), model, config)
    assert np.asarray(got.loss).dtype == np.float64
    assert got.loss == pytest.approx(ref.loss, rel=1e-10)
    for name, a, b in zip(model.reads, ref.variables, got.variables):
        np.testing.assert_allclose(b, a, rtol=1e-10, atol=1e-12, err_msg=name)


def assert_ran_where_placed(graph_def, metadata):
    """Every node of the partition graphs that has a GraphDef name ran on its device."""
    want = {n.name: n.device for n in graph_def.node}
    ran = {node.name: node.device for part in metadata.partition_graphs for node in part.node
           if node.name in want}
    moved = [f"{name}: placed {want[name]}, ran {dev}" for name, dev in ran.items()
             if want[name] and not same_device(want[name], dev)]
    assert moved == [], "\n".join(moved)
    return ran


@pytest.mark.reads_cpu
def test_candidates_come_from_shapes_and_the_rules(net, while_graph):
    graph, info = read_graph_def(net.graph_def, default_cost_model(), CPUS, fetches=FETCHES)
    found = {(c.op, c.rule.dim): c for c in graph.split_candidates}
    assert info["split_candidates"] == len(found) == 15
    conv2 = found["conv2/Conv2D", "channels"]
    assert conv2.size == 5 and conv2.sliced == (("conv2/Conv2D/ReadVariableOp", 3 * 3 * 6 * 5 * 4.0),)
    assert conv2.whole_bytes == 6 * 8 * 8 * 6 * 4 and conv2.output_bytes == 6 * 8 * 8 * 5 * 4
    bf = found["gradients/conv2/Conv2D_grad/Conv2DBackpropFilter", "batch"]
    assert bf.size == 6 and bf.rule.combine == "sum" and len(bf.sliced) == 2
    assert found["gradients/conv1/Conv2D_grad/Conv2DBackpropInput", "channels"].size == 6
    assert {d for (op, d) in found if op == "logits"} == {"rows", "cols", "inner"}
    for c in graph.split_candidates:  # costs from the cost model, one per device type
        assert len(c.slice_cost) == len(c.combine_cost) == 1
        assert c.slice_cost[0] > 0 and c.combine_cost[0] > 0
    # The gradient MatMuls transpose an operand: no rule applies.
    assert info["split_skipped"] == {"no rule for its attributes": 2}
    assert read_graph_def(net.graph_def, default_cost_model(), CPUS, splits=False)[0].split_candidates == ()
    # MatMuls inside a tf.while_loop frame stay whole, counted.
    graph, info = read_graph_def(while_graph.graph_def, default_cost_model(), CPUS)
    assert info["split_skipped"].get("in a tf.while_loop frame", 0) > 0
    frames = op_table(while_graph.graph_def).set_index("name")["loop_frame"]
    assert all(frames[c.op] == "" for c in graph.split_candidates)


@pytest.mark.reads_cpu
@pytest.mark.parametrize("dims", [("batch", "rows"), ("channels", "cols"), ("channels", "inner")])
def test_rewrite_computes_the_same_step(net, reference, dims, tf_train_step, tf_config):
    """Every Conv2D, backprop and the forward MatMul split into up to 4 uneven parts."""
    graph, _ = read_graph_def(net.graph_def, default_cost_model(), CPUS, fetches=FETCHES)
    decisions = {}
    for c in graph.split_candidates:
        if c.rule.dim in dims and c.op not in decisions:
            decisions[c.op] = SplitDecision(c, min(4, c.size))
    assert len(decisions) == 7
    assert any(len(set(d.part_sizes)) > 1 for d in decisions.values())  # uneven parts
    devices = {name: CPUS[j % 4] for d in decisions.values()
               for j, name in enumerate(split_node_names(d))}
    before = net.graph_def.SerializeToString()
    out = split_graph_def(net.graph_def, list(decisions.values()), devices)
    assert net.graph_def.SerializeToString() == before
    names = [n.name for n in out.node]
    assert names[:len(net.graph_def.node)] == [n.name for n in net.graph_def.node]
    for op, d in decisions.items():
        node = out.node[names.index(op)]
        assert node.op == ("ConcatV2" if d.candidate.rule.combine == "concat" else "AddN")
        assert all(part_name(op, j) in names for j in range(d.parts))
        assert all(slice_name(op, p) in names for p, _ in d.candidate.sliced)
    got = tf_train_step(out, net, tf_config(4))
    assert_same_step(reference, got, net.reads)
    assert_same_step_in_float64(net.graph_def, out, net, tf_train_step, tf_config(4))
    ran = assert_ran_where_placed(out, got.metadata)
    assert {ran[name] for name in devices if name in ran} >= {f"/job:localhost/replica:0/task:0{d}"
                                                              for d in CPUS}


@pytest.mark.reads_cpu
def test_place_splits_where_it_pays_and_is_correct(net, reference, tf_train_step, tf_config):
    import matplotlib

    matplotlib.use("Agg")
    cm = ConvHeavy()
    cpus = make_cluster(CPUS, cm, share_cores=False)  # sharing cores, splitting never pays
    p = place(net.graph_def, cpus, cost_model=cm, fetches=FETCHES, enforce_order=True)
    whole = place(net.graph_def, cpus, cost_model=cm, fetches=FETCHES, split=False)
    # D-DPS(-F): no split node; FD-DPS: some, and a step predicted no longer.
    assert whole.info["splits"] == 0 and len(whole.graph_def.node) == len(net.graph_def.node)
    assert p.info["splits"] > 0 and p.makespan <= whole.makespan
    assert p.schedule.info["unsplit_makespan"] == pytest.approx(whole.makespan)
    table = p.splits
    assert len(table) == p.info["splits"] and set(table["op_type"]) >= {"Conv2D", "Conv2DBackpropFilter"}
    names = [n.name for n in p.graph_def.node]
    assert names[:len(net.graph_def.node)] == [n.name for n in net.graph_def.node]
    assert len(names) == len(net.graph_def.node) + p.info["split_nodes_added"]
    # Every scheduled op is a node on its scheduled device.
    devices = p.devices
    s = p.schedule
    for i, name in enumerate(s.graph.names):
        assert devices[name] == p.cluster.names[s.device[i]]
    got = tf_train_step(p.graph_def, net, tf_config(4))
    assert_same_step(reference, got, net.reads)
    ran = assert_ran_where_placed(p.graph_def, got.all_metadata[1])
    parts = [n for n in names if "/fddps_part_" in n]
    assert len({ran[n] for n in parts if n in ran}) > 1
    # Reports cover the split graph.
    df = p.to_dataframe()
    assert len(df) == s.graph.num_ops
    split_rows = df[df["split_of"].notna()]
    assert set(split_rows["split_of"]) == set(table["op"])
    assert "intra-op splits" in p.summary()
    ax = p.plot().axes[0]  # plot() returns the figure
    from fddps.plot import device_labels

    used = sorted(set(p.schedule.device.tolist()))  # idle devices get no lane
    assert [t.get_text() for t in ax.get_yticklabels()] == [
        device_labels(p.cluster.names)[k] for k in used]


@pytest.mark.reads_cpu
def test_a_split_placement_is_a_valid_strategy(net):
    """FD-DPS's split decisions in the strategy layer's terms: every op of the step
    configured, each split op an OpConfig on its parts' devices whose parts cut the
    dimension as the decision did; the strategy validates and expands, every part
    costing what it costs in the schedule, and the two paths predict one step."""
    cm = ConvHeavy()
    cpus = make_cluster(CPUS, cm, share_cores=False)
    p = place(net.graph_def, cpus, cost_model=cm, fetches=FETCHES)
    decisions = p.schedule.info["splits"]
    assert decisions
    strategy = split_strategy(p.schedule)
    step = step_graph(net.graph_def, FETCHES)
    assert set(strategy.configs) == set(step.ops)
    validate(strategy, step, list(p.cluster.names))
    for d in decisions:
        op, letter = d.candidate.op, dimension_letter(d.candidate.rule)
        config = strategy.config(op)
        assert config.split == {letter: d.parts}
        assert config.devices == tuple(p.devices[part_name(op, j)] for j in range(d.parts))
        boxes = [part.box[letter] for part in parts(step.ops[op], config)]
        assert [stop - start for start, stop in boxes] == list(d.part_sizes)
    ex = expand(step, strategy, p.cluster, cm)
    graph = p.schedule.graph
    rows = ex.rows.set_index("name")
    for d in decisions:
        for j in range(d.parts):
            name = part_name(d.candidate.op, j)  # the part's own row (its task adds its slices)
            own = cm.op_times(rows.loc[[name]].reset_index(), p.cluster.devices[0].type)[0]
            assert own == pytest.approx(graph.cost[graph.index[name], 0])
    # Within 1%: the expansion charges slices and concatenations to the parts that
    # read through them where FD-DPS's op graph has slice and combine ops (SplitV,
    # ConcatV2, AddN: about 5 us each here, the parts' ~5 ms), and runs the
    # executor's order, not the schedule's (split_strategy's docstring).
    assert simulate_strategy(step, strategy, p.cluster, cm).makespan == pytest.approx(p.makespan,
                                                                                     rel=0.01)


@pytest.mark.reads_cpu
def test_rewrite_refuses_decisions_that_do_not_fit_the_graph(net):
    graph, _ = read_graph_def(net.graph_def, default_cost_model(), CPUS, fetches=FETCHES)
    cand = next(c for c in graph.split_candidates if c.op == "conv1/Conv2D" and c.rule.dim == "batch")
    other = conv_net(batch=8)
    with pytest.raises(GraphError, match="conv1/Conv2D.*size 6.*shape"):
        split_graph_def(other.graph_def, [SplitDecision(cand, 2)])
    with pytest.raises(GraphError, match="split twice"):
        split_graph_def(net.graph_def, [SplitDecision(cand, 2), SplitDecision(cand, 3)])
    with pytest.raises(GraphError, match="cannot be split into 7 parts"):
        SplitDecision(cand, 7)
    bogus = type(cand)("nothing", cand.rule, 6, cand.sliced, 1.0)
    with pytest.raises(GraphError, match="unknown op 'nothing'"):
        split_graph_def(net.graph_def, [SplitDecision(bogus, 2)])
    once = split_graph_def(net.graph_def, [SplitDecision(cand, 2)])
    with pytest.raises(GraphError, match="already has a node"):
        split_graph_def(once, [SplitDecision(cand, 2)])


def test_op_table_prints_no_deprecation_warning():
    code = ("import tensorflow as tf\nfrom fddps.tf import op_table\ng = tf.Graph()\n"
            "with g.as_default():\n    tf.matmul(tf.ones([4, 3]), tf.ones([3, 2]), name='y')\n"
            "assert op_table(g).set_index('name').loc['y', 'flops'] == 48\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "deprecated" not in run.stderr and "flops_registry" not in run.stderr


@pytest.mark.reads_cpu
def test_rewrite_of_the_batch_norm_cnn(cnn_graph, tf_train_step, tf_config):
    """conftest's Conv-BN-ReLU net: every conv and backprop split 3 ways on the batch of 4."""
    graph, _ = read_graph_def(cnn_graph.graph_def, default_cost_model(), CPUS,
                              fetches=["train", "loss"])
    decisions = [SplitDecision(c, 3) for c in graph.split_candidates
                 if c.rule.dim == "batch" and c.rule.op_type.startswith("Conv2D")]
    assert len(decisions) == 6 and all(d.part_sizes == (2, 1, 1) for d in decisions)
    devices = {name: CPUS[j % 4] for d in decisions for j, name in enumerate(split_node_names(d))}
    out = split_graph_def(cnn_graph.graph_def, decisions, devices)
    ref = tf_train_step(cnn_graph.graph_def, cnn_graph, tf_config(4))
    got = tf_train_step(out, cnn_graph, tf_config(4))
    assert_same_step(ref, got, cnn_graph.reads)
    assert_same_step_in_float64(cnn_graph.graph_def, out, cnn_graph, tf_train_step, tf_config(4))
    assert_ran_where_placed(out, got.metadata)
