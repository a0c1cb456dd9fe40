"""Profiling real TensorFlow graphs and links, and the cost model fitted to them."""

import re
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

tf = pytest.importorskip("tensorflow")

import costmodel  # noqa: E402
from costmodel import ProfileMismatchError  # noqa: E402
from fddps.errors import GraphError  # noqa: E402
from fddps.tf import local_cluster, op_table, place  # noqa: E402
from fddps.tf.comm_bench import measure_transfers  # noqa: E402
from fddps.tf.profiling import device_busy, grappler_origin, profile, step_ops  # noqa: E402

tf1 = tf.compat.v1


def small_cnn(batch=8, size=16, channels=8, prefix=""):
    """A small training graph: conv+bias+relu (Grappler fuses it), a residual conv, pool, dense."""
    g = tf.Graph()
    with g.as_default(), tf1.variable_scope(prefix or "net"):
        x = tf.random.stateless_normal([batch, size, size, 3], seed=[1, 2])
        y = tf.random.stateless_uniform([batch], seed=[3, 4], maxval=10, dtype=tf.int32)
        w1 = tf1.get_variable("w1", [3, 3, 3, channels], use_resource=True)
        b1 = tf1.get_variable("b1", [channels], use_resource=True, initializer=tf1.zeros_initializer())
        h = tf.nn.relu(tf.nn.bias_add(tf.nn.conv2d(x, w1, 1, "SAME"), b1))
        w2 = tf1.get_variable("w2", [3, 3, channels, channels], use_resource=True)
        h = tf.nn.relu(tf.nn.conv2d(h, w2, 1, "SAME")) + h
        h = tf.reshape(tf.nn.max_pool2d(h, 2, 2, "SAME"), [batch, -1])
        w3 = tf1.get_variable("w3", [(size // 2) ** 2 * channels, 10], use_resource=True)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=y, logits=tf.matmul(h, w3)))
        train = tf1.train.MomentumOptimizer(0.01, 0.9).minimize(loss)
        init = tf1.global_variables_initializer()
    return SimpleNamespace(graph=g, graph_def=g.as_graph_def(), train_op=train, init_op=init, loss=loss)


@pytest.fixture(scope="module")
def cnn():
    m = small_cnn()
    return m, profile(m, steps=3, warmup=1, progress=False), op_table(m.graph_def)


@pytest.mark.reads_cpu
def test_profile_times_most_ops_and_maps_grappler_rewrites(cnn):
    m, p, _ = cnn
    ops = p.ops
    assert len(ops) == len(step_ops(m.graph_def, [m.train_op])) == p.meta["num_step_ops"]
    c = p.counts
    assert c["timed"] + c["fused"] + c["pruned"] + len(p.meta["not_timed"]) == len(ops)
    executed = len(ops) - c["pruned"]
    assert (c["timed"] + c["fused"]) >= 0.9 * executed          # most ops that ran were timed
    assert p.coverage > 0.5 and not p.unmapped
    timed = ops[ops["status"] == "timed"]
    assert np.isfinite(timed["seconds"]).all() and (timed["seconds"] > 0).all()
    assert (ops.loc[ops["status"] == "pruned", "seconds"] == 0).all()
    # Conv2D + BiasAdd + Relu ran as one fused kernel named after the Relu
    # (Grappler's _FusedConv2D, or oneDNN's _MklFusedConv2D/_MklNativeFusedConv2D
    # by CPU): the Conv2D and BiasAdd get shares of its time, attributed to it.
    by_name = ops.set_index("name")
    assert re.fullmatch(r"_(Mkl(Native)?)?FusedConv2D", by_name.loc["net/Relu", "executed_type"])
    for member in ("net/Conv2D", "net/BiasAdd"):
        assert by_name.loc[member, "status"] == "fused"
        assert by_name.loc[member, "fused_into"] == "net/Relu"
        assert by_name.loc[member, "seconds"] > 0
    # Variables, reads and optimizer updates ran on the CPU and were timed.
    assert by_name.loc["net/Momentum/update_net/w2/ResourceApplyMomentum", "status"] == "timed"
    assert p.meta["device_type"] == "CPU" and p.meta["steps"] == 3
    assert (p.steps["traced"].sum(), (~p.steps["traced"]).sum()) == (3, 3)
    assert "coverage" in p.report()


def test_grappler_names_map_back_to_graphdef_ops():
    known = {"g/Conv2D_grad/ShapeN", "add_3", "net/Pad"}
    assert grappler_origin("ConstantFolding/g/Conv2D_grad/ShapeN-matshapes-1", known) == "g/Conv2D_grad/ShapeN"
    assert grappler_origin("ArithmeticOptimizer/AddOpsRewrite_add_3", known) == "add_3"
    assert grappler_origin("net/Pad/_0__cf__0", known) == "net/Pad"
    assert grappler_origin("ConstantFolding/elsewhere", known) is None


@pytest.mark.reads_cpu
def test_model_fitted_on_a_real_profile_predicts_round_trips_and_checks_the_graph(cnn, tmp_path):
    m, p, ops = cnn
    cm = costmodel.fit_cost_model(p.join(ops), graph=p.meta["graph"])
    with pytest.warns(costmodel.ProfileCoverageWarning, match="never profiled"):
        t = cm.op_times(ops, "CPU")        # initializers never run in a step: counted fallbacks
    measured = p.ops.set_index("name")["seconds"]
    idx = ops["name"].isin(measured.index).to_numpy()
    assert np.array_equal(t[idx], measured.loc[ops["name"][idx]].to_numpy())
    assert np.all(t[~idx] > 0)                 # initializers etc.: estimated, not zero
    assert cm.last_report.counts["profile"] == idx.sum()
    back = costmodel.CostModel.load(cm.save(tmp_path / "cnn.json"), ops=ops)
    with pytest.warns(costmodel.ProfileCoverageWarning):
        assert np.array_equal(back.op_times(ops, "CPU"), t)
    other = op_table(small_cnn(prefix="other").graph_def)
    with pytest.raises(ProfileMismatchError, match="cnn.json.*another graph"):
        costmodel.CostModel.load(tmp_path / "cnn.json", ops=other)
    # The TF adapter schedules with it; the measured memory feeds the simulator.
    placed = place(m.graph_def, ["/device:CPU:0", "/device:CPU:1"], cost_model=back,
                   fetches=[m.train_op.name])
    assert 0 < placed.makespan <= t[idx].sum() * 1.0001
    assert placed.peak_memory.max() > 0


@pytest.mark.reads_cpu
def test_profile_at_one_batch_size_predicts_another():
    """A batch-4 profile predicts the batch-16 graph's ops by their own work ratio.

    Behaviour only: how close that comes to a batch-16 measurement depends on
    the machine's load, and is reported by ``experiments.costmodel_accuracy``.
    """
    small, big = small_cnn(batch=4, size=32, channels=16), small_cnn(batch=16, size=32, channels=16)
    p4 = profile(small, steps=3, warmup=1, progress=False)
    cm = costmodel.fit_cost_model(p4.join(op_table(small.graph_def)), graph=p4.meta["graph"])
    ops16 = op_table(big.graph_def)
    with pytest.warns(costmodel.ProfileCoverageWarning, match="never profiled"):
        pred = cm.op_times(ops16, "CPU")
    assert cm.last_report.counts.get("profile-scaled", 0) > 10
    t4 = p4.ops.set_index("name")["seconds"]
    t4 = t4[t4 > 0]                                   # pruned ops took no time
    heavy = (ops16["op_type"].str.startswith("Conv2D") & ops16["name"].isin(t4.index)).to_numpy()
    assert heavy.sum() >= 4
    # 4x the batch, 4x the FLOPs: each op's time grows above its type's fixed
    # cost, by more than nothing and at most the work ratio.
    ratio = pred[heavy] / t4.loc[ops16["name"][heavy]].to_numpy()
    assert np.all(ratio > 1.0) and np.all(ratio <= 4.0 + 1e-9)
    # The same graph at the profiled batch is predicted by its measured times.
    ops4 = op_table(small.graph_def)
    with pytest.warns(costmodel.ProfileCoverageWarning, match="never profiled"):
        same = cm.op_times(ops4, "CPU")    # initializers never ran in a step
    names4 = ops4["name"]
    timed = names4.isin(t4.index).to_numpy()
    assert np.allclose(same[timed], t4.loc[names4[timed]].to_numpy())


def test_profile_rejects_bad_fetches_and_step_counts():
    m = small_cnn()
    with pytest.raises(GraphError, match="fetch 'nope' is not an op"):
        profile(graph=m.graph, fetches=["nope"], progress=False)
    with pytest.raises(ValueError, match="steps >= 1"):
        profile(m, steps=0, progress=False)


def test_device_busy_splits_a_traced_steps_time_by_device_and_plumbing():
    """Two local CPU devices, a MatMul chain on each and a tensor crossing: each device's
    ops are counted on it; an untraced step is refused."""
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [256, 256])  # fed, so Grappler folds nothing
        with tf.device("/device:CPU:0"):
            a = x
            for _ in range(4):
                a = tf.matmul(a, a) * 1e-3
        with tf.device("/device:CPU:1"):
            b = x + 1.0
            for _ in range(4):
                b = tf.matmul(b, b) * 1e-3
            out = tf.reduce_sum(a + b)
    config = tf1.ConfigProto(device_count={"CPU": 2})
    with tf1.Session(graph=g, config=config) as sess:
        rm = tf1.RunMetadata()
        sess.run(out, {x: np.ones((256, 256), np.float32)},
                 options=tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE), run_metadata=rm)
        busy = device_busy(rm).set_index("device")
        with pytest.raises(GraphError, match="trace_level"):
            device_busy(tf1.RunMetadata())
    cpu0 = [d for d in busy.index if d.endswith("CPU:0")]
    cpu1 = [d for d in busy.index if d.endswith("CPU:1")]
    assert len(cpu0) == 1 and len(cpu1) == 1
    # Each device ran its 4 MatMuls and 4 Muls (CPU:1 its Adds and the Sum too).
    assert busy.ops[cpu0[0]] >= 8 and busy.ops[cpu1[0]] >= 11
    assert (busy.op_seconds > 0).all()
    # Inside one process the tensor crossing costs no timed plumbing; between
    # local_cluster workers it does (test_real_cluster_smoke's --trace).
    assert (busy.comm_seconds >= 0).all()
    # A worker's trace also records each gRPC fetch (RecvTensor, in a device entry
    # of its own, timed while the call was outstanding): neither op nor plumbing.
    rpc = rm.step_stats.dev_stats.add(device=busy.index[0])
    rpc.node_stats.add(node_name="RecvTensor", all_start_micros=1, all_end_rel_micros=10**6,
                       all_end_rel_nanos=10**9, timeline_label="[1024B] edge_1_x from /job:w/task:1")
    again = device_busy(rm).set_index("device")
    pd.testing.assert_frame_equal(again, busy)


def test_transfers_between_two_devices_of_one_process_are_fitted():
    cfg = tf1.ConfigProto(device_count={"CPU": 2})
    devs = ["/device:CPU:0", "/device:CPU:1"]
    df = measure_transfers(devs, sizes=[4, 1 << 20, 4 << 20], repeats=3, warmup=1,
                           session_config=cfg, progress=False)
    assert len(df) == 2 * 3 * 3 and set(df["bytes"]) == {4, 1 << 20, 4 << 20}
    links = costmodel.LinkModel().fit(df).links_
    assert len(links) == 2 and (links["latency"] >= 0).all() and (links["bandwidth"] > 0).all()


@pytest.mark.slow
def test_transfers_between_local_cluster_tasks_grow_with_size():
    with local_cluster(2) as c:
        df = measure_transfers(c.devices, sizes=[4, 16 << 20], repeats=3, warmup=1,
                               target=c.target, progress=False, cpu_pids=c.pids)
    med = df.groupby("bytes")["seconds"].median()
    assert med[16 << 20] > med[4] + 1e-3     # 16 MB over gRPC takes milliseconds
    # The two tasks spend CPU time on moving 16 MB (counted in 10 ms ticks):
    # more than on 4 bytes. (Not a share of the wall time: other processes'
    # load stretches that, not the tasks' CPU time.)
    cpu = df.groupby("bytes")["cpu_seconds"].sum()
    assert cpu[16 << 20] > 0 and cpu[16 << 20] > cpu[4]
    fit = costmodel.LinkModel().fit(df).links_
    assert (fit["bandwidth"] < 1e11).all()


def test_default_model_plans_eight_gpus_from_a_cpu_only_machine():
    """No profile, no GPU: the analytic P100 preset and PCIe links still give a placement."""
    m = small_cnn(batch=32, size=32, channels=32)
    gpus = [f"/device:GPU:{i}" for i in range(8)]
    placed = place(m.graph_def, gpus, fetches=[m.train_op.name])
    assert np.isfinite(placed.makespan) and placed.makespan > 0
    cm = costmodel.default_cost_model()
    assert placed.cluster.latency[0, 1] == cm.link(gpus[0], gpus[1])[0]
    assert (placed.cluster.memory == costmodel.presets["p100"].memory).all()
