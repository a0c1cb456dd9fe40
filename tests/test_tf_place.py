"""fddps.tf: op_table, read_graph_def and place on real TensorFlow graphs.

Correctness and fidelity run the graphs in TensorFlow sessions with four CPU
devices (``ConfigProto(device_count={'CPU': 4})``). For fidelity, Grappler and
the graph optimizer are off (``tf_config`` in conftest): otherwise constant
folding and CSE rename or drop nodes and no node-by-node check is possible.
``test_fidelity_with_grappler_on`` checks the nodes that survive Grappler.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
v1 = tf.compat.v1

import fddps  # noqa: E402
from fddps.cluster import Cluster  # noqa: E402
from fddps.simulate import executor_policy  # noqa: E402
from fddps.errors import (ClusterError, FddpsError, GraphError, InfeasibleError,  # noqa: E402
                          UnknownAlgorithmError)
from fddps.tf import Placement, op_table, place, read_graph_def  # noqa: E402
from fddps.tf.devices import DEFAULT_CPU_MEMORY, make_cluster, same_device  # noqa: E402

CPUS = ["/cpu:0", "/cpu:1", "/cpu:2", "/cpu:3"]


def cpus_with_own_cores():
    """:data:`CPUS` each modelled with cores of its own, so placements span them
    (sharing this process's cores, one device is fastest for these small graphs)."""
    return make_cluster(CPUS, __import__("costmodel").default_cost_model(), share_cores=False)


def moved_nodes(placement, metadata):
    """(nodes whose executed device differs from the placement's, number of nodes checked).

    ``metadata``: one RunMetadata or a list; every node of their partition graphs
    that has a GraphDef name is checked (``_Send``/``_Recv`` have none).
    """
    want = placement.devices
    moved, seen = [], set()
    for meta in metadata if isinstance(metadata, list) else [metadata]:
        for partition in meta.partition_graphs:
            for node in partition.node:
                if node.name in want:
                    seen.add(node.name)
                    if not same_device(want[node.name], node.device):
                        moved.append(f"{node.name} ({node.op}): placed {want[node.name]}, "
                                     f"ran on {node.device}")
    return moved, len(seen)


def assert_same_step(ref, got):
    assert got.loss == pytest.approx(ref.loss, rel=1e-5, abs=1e-6)
    for name, a, b in zip(ref.reads if hasattr(ref, "reads") else range(len(ref.variables)),
                          ref.variables, got.variables):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6, err_msg=str(name))
    for a, b in zip(ref.initial, got.initial):
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-7)


def cnn_with_no_cpu_kernel():
    """A graph holding ``SegmentSumV2``, which has no CPU kernel (XLA only)."""
    g = tf.Graph()
    with g.as_default():
        data = tf.ones([6, 4], name="data")
        ids = tf.constant([0, 0, 1, 1, 2, 2], name="ids")
        seg = tf.raw_ops.SegmentSumV2(data=data, segment_ids=ids, num_segments=3, name="segsum")
        tf.reduce_sum(seg, name="total")
    return g


# -- op_table ------------------------------------------------------------------------
def test_op_table_reads_shapes_flops_variables_and_groups(cnn_graph):
    t = op_table(cnn_graph.graph_def)
    assert t["name"].tolist() == [n.name for n in cnn_graph.graph_def.node]
    for col in ("name", "op_type", "flops", "input_bytes", "output_bytes", "param_bytes",
                "shapes_known", "requested_device", "colocation_group"):
        assert col in t.columns
    row = t.set_index("name")
    # conv1: 4x8x8x3 -> 4x8x8x8 with a 3x3 kernel: 2 * 4*8*8*8 * 3*3*3 FLOPs.
    assert row.loc["conv1/Conv2D", "flops"] == 2 * 4 * 8 * 8 * 8 * 27
    assert row.loc["conv1/Conv2D", "output_bytes"] == 4 * 8 * 8 * 8 * 4
    assert row.loc["conv1/Conv2D", "input_bytes"] == (4 * 8 * 8 * 3 + 27 * 8) * 4
    assert row.loc["logits", "flops"] == 2 * 4 * 16 * 5
    assert row.loc["conv1/w", "param_bytes"] == 27 * 8 * 4
    assert row.loc["conv1/w/Momentum", "param_bytes"] == 27 * 8 * 4
    assert row.loc["conv1/Conv2D", "param_bytes"] == 0
    assert not row.loc["conv1/Relu", "flops_known"] and row.loc["conv1/Relu", "flops"] == 0
    # FusedBatchNormV3's reserve-space output has no static shape.
    assert not row.loc["conv1/FusedBatchNormV3", "shapes_known"]
    assert row.loc["conv1/Conv2D", "shapes_known"]
    # One resource variable: handle, reads, initializer, update are one group.
    group = row.loc["conv1/w", "colocation_group"]
    assert group == "conv1/w"
    for name in ("conv1/w/Read/ReadVariableOp", "conv1/Conv2D/ReadVariableOp", "conv1/w/Assign",
                 "train/update_conv1/w/ResourceApplyMomentum"):
        assert row.loc[name, "colocation_group"] == group
    assert row.loc["conv1/Conv2D", "colocation_group"] is None
    assert (t["requested_device"] == "").all()
    assert row.loc["conv1/Conv2D", "kernel_types"] == ("CPU",)


def test_op_table_accepts_graph_bytes_and_files(cnn_graph, tmp_path):
    gd = cnn_graph.graph_def
    ref = op_table(gd)
    pb = tmp_path / "g.pb"
    pb.write_bytes(gd.SerializeToString())
    pbtxt = tmp_path / "g.pbtxt"
    tf.io.write_graph(gd, str(tmp_path), "g.pbtxt", as_text=True)
    for source in (cnn_graph.graph, gd.SerializeToString(), pb, str(pbtxt)):
        other = op_table(source)
        assert other["name"].tolist() == ref["name"].tolist()
        np.testing.assert_array_equal(other["output_bytes"], ref["output_bytes"])


def test_op_table_flags_unknown_dims_and_estimates_them():
    g = tf.Graph()
    with g.as_default():
        x = v1.placeholder(tf.float32, [None, 16], name="x")
        tf.matmul(x, tf.ones([16, 4]), name="y")
    t = op_table(g, unknown_dim=32).set_index("name")
    assert not t.loc["x", "shapes_known"] and not t.loc["y", "shapes_known"]
    assert t.loc["x", "output_bytes"] == 32 * 16 * 4
    assert t.loc["ones", "shapes_known"]
    assert op_table(g).set_index("name").loc["x", "output_bytes"] == 16 * 4
    with pytest.raises(GraphError, match="unknown_dim"):
        op_table(g, unknown_dim=0)


def test_op_table_reference_variables_are_colocated():
    g = tf.Graph()
    with g.as_default():
        w = v1.Variable(tf.zeros([3]), use_resource=False, name="w")
        v1.assign_add(w, tf.ones([3]), name="bump")
        tf.identity(w, name="copy")
    row = op_table(g).set_index("name")
    assert row.loc["w", "op_type"] == "VariableV2" and row.loc["w", "param_bytes"] == 12
    for name in ("w/Assign", "w/read", "bump"):  # ref inputs and _class attributes
        assert row.loc[name, "colocation_group"] == "w"
    assert row.loc["copy", "colocation_group"] is None  # reads a value, not the ref


def test_op_table_checks_kernel_registry():
    row = op_table(cnn_with_no_cpu_kernel()).set_index("name")
    assert "CPU" not in row.loc["segsum", "kernel_types"]
    assert "CPU" in row.loc["total", "kernel_types"]


def test_op_table_loop_frames_form_one_group(while_graph):
    t = op_table(while_graph.graph_def)
    in_loop = t[t["loop_frame"] != ""]
    assert {"Enter", "Exit", "Merge", "NextIteration", "Switch"} <= set(in_loop["op_type"])
    for _, frame in in_loop.groupby("loop_frame"):
        assert frame["colocation_group"].nunique() == 1 and frame["colocation_group"].notna().all()
    assert t.set_index("name").loc["loss", "loop_frame"] == ""


# -- read_graph_def ---------------------------------------------------------------------
@pytest.mark.reads_cpu
def test_read_graph_def_builds_a_dag_with_costs_groups_and_bytes(while_graph):
    cm = __import__("costmodel").default_cost_model()
    cluster = make_cluster(CPUS, cm)
    graph, info = read_graph_def(while_graph.graph_def, cm, cluster)
    names = [n.name for n in while_graph.graph_def.node]
    assert list(graph.names) == names
    assert info["back_edges_dropped"] >= 2  # forward and gradient loop
    assert len(graph.topo) == graph.num_ops  # a DAG
    assert graph.device_types == ("CPU",) and np.isfinite(graph.cost).all()
    assert len(info["loop_frames"]) == 2
    i, j = graph.index["x"], graph.index["while/Enter_1"]
    eid = np.flatnonzero((graph.src == i) & (graph.dst == j))
    assert graph.bytes[eid].tolist() == [4 * 8 * 4]
    w = graph.index["w"]
    assert graph.memory[w] == 8 * 8 * 4


@pytest.mark.reads_cpu
def test_read_graph_def_marks_ops_without_kernel():
    cm = __import__("costmodel").default_cost_model()
    cluster = make_cluster(["/cpu:0", "/gpu:0"], cm)
    graph, info = read_graph_def(cnn_with_no_cpu_kernel(), cm, cluster)
    seg = graph.index["segsum"]
    assert graph.device_types == ("CPU", "GPU")
    assert np.isinf(graph.cost[seg, 0]) and np.isfinite(graph.cost[seg, 1])
    assert info["kernels_unchecked"] == (["GPU"] if not tf.test.is_built_with_gpu_support() else [])
    graph2, _ = read_graph_def(cnn_with_no_cpu_kernel(), cm, ["/cpu:0", "/gpu:0"])
    np.testing.assert_array_equal(graph2.cost, graph.cost)
    untyped = Cluster.homogeneous(2, names=["/cpu:0", "/cpu:1"])  # type "device"
    with pytest.raises(ClusterError, match="'/cpu:0' has type 'device'.*make_cluster"):
        read_graph_def(cnn_with_no_cpu_kernel(), cm, untyped)


# -- place: correctness and fidelity -------------------------------------------------------
@pytest.mark.reads_cpu
@pytest.mark.parametrize("mode", ["whole_graph", "step_with_order"])
def test_place_cnn_is_correct_and_runs_where_placed(cnn_graph, tf_config, tf_train_step, mode):
    gd = cnn_graph.graph_def
    before = gd.SerializeToString()
    kwargs = {} if mode == "whole_graph" else dict(fetches=["train", "loss"], enforce_order=True)
    p = place(gd, cpus_with_own_cores(), **kwargs)
    assert gd.SerializeToString() == before  # input untouched
    assert [n.name for n in p.graph_def.node] == [n.name for n in gd.node]
    assert all(n.device for n in p.graph_def.node)
    assert len({n.device for n in p.graph_def.node}) > 1
    if mode == "step_with_order":
        assert p.info["order_edges_added"] > 0
    ref = tf_train_step(gd, cnn_graph, tf_config(4))
    got = tf_train_step(p.graph_def, cnn_graph, tf_config(4))
    assert_same_step(ref, got)
    moved, seen = moved_nodes(p, got.all_metadata)
    # Nodes no run needs (VarIsInitializedOp, unused gradient branches) are pruned.
    assert seen >= 0.8 * len(gd.node)
    assert moved == [], "\n".join(moved)


@pytest.mark.reads_cpu
def test_place_while_loop_is_correct_and_keeps_frames_whole(while_graph, tf_config, tf_train_step):
    p = place(while_graph.graph_def, CPUS)
    t = op_table(while_graph.graph_def)
    devices = p.devices
    for _, frame in t[t["loop_frame"] != ""].groupby("loop_frame"):
        assert len({devices[name] for name in frame["name"]}) == 1
    ref = tf_train_step(while_graph.graph_def, while_graph, tf_config(4))
    got = tf_train_step(p.graph_def, while_graph, tf_config(4))
    assert_same_step(ref, got)
    moved, seen = moved_nodes(p, got.all_metadata)
    assert seen >= 0.8 * len(while_graph.graph_def.node) and moved == [], "\n".join(moved)


@pytest.mark.reads_cpu
def test_fidelity_with_grappler_on(cnn_graph, tf_config, tf_train_step):
    """With Grappler, folded or replicated constants get new names; every node
    that keeps its GraphDef name still runs where it was placed."""
    p = place(cnn_graph.graph_def, CPUS, fetches=["train", "loss"])
    ref = tf_train_step(cnn_graph.graph_def, cnn_graph, tf_config(4, grappler=True))
    got = tf_train_step(p.graph_def, cnn_graph, tf_config(4, grappler=True))
    assert_same_step(ref, got)
    moved, seen = moved_nodes(p, got.metadata)
    assert seen > p.info["ops"] // 2 and moved == [], "\n".join(moved)


@pytest.mark.reads_cpu("avx2-2.0GHz")
@pytest.mark.slow
def test_place_slim_resnet50_is_correct_and_faithful(tf_config, tf_train_step):
    slim_models = pytest.importorskip("slim_models")
    m = slim_models.build_training_graph("resnet50", batch_size=2, image_size=32, num_classes=10)
    gd = m.graph_def
    model = type("M", (), dict(init=m.init_op.name, loss=m.loss.name, train=m.train_op.name,
                               feed=m.feed_dict(),
                               reads=[f"{v.op.name}/Read/ReadVariableOp:0"
                                      for v in m.trainable_variables]))
    # Whole-op placement only: split correctness is tests/test_tf_split.py's, and this
    # batch-norm net at batch 2 amplifies a batch split's float rounding (DESIGN: 1e-6).
    p = place(gd, CPUS, fetches=[m.train_op.name, m.loss.name], split=False)
    assert [n.name for n in p.graph_def.node] == [n.name for n in gd.node]
    ref = tf_train_step(gd, model, tf_config(4))
    got = tf_train_step(p.graph_def, model, tf_config(4))
    assert_same_step(ref, got)
    moved, seen = moved_nodes(p, got.metadata)
    assert seen > 0.9 * p.info["ops"] and moved == [], "\n".join(moved)


# -- place: constraints ------------------------------------------------------------------------
def _pinned_graph(device="/cpu:2"):
    g = tf.Graph()
    with g.as_default():
        a = tf.random.normal([32, 32], seed=1, name="a")
        with tf.device(device):
            b = tf.matmul(a, a, name="b")
        c = tf.matmul(a, tf.transpose(a), name="c")
        tf.add(b, c, name="d")
    return g


@pytest.mark.reads_cpu
def test_pinned_ops_keep_their_device_unless_override():
    p = place(_pinned_graph("/cpu:2"), CPUS)
    assert p.devices["b"] == "/device:CPU:2"
    assert p.info["pinned"] == 1
    with pytest.raises(ClusterError, match="'b'.*'/device:CPU:7'"):
        place(_pinned_graph("/cpu:7"), CPUS)
    p = place(_pinned_graph("/cpu:7"), CPUS, override=True)
    assert p.info["pinned"] == 0 and p.devices["b"] in {"/device:CPU:%d" % k for k in range(4)}


@pytest.mark.reads_cpu
def test_ops_without_kernel_go_where_they_can_run():
    p = place(cnn_with_no_cpu_kernel(), ["/cpu:0", "/gpu:0"])
    assert p.devices["segsum"] == "/device:GPU:0"
    with pytest.raises(InfeasibleError, match=r"'segsum' \(SegmentSumV2\).*no kernel.*\['CPU'\]"):
        place(cnn_with_no_cpu_kernel(), CPUS)


@pytest.mark.reads_cpu
def test_memory_limits_are_respected_and_reported(cnn_graph):
    p = place(cnn_graph.graph_def, CPUS, memory=50_000)
    # The constraint is each device's replayed peak; `memory` (every op's
    # bytes, summed) may exceed the capacity as tensors are freed.
    assert (p.peak_memory <= 50_000).all()
    p.schedule.validate()
    with pytest.raises(InfeasibleError, match="bytes"):
        place(cnn_graph.graph_def, CPUS, memory=1_000)
    assert make_cluster(["/cpu:0"], __import__("costmodel").default_cost_model()).memory[0] == \
        DEFAULT_CPU_MEMORY


@pytest.mark.reads_cpu
def test_place_accepts_a_cluster_and_device_spellings(cnn_graph):
    cluster = Cluster.homogeneous(2, names=["/cpu:0", "/job:localhost/replica:0/task:0/device:CPU:1"],
                                  memory=1e9, bandwidth=1e9, latency=1e-5)
    p = place(cnn_graph.graph_def, cluster)
    assert list(p.cluster.names) == ["/device:CPU:0", "/job:localhost/replica:0/task:0/device:CPU:1"]
    assert [d.type for d in p.cluster.devices] == ["CPU", "CPU"]
    assert p.cluster.memory.tolist() == [1e9, 1e9]
    assert p.cluster.latency[0, 1] == 1e-5
    assert fddps.place(cnn_graph.graph, ["/CPU:0"]).makespan > 0


# -- bad input ------------------------------------------------------------------------------
@pytest.mark.parametrize("graph_def, match", [
    (b"\x07this is not a GraphDef\xff\x00", "not a serialized GraphDef"),
    (b"\x50\x01", "not a serialized GraphDef.*no nodes"),  # parses: one unknown field
    (b"", "no nodes"),
    (12345, "must be a GraphDef.*int"),
    ("/no/such/file.pb", "not a file"),
])
def test_bad_graph_input_is_named(graph_def, match):
    with pytest.raises(GraphError, match=match):
        place(graph_def, CPUS)


def test_unknown_op_type_is_named(cnn_graph):
    gd = v1.GraphDef()
    gd.CopyFrom(cnn_graph.graph_def)
    gd.node.add(name="mystery", op="NoSuchOpType")
    with pytest.raises(GraphError, match="NoSuchOpType"):
        place(gd, CPUS)


@pytest.mark.parametrize("devices, match", [
    ([], "devices is empty"),
    (["/foo:bar"], "malformed device '/foo:bar'"),
    (["/cpu:0", "/device:XPU:0"], "'/device:XPU:0' has unknown device type 'XPU'"),
    (["/device:CPU:*"], "'/device:CPU:\\*' names no device index"),
    (["/job:worker/task:1"], "names no device type"),
    (["/cpu:0", "/device:CPU:0"], "name the same device"),
    ([None], "non-empty TensorFlow device string"),
])
def test_bad_devices_are_named(cnn_graph, devices, match):
    with pytest.raises(ClusterError, match=match):
        place(cnn_graph.graph_def, devices)


def test_bad_options_are_named(cnn_graph):
    with pytest.raises(UnknownAlgorithmError, match="nope"):
        place(cnn_graph.graph_def, CPUS, algorithm="nope")
    with pytest.raises(FddpsError, match="enforce_order=True needs fetches"):
        place(cnn_graph.graph_def, CPUS, enforce_order=True)
    with pytest.raises(GraphError, match="fetch 'nothing:0'"):
        place(cnn_graph.graph_def, CPUS, fetches=["nothing:0"])
    with pytest.raises(ClusterError, match=r"memory\['CPU'\]"):
        place(cnn_graph.graph_def, CPUS, memory={"CPU": "lots"})


# -- the Placement object ------------------------------------------------------------------------
@pytest.mark.reads_cpu
def test_placement_reports(cnn_graph, tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    p = place(cnn_graph.graph_def, cpus_with_own_cores(), fetches=["train", "loss"])
    assert isinstance(p, Placement)
    assert p.makespan == p.schedule.makespan > 0
    p.schedule.validate()
    assert list(p.memory.index) == list(p.cluster.names)
    # Peak counts received tensors too, which the reservation does not.
    assert list(p.peak_memory.index) == list(p.cluster.names) and (p.peak_memory > 0).all()
    text = p.summary()
    for name in p.cluster.names:
        assert name in text
    assert "predicted step time" in text
    # The step in the order TensorFlow picks, simulated; the schedule's own order
    # when it is enforced.
    order = [[p.schedule.graph.names[i] for i in seq] for seq in p.schedule.order]
    assert p.executor_makespan > 0
    assert p.executor_makespan == pytest.approx(
        fddps.simulate(p.schedule.graph, p.cluster, p.schedule.device,
                       policy=executor_policy(p.cluster)).makespan)
    assert fddps.simulate(p.schedule.graph, p.cluster, p.schedule.device,
                          order).makespan == pytest.approx(p.makespan)
    ordered = place(cnn_graph.graph_def, CPUS, fetches=["train", "loss"], enforce_order=True)
    assert ordered.executor_makespan == ordered.makespan
    df = p.to_dataframe()
    assert len(df) == p.info["ops"] and {"op", "device", "start", "flops", "colocation_group"} <= set(df)
    assert df["start"].is_monotonic_increasing
    ax = p.plot(transfers=True).axes[0]  # plot() returns the figure
    from fddps.plot import device_labels

    used = sorted(set(p.schedule.device.tolist()))  # idle devices get no lane
    assert [t.get_text() for t in ax.get_yticklabels()] == [
        device_labels(p.cluster.names)[k] for k in used]
    trace = p.to_chrome_trace(tmp_path / "trace.json")
    loaded = json.loads((tmp_path / "trace.json").read_text())
    assert loaded == trace
    assert sum(e["ph"] == "X" for e in loaded["traceEvents"]) == p.info["ops"]


def test_ops_that_read_a_static_shape_receive_no_bytes():
    """Grappler folds Shape/ShapeN/Size/Rank of a static shape to constants, so no
    tensor travels to them; a shape known only at run time still does."""
    from fddps.tf.graphdef import analyse

    g = tf.Graph()
    with g.as_default():
        x = tf.zeros([64, 1024], name="x")
        w = tf.zeros([1024, 8], name="w")
        tf.raw_ops.Shape(input=x, name="shape_x")
        tf.raw_ops.ShapeN(input=[x, w], name="shapes")
        tf.raw_ops.Size(input=x, name="size_x")
        p = tf.compat.v1.placeholder(tf.float32, [None, 1024], name="p")
        tf.raw_ops.Shape(input=p, name="shape_p")
        tf.identity(x, name="copy_x")
    a = analyse(g)
    names = [n.name for n in a.graph_def.node]
    into = {(names[s], names[d]): b for s, d, b in zip(a.edges.src, a.edges.dst, a.edges.bytes)}
    assert into[("x", "shape_x")] == into[("x", "shapes")] == into[("w", "shapes")] == 0.0
    assert into[("x", "size_x")] == 0.0
    assert into[("x", "copy_x")] == 64 * 1024 * 4
    assert into[("p", "shape_p")] > 0  # its batch is unknown: the tensor goes there
