"""fddps.tf.variable_shards: variables split by a strategy are written as shard variables.

Each test runs the original and the rewritten GraphDef for real (4 CPU devices
of one process, or the 2-worker local cluster) and compares losses and every
variable's whole value.
"""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from costmodel import default_cost_model  # noqa: E402
from fddps.search.space import unit_splits, writable_strategy  # noqa: E402
from fddps.strategy import (OpConfig, Strategy, StrategyError, parameter_split,  # noqa: E402
                            shard_variables)
from fddps.strategy.strategy import shardable_groups  # noqa: E402
from fddps.tf.float64 import as_float64  # noqa: E402
from fddps.tf.strategy_graph import step_graph  # noqa: E402
from fddps.tf.strategy_rewrite import rewrite_strategy  # noqa: E402
from fddps.tf.variable_shards import gather_variables  # noqa: E402

v1 = tf.compat.v1
CPUS = [f"/device:CPU:{i}" for i in range(4)]
CONFIG = v1.ConfigProto(device_count={"CPU": 4}, allow_soft_placement=False,
                        inter_op_parallelism_threads=2, intra_op_parallelism_threads=1)


def _mlp(optimizer="momentum", batch=6, widths=(10, 12, 9, 5), seed=0):
    """A tanh MLP with biases, random (glorot) initial weights, and an optimizer."""
    g = tf.Graph()
    rng = np.random.default_rng(seed)
    with g.as_default():
        v1.set_random_seed(seed)
        x = tf.constant(rng.standard_normal((batch, widths[0])).astype(np.float32), name="x")
        labels = tf.one_hot(rng.integers(0, widths[-1], batch), widths[-1])
        h = x
        for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
            w = v1.get_variable(f"w{i}", [a, b], use_resource=True,
                                initializer=v1.glorot_uniform_initializer())
            bias = v1.get_variable(f"b{i}", [b], use_resource=True,
                                   initializer=v1.random_normal_initializer())
            h = tf.nn.bias_add(tf.matmul(h, w, name=f"layer{i}"), bias)
            if i < len(widths) - 2:
                h = tf.tanh(h)
        loss = tf.reduce_mean(tf.nn.softmax_cross_entropy_with_logits(labels=labels, logits=h),
                              name="loss")
        opt = {"momentum": lambda: v1.train.MomentumOptimizer(0.1, 0.9),
               "sgd": lambda: v1.train.GradientDescentOptimizer(0.1),
               "adam": lambda: v1.train.AdamOptimizer(0.01)}[optimizer]()
        opt.minimize(loss, name="train")
        v1.global_variables_initializer()
    return g


def _variables(gd):
    return [n.name for n in gd.node if n.op == "VarHandleOp"]


def _run(gd, variables, steps=2, sharded=None, target="", config=CONFIG, feed=None):
    """Initial values, loss per step, values after the steps (each by the variable's own
    ``Read/ReadVariableOp``), and with ``sharded`` the gathered values too. ``feed``:
    fed to every step."""
    with tf.Graph().as_default() as graph:
        tf.graph_util.import_graph_def(gd, name="")
        reads = [f"{v}/Read/ReadVariableOp:0" for v in variables]
        with v1.Session(target, graph=graph, config=config) as sess:
            sess.run("init")
            initial = sess.run(reads)
            losses = [sess.run(["loss:0", "train"], feed_dict=feed)[0] for _ in range(steps)]
            after = sess.run(reads)
            gathered = gather_variables(sess, sharded) if sharded else {}
    return initial, losses, after, gathered


def _sharded_strategy(step, devices):
    """Every MatMul, its gradients and the ops between split by columns, every variable
    (weights, biases, momentum slots) split along its last axis."""
    return shard_variables(step, parameter_split(step, devices, ["MatMul"]), devices)


def _check_shards(gd, sharded, devices):
    """Shard variables hold the share shapes on their devices; no split variable is whole."""
    nodes = {n.name: n for n in gd.node}
    assert sharded
    for name, var in sharded.items():
        assert name not in nodes, f"{name}: the whole variable is still in the graph"
        assert len(var.shards) > 1
        covered = np.zeros(var.shape, dtype=int)
        for shard in var.shards:
            node = nodes[shard.name]
            assert node.op == "VarHandleOp" and node.device == shard.device
            assert node.device in devices
            shape = tuple(d.size for d in node.attr["shape"].shape.dim)
            assert shape == np.empty(var.shape)[shard.slice].shape
            assert shape != var.shape
            covered[shard.slice] += 1
        assert (covered == 1).all(), name  # the shards tile the variable
        devs = [s.device for s in var.shards]
        assert len(set(devs)) == len(devs), name  # one shard per device


@pytest.mark.parametrize("optimizer,k", [("momentum", 2), ("momentum", 4), ("sgd", 2),
                                         ("adam", 4)])
def test_mlp_with_sharded_weights_trains_like_the_original(optimizer, k):
    g = _mlp(optimizer)
    gd = g.as_graph_def()
    before = v1.GraphDef()
    before.CopyFrom(gd)
    fetches = ["train", "loss"]
    step = step_graph(gd, fetches)
    variables = _variables(gd)
    strategy = _sharded_strategy(step, CPUS[:k])
    out, sharded = rewrite_strategy(gd, strategy, fetches, CPUS, return_shards=True)
    assert gd == before  # the user's GraphDef is untouched
    _check_shards(out, sharded, CPUS[:k])
    # Weights, biases and each optimizer slot (momentum; Adam's m and v) are sharded,
    # but for the variable Adam colocates its scalar beta powers with (b0): a group
    # of several shapes, kept whole.
    slots = {"momentum": ["Momentum"], "sgd": [], "adam": ["Adam", "Adam_1"]}[optimizer]
    want_sharded = {f"{p}{i}" + (f"/{s}" if s else "") for p in "wb" for i in range(3)
                    for s in [""] + slots if optimizer != "adam" or f"{p}{i}" != "b0"}
    assert set(sharded) == want_sharded
    ref = _run(gd, variables)
    got = _run(out, variables, sharded=sharded)
    for a, b, v in zip(ref[0], got[0], variables):  # the same initial values
        np.testing.assert_array_equal(b, a, err_msg=v)
    np.testing.assert_allclose(got[1], ref[1], rtol=1e-5)  # loss after 1 and 2 steps
    for a, b, v in zip(ref[2], got[2], variables):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6, err_msg=v)
        if v in sharded:
            np.testing.assert_array_equal(got[3][v], b, err_msg=v)  # gathered == read
    # In float64, where reordered sums cannot hide a mistake: the same step to rounding.
    ref64, got64 = _run(as_float64(gd), variables), _run(as_float64(out), variables)
    assert np.asarray(got64[1]).dtype == np.float64
    np.testing.assert_allclose(got64[1], ref64[1], rtol=1e-10)
    for a, b, v in zip(ref64[2], got64[2], variables):
        np.testing.assert_allclose(b, a, rtol=1e-10, atol=1e-12, err_msg=v)


def test_cnn_with_sharded_filters_trains_like_the_original(cnn_graph, tf_config):
    """The conftest CNN (conv, batch norm with moving averages, pool, dense; momentum):
    convolutions split by output channel with their filters and momentum slots
    sharded (uneven over 4: the dense layer's 5 columns); batch norm's variables,
    updated by ``AssignSubVariableOp``, stay whole."""
    gd = cnn_graph.graph_def
    fetches = ["train", "loss"]
    step = step_graph(gd, fetches)
    groups = shardable_groups(step)
    assert "conv1/moving_mean" not in groups and "conv1/w" in groups
    for k in (2, 4):
        strategy = shard_variables(step, parameter_split(step, CPUS[:k]), CPUS[:k])
        out, sharded = rewrite_strategy(gd, strategy, fetches, CPUS, return_shards=True)
        _check_shards(out, sharded, CPUS[:k])
        assert {"conv1/w", "conv2/w", "fc/w", "conv1/w/Momentum"} <= set(sharded)
        assert "conv1/moving_mean" not in sharded
        variables = _variables(gd)
        config = tf_config(4)
        # In float32 to 1e-5, and in float64 (where reordered sums cannot hide a mistake)
        # to 1e-10.
        for widen, rtol, atol in ((lambda x: x, 1e-5, 1e-6), (as_float64, 1e-10, 1e-12)):
            ref, got = (_run(widen(graph_def), variables, config=config, feed=cnn_graph.feed)
                        for graph_def in (gd, out))
            np.testing.assert_allclose(got[1], ref[1], rtol=rtol)
            for a, b, v in zip(ref[2], got[2], variables):
                np.testing.assert_allclose(b, a, rtol=rtol, atol=atol,
                                           err_msg=f"{k} devices: {v}")


def test_fetch_names_initializers_and_devices_that_ran():
    g = _mlp()
    gd = g.as_graph_def()
    step = step_graph(gd, ["train", "loss"])
    out, sharded = rewrite_strategy(gd, _sharded_strategy(step, CPUS[:2]), ["train", "loss"],
                                    CPUS, return_shards=True)
    nodes = {n.name: n for n in out.node}
    # The step's own read of w0 (what layer0 reads) still gives the whole value.
    assert nodes["layer0/ReadVariableOp"].op == "IdentityN"
    with tf.Graph().as_default() as graph:
        tf.graph_util.import_graph_def(gd, name="")
        with v1.Session(graph=graph, config=CONFIG) as sess:
            sess.run("w0/Assign")  # as below: w0's initializer runs twice (random draws)
            sess.run("init")
            want = sess.run(["layer0/ReadVariableOp:0", "w0/Read/ReadVariableOp:0"])
    with tf.Graph().as_default() as graph:
        tf.graph_util.import_graph_def(out, name="")
        with v1.Session(graph=graph, config=CONFIG) as sess:
            assert not sess.run("w0/IsInitialized/VarIsInitializedOp:0")
            sess.run("w0/Assign")  # one variable's initializer initialises its shards
            assert sess.run("w0/IsInitialized/VarIsInitializedOp:0")
            assert not sess.run("b0/IsInitialized/VarIsInitializedOp:0")
            sess.run("init")
            assert all(sess.run([f"{v}/IsInitialized/VarIsInitializedOp:0" for v in sharded]))
            options = v1.RunOptions(output_partition_graphs=True)
            meta = v1.RunMetadata()
            got = sess.run(["layer0/ReadVariableOp:0", "w0/Read/ReadVariableOp:0"],
                           options=options, run_metadata=meta)
            sess.run("train", options=options, run_metadata=meta)
    for a, b in zip(want, got):
        assert b.shape == (10, 12)
        np.testing.assert_array_equal(b, a)
    ran = {n.name: n.device for part in meta.partition_graphs for n in part.node}
    for var in sharded.values():  # every shard ran where it was placed
        for shard in var.shards:
            assert ran[shard.name].endswith(shard.device.replace("/device:", "device:")), shard


def test_variables_the_rewrite_cannot_shard_are_named():
    g = _mlp()
    with g.as_default():
        handle = g.get_tensor_by_name("w1:0")
        tf.raw_ops.ResourceGather(resource=handle, indices=tf.constant([0, 2]), dtype=tf.float32,
                                  name="lookup")
    gd = g.as_graph_def()
    step = step_graph(gd, ["train", "loss"])
    assert "lookup" in step.ops["w1"].attrs["unshardable"]
    groups = shardable_groups(step)
    assert "w1" not in groups and "w0" in groups
    unit = groups["w0"]
    assert len(unit_splits(step, unit, 2, writable=True)) > 1
    w1_unit = tuple(n for n, op in step.ops.items() if op.tied and op.group == "w1")
    assert unit_splits(step, w1_unit, 2, writable=True) == [{}]
    assert unit_splits(step, unit[:1], 2, writable=True) == [{}]  # not the whole group
    # A strategy that insists: the error names the variable and the op.
    split = {n: OpConfig({"c": 2}, CPUS[:2]) for n in w1_unit}
    with pytest.raises(StrategyError, match="'w1'.*'lookup' \\(ResourceGather"):
        rewrite_strategy(gd, Strategy(split, CPUS[0]), ["train", "loss"], CPUS)
    # writable_strategy keeps it whole, and keeps the shardable ones split.
    insists = shard_variables(step, Strategy({}, CPUS[0]), CPUS[:2])
    fixed = writable_strategy(step, Strategy({**insists.configs, **split}, CPUS[0]))
    assert fixed.config("w1").num_parts == 1 and fixed.config("w0").num_parts == 2
    rewrite_strategy(gd, fixed, ["train", "loss"], CPUS)
    # A split of part of a group is refused (named) as before.
    part = {n: OpConfig({"c": 2}, CPUS[:2]) for n in unit[:1]}
    with pytest.raises(StrategyError, match="configured differently"):
        rewrite_strategy(gd, Strategy(part, CPUS[0]), ["train", "loss"], CPUS)


def test_ref_variables_are_refused_by_name():
    g = tf.Graph()
    with g.as_default():
        v = v1.get_variable("v", [4, 6], use_resource=False)
        loss = tf.reduce_sum(tf.matmul(tf.ones([2, 4]), v), name="loss")
        v1.train.GradientDescentOptimizer(0.1).minimize(loss, name="train")
    step = step_graph(g.as_graph_def(), ["train"])
    assert "v" not in shardable_groups(step)
    with pytest.raises(StrategyError, match="'v' \\(VariableV2\\)"):
        rewrite_strategy(g.as_graph_def(), Strategy({"v": OpConfig({"c": 2}, CPUS[:2])}, CPUS[0]),
                         ["train"], CPUS)


def test_tofu_shards_a_model_over_one_device_and_it_trains_the_same():
    """Weights and momentum slots over one simulated device's capacity: ``tofu`` with
    writable plans shards them, every device fits, and the plan runs like the original."""
    import fddps

    g = _mlp(widths=(64, 256, 256, 10), batch=8)
    gd = g.as_graph_def()
    fetches = ["train", "loss"]
    step = step_graph(gd, fetches)
    cm = default_cost_model("p100")
    weights = sum(op.param_bytes for op in step.ops.values())  # weights and momentum slots
    capacity = 0.6 * weights
    with pytest.raises(fddps.errors.InfeasibleError):
        fddps.place(gd, CPUS[:1], cost_model=cm, memory=capacity, fetches=fetches,
                    algorithm="tofu")
    p = fddps.place(gd, CPUS, cost_model=cm, memory=capacity, fetches=fetches, algorithm="tofu")
    assert (p.peak_memory.to_numpy() <= capacity).all()
    sharded = p.sharded_variables
    assert {"w1", "w1/Momentum"} <= set(sharded)  # the 256x256 weight and its slot
    _check_shards(p.graph_def, sharded, CPUS)
    variables = _variables(gd)
    ref = _run(gd, variables)
    got = _run(p.graph_def, variables, sharded=sharded)
    np.testing.assert_allclose(got[1], ref[1], rtol=1e-5)
    for a, b, v in zip(ref[2], got[2], variables):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6, err_msg=v)


@pytest.mark.slow
def test_sharded_variables_train_across_two_workers():
    from fddps.tf import local_cluster

    g = _mlp()
    gd = g.as_graph_def()
    step = step_graph(gd, ["train", "loss"])
    variables = _variables(gd)
    ref = _run(gd, variables)
    with local_cluster(2, threads_per_worker=1) as cluster:
        out, sharded = rewrite_strategy(gd, _sharded_strategy(step, cluster.devices),
                                        ["train", "loss"], cluster.devices, return_shards=True)
        _check_shards(out, sharded, cluster.devices)
        got = _run(out, variables, sharded=sharded, target=cluster.target,
                   config=cluster.session_config())
    np.testing.assert_allclose(got[1], ref[1], rtol=1e-5)
    for a, b, v in zip(ref[2], got[2], variables):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6, err_msg=v)


def test_a_checkpoint_of_the_placed_graph_restores_into_the_original(tmp_path):
    """The graph's own ``Saver`` ops run per shard: saving reads each variable whole
    (its shards concatenated), restoring slices the saved value over the shards; so a
    checkpoint written by the placed graph restores into the original, and back."""
    g = _mlp()
    with g.as_default():
        v1.train.Saver(name="save")
    gd = g.as_graph_def()
    step = step_graph(gd, ["train", "loss"])
    out, sharded = rewrite_strategy(gd, _sharded_strategy(step, CPUS[:2]), ["train", "loss"],
                                    CPUS, return_shards=True)
    assert {"w0", "w0/Momentum"} <= set(sharded)
    reads = [f"{v}/Read/ReadVariableOp:0" for v in _variables(gd)]
    path = str(tmp_path / "ckpt")

    def session(graph_def):
        graph = tf.Graph()
        with graph.as_default():
            tf.graph_util.import_graph_def(graph_def, name="")
        return v1.Session(graph=graph, config=CONFIG)

    with session(out) as sess:
        sess.run("init")
        sess.run("train")
        want = sess.run(reads)
        sess.run("save/control_dependency:0", {"save/Const:0": path})
    with session(gd) as sess:
        sess.run("save/restore_all", {"save/Const:0": path})
        for a, b in zip(want, sess.run(reads)):
            np.testing.assert_array_equal(b, a)
        sess.run("train")
        path2 = str(tmp_path / "ckpt2")
        sess.run("save/control_dependency:0", {"save/Const:0": path2})
        again = sess.run(reads)
    with session(out) as sess:
        sess.run("save/restore_all", {"save/Const:0": path2})
        for a, b in zip(again, sess.run(reads)):
            np.testing.assert_array_equal(b, a)
        gathered = gather_variables(sess, sharded, ["w0"])
    np.testing.assert_array_equal(gathered["w0"], again[_variables(gd).index("w0")])


@pytest.mark.parametrize("split", [{"n": 2}, {"n": 2, "c": 2}])
def test_rows_and_grids_of_shards_with_whole_readers_gather(split):
    """A weight split by rows, or in a 2x2 grid, read by whole MatMuls: each reader
    gathers the shards (a ConcatV2 tree), the update still runs per shard."""
    g = _mlp()
    gd = g.as_graph_def()
    step = step_graph(gd, ["train", "loss"])
    k = int(np.prod(list(split.values())))
    group = [n for n, op in step.ops.items() if op.tied and op.group == "w1"]
    strategy = Strategy({n: OpConfig(split, CPUS[:k]) for n in group}, CPUS[0])
    out, sharded = rewrite_strategy(gd, strategy, ["train", "loss"], CPUS, return_shards=True)
    assert set(sharded) == {"w1", "w1/Momentum"}
    _check_shards(out, sharded, CPUS[:k])
    nodes = {n.name: n for n in out.node}
    assert any(i.startswith("layer1/ReadVariableOp/fddps_whole") for i in nodes["layer1"].input)
    variables = _variables(gd)
    ref, got = _run(gd, variables), _run(out, variables, sharded=sharded)
    np.testing.assert_allclose(got[1], ref[1], rtol=1e-5)
    for a, b, v in zip(ref[2], got[2], variables):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6, err_msg=v)
