"""The vertex-elimination DP (fddps.search.pase): every op in the objective, the paper's
multi-dimensional configurations, tables equal to the strategy's additive cost, exact
elimination (brute force on random DAGs), table sizes refused before costing, re-timing."""

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from costmodel import default_cost_model
from fddps.search import pase_edges
from fddps.search.base import SearchError
from fddps.search.pase import PaseSearch, _run, dfs_order, eliminate, paper_order, runner_up
from fddps.search.pase_tables import additive_cost, build_tables, edges_between, tables_cost
from fddps.search.pase_vertices import coarsen, factor_tuples, vertex_configs
from fddps.strategy import OpConfig, Strategy, validate
from fddps.strategy.graph import OpInfo, StepGraph

GPUS = [f"/device:GPU:{i}" for i in range(4)]
CM = default_cost_model("p100")


def _tensor(name, op_type, inputs, in_shapes, out_shape, flops=0.0, **kw):
    nbytes = lambda s: 4.0 * float(np.prod(s))  # noqa: E731
    return OpInfo(name, op_type, inputs=tuple((i, 0) for i in inputs),
                  input_shapes=tuple(in_shapes), output_shapes=(out_shape,),
                  input_itemsizes=(4,) * len(in_shapes), output_itemsizes=(4,), flops=flops,
                  input_bytes=sum(nbytes(s) for s in in_shapes), output_bytes=nbytes(out_shape),
                  **kw)


def random_dag(kinds, picks, batch=8, width=16):
    """A step of MatMuls (each with its weight constant), element-wise ops and joins
    (``AddV2`` of two earlier tensors): branches and joins as ``picks`` choose."""
    shape = (batch, width)
    ops = [_tensor("x", "Const", (), (), shape)]
    tensors = ["x"]
    for i, (kind, pick) in enumerate(zip(kinds, picks)):
        a = tensors[pick[0] % len(tensors)]
        name = f"{kind}{i}"
        if kind == "MatMul":
            ops.append(_tensor(f"w{i}", "Const", (), (), (width, width)))
            ops.append(_tensor(name, "MatMul", (a, f"w{i}"), (shape, (width, width)), shape,
                               flops=2.0 * batch * width * width,
                               attrs={"transpose_a": False, "transpose_b": False}))
        elif kind == "AddV2" and len(tensors) > 1:
            b = tensors[pick[1] % len(tensors)]
            if b == a:
                b = tensors[(pick[1] + 1) % len(tensors)]
            ops.append(_tensor(name, "AddV2", (a, b), (shape, shape), shape,
                               flops=float(batch * width)))
        else:
            ops.append(_tensor(name, "Tanh", (a,), (shape,), shape, flops=4.0 * batch * width))
        tensors.append(name)
    return StepGraph(ops)


def _brute_force(unary, pairwise):
    sizes = [len(u) for u in unary]
    total = np.zeros(sizes)
    for v, u in enumerate(unary):
        shape = [1] * len(sizes)
        shape[v] = sizes[v]
        total = total + u.reshape(shape)
    for (a, b), t in pairwise.items():
        shape = [1] * len(sizes)
        shape[a], shape[b] = sizes[a], sizes[b]
        total = total + t.reshape(shape)
    return float(total.min())


def _space(step, k, powers_of_two=False):
    devices = GPUS[:k]
    vertices = coarsen(step)
    configs = [vertex_configs(step, v, devices, powers_of_two=powers_of_two) for v in vertices]
    return devices, vertices, configs


def _strategy(step, configs, choice, devices):
    chosen = {}
    for cfgs, c in zip(configs, choice):
        chosen.update(cfgs[c][1])
    return Strategy(chosen, devices[0])


def _assert_same_tables(got, want):
    """Bit for bit: the vectorised edge tables against the record-by-record costing."""
    (u1, p1), (u2, p2) = got, want
    assert len(u1) == len(u2) and all(np.array_equal(a, b) for a, b in zip(u1, u2))
    assert list(p1) == list(p2)
    for k in p2:
        assert p1[k].shape == p2[k].shape and np.array_equal(p1[k], p2[k]), k


dag = st.tuples(
    st.lists(st.sampled_from(["MatMul", "Tanh", "AddV2"]), min_size=2, max_size=5),
    st.lists(st.tuples(st.integers(0, 9), st.integers(0, 9)), min_size=5, max_size=5),
    st.integers(2, 4))


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(dag, st.randoms(use_true_random=False))
def test_pase_equals_brute_force_and_tables_equal_the_strategy_cost(drawn, rnd):
    kinds, picks, k = drawn
    step = random_dag(kinds, picks)
    devices, vertices, configs = _space(step, k, powers_of_two=k == 4)
    sizes = [len(c) for c in configs]
    if np.prod(sizes, dtype=np.float64) > 3e5:  # keep brute force cheap
        vertices, configs = vertices[:1], configs[:1]
        step = StepGraph([step.ops[n] for n in step.ops])
    cluster = CM.cluster(devices)
    unary, pairwise = build_tables(step, cluster, CM, vertices, configs)
    _assert_same_tables((unary, pairwise),
                        build_tables(step, cluster, CM, vertices, configs, vectorised=False))
    if len(vertices) == len(coarsen(step)):
        want = _brute_force(unary, pairwise)
        edges = list(pairwise)
        for order in (paper_order(len(vertices), edges), dfs_order(len(vertices), edges)):
            cost, choice = eliminate(unary, pairwise, order=order)
            assert cost == pytest.approx(want, rel=1e-12, abs=1e-15)
            assert tables_cost(unary, pairwise, choice) == pytest.approx(want, rel=1e-12)
            # Runner-ups re-eliminate only what a banned choice reaches: the same answer
            # as eliminating from scratch.
            _, _, steps = _run(unary, pairwise, sizes, order)
            for v in range(len(unary)):
                banned = list(unary)
                banned[v] = unary[v].copy()
                banned[v][choice[v]] = np.inf
                fresh = eliminate(banned, pairwise, order=order)
                assert _run(banned, pairwise, sizes, order, base=steps, changed=v)[:2] == fresh
                assert runner_up(unary, pairwise, sizes, order, steps, v, banned[v]) == fresh[1]
                assert runner_up(unary, pairwise, sizes, order, steps, v, banned[v],
                                 base_choice=choice) == fresh[1]
    # Tables equal the independent additive cost of whole strategies, at random
    # choices and at every choice of one vertex with the rest random.
    vertex_of = {n: i for i, vtx in enumerate(vertices) for n in vtx}
    if set(vertex_of) != set(step.ops):
        return
    for trial in range(4):
        choice = [rnd.randrange(len(c)) for c in configs]
        s = _strategy(step, configs, choice, devices)
        validate(s, step, devices)
        total, terms = additive_cost(step, cluster, CM, vertices, s)
        assert tables_cost(unary, pairwise, choice) == pytest.approx(total, rel=1e-9, abs=1e-15)
        for v, t in enumerate(unary):
            assert terms.get(frozenset((v,)), 0.0) == pytest.approx(t[choice[v]], rel=1e-9,
                                                                    abs=1e-15)


def test_configurations_split_every_dimension_at_once_with_partial_sums():
    step = random_dag(["MatMul", "Tanh"], [(0, 0), (1, 0)])
    devices, vertices, configs = _space(step, 4)
    mm = next(i for i, v in enumerate(vertices) if "MatMul0" in v)
    labels = [label for label, _ in configs[mm]]
    # Whole on each device, every factor tuple of (n, k, c) with product <= 4.
    assert labels[:4] == [f"whole@{d}" for d in devices]
    assert {"n2c2", "n2k2", "c2k2", "k4", "n3", "c4"} <= set(labels)
    assert len(labels) == 4 + len(factor_tuples([8, 16, 16], 4))
    cfgs = dict(configs[mm])
    # The reduction dimension k split: MatMul's parts hold partial sums, the Tanh
    # it feeds (folded into the vertex) follows the output layout (n, c) only, each part
    # on the device of the MatMul part with the same columns and the first k.
    assert cfgs["c2k2"]["MatMul0"] == OpConfig({"k": 2, "c": 2}, devices[:4])
    assert cfgs["c2k2"]["Tanh1"] == OpConfig({"c": 2}, (devices[0], devices[2]))
    assert cfgs["n2c2"]["Tanh1"] == OpConfig({"n": 2, "c": 2}, devices[:4])
    assert factor_tuples([8, 16, 16], 8, powers_of_two=True) == [
        t for t in factor_tuples([8, 16, 16], 8) if all(f & (f - 1) == 0 for f in t)]


tf = pytest.importorskip("tensorflow")


@pytest.fixture(scope="module")
def mlp():
    from fddps.tf.strategy_graph import step_graph

    g = tf.Graph()
    with g.as_default():
        rng = np.random.default_rng(0)
        x = tf.constant(rng.standard_normal((64, 32)).astype(np.float32))
        labels = tf.one_hot(tf.constant(np.arange(64) % 10), 10)
        h = x
        for i, width in enumerate((64, 64, 10)):
            w = tf.compat.v1.get_variable(f"w{i}", [int(h.shape[-1]), width], use_resource=True)
            b = tf.compat.v1.get_variable(f"b{i}", [width], use_resource=True)
            h = tf.nn.bias_add(tf.matmul(h, w), b)
            if i < 2:
                h = tf.nn.relu(h)
        loss = tf.reduce_mean(tf.nn.softmax_cross_entropy_with_logits(labels=labels, logits=h),
                              name="loss")
        train = tf.compat.v1.train.MomentumOptimizer(0.1, 0.9).minimize(loss, name="train")
    return step_graph(g.as_graph_def(), [train.name, "loss:0"])


def test_every_op_is_in_a_vertex_and_every_tensor_between_vertices_an_edge(mlp):
    vertices = coarsen(mlp)
    names = [n for v in vertices for n in v]
    assert sorted(names) == sorted(mlp.ops) and len(names) == len(set(names))
    vertex_of = {n: i for i, v in enumerate(vertices) for n in v}
    everything = edges_between(mlp, vertex_of, scalar_edges=True)
    edges = edges_between(mlp, vertex_of)
    for name, op in mlp.ops.items():
        for src, port in op.inputs:
            if vertex_of[src] != vertex_of[name]:
                pair = tuple(sorted((vertex_of[src], vertex_of[name])))
                assert name in everything[pair]
                shape = mlp.ops[src].output_shapes[port]
                if np.prod(shape) > 8:  # scalars alone make no edge unless asked
                    assert name in edges[pair]
    assert set(edges) <= set(everything)
    # The three layers (forward, gradients, variables, slots) are three vertices; the
    # scalar arithmetic of the loss's gradient is in the vertex it serves, not a decision.
    layers = [v for v in vertices if any(mlp.ops[n].op_type == "MatMul" for n in v)]
    assert len(layers) == 3
    for v in vertices:
        assert any(mlp.ops[n].flops > 0 or mlp.ops[n].param_bytes > 0 for n in v), v


def test_a_vertex_configures_its_gradients_and_variables_alike(mlp):
    devices, vertices, configs = _space(mlp, 4)
    layer = next(v for v in vertices if "MatMul_1" in v)
    cfgs = dict(configs[vertices.index(layer)])
    grads = {mlp.ops[n].attrs.get("transpose_a"): n for n in layer
             if mlp.ops[n].op_type == "MatMul" and n.startswith("gradients")}
    var = next(n for n in layer if mlp.ops[n].op_type == "VarHandleOp" and "w1" in n)
    # The layer's (n, k, c) = (64, 64, 64) split (1, 2, 2): the forward MatMul by k and c,
    # the input gradient (dy @ w^T: its n, k, c are the layer's n, c, k) by c and k, the
    # weight gradient (x^T @ dy: the layer's k, n, c) by n (its rows: the layer's k) and c,
    # and the weight, its slot and its update by rows and columns as the weight gradient.
    c = cfgs["c2k2"]
    assert c["MatMul_1"].split == {"k": 2, "c": 2}
    assert c[grads[False]].split == {"k": 2, "c": 2}
    assert c[grads[True]].split == {"n": 2, "c": 2}
    assert c[var].split == {"n": 2, "c": 2} and c[var].devices == c[grads[True]].devices
    s = _strategy(mlp, configs, [len(x) - 1 for x in configs], devices)
    validate(s, mlp, devices)


def test_vertex_configs_with_a_shared_memo_are_the_same_configurations(mlp):
    # vertex_configs(memo=...) makes each equal configuration once for all the vertices of
    # a space (PaseSearch.space): the same labels, splits and devices as without, per op,
    # and equal configurations one object (the whole ones on a device, a layer's splits).
    devices = GPUS[:4]
    vertices = coarsen(mlp)
    memo = {}
    shared = [vertex_configs(mlp, v, devices, memo=memo) for v in vertices]
    alone = [vertex_configs(mlp, v, devices) for v in vertices]
    for a, b in zip(shared, alone):
        assert [label for label, _ in a] == [label for label, _ in b]
        for (_, x), (_, y) in zip(a, b):
            assert list(x) == list(y)
            assert all(x[n].split == y[n].split and x[n].devices == y[n].devices for n in x)
    objects = {id(c) for cfgs in shared for _, x in cfgs for c in x.values()}
    assert len(objects) < len({id(c) for cfgs in alone for _, x in cfgs for c in x.values()})
    whole = [x for cfgs in shared for label, x in cfgs if label == f"whole@{devices[1]}"]
    assert len({id(c) for x in whole for c in x.values()}) == 1


class _Refuse:
    def op_times(self, *a, **k):
        raise AssertionError("costed before the table sizes were checked")

    memory = op_times


def test_table_sizes_are_refused_before_any_cost_naming_the_vertex(mlp):
    with pytest.raises(SearchError, match=r"vertex '.+' \(\d+ ops\) would need a table of \d+ "
                                          r"entries \(\d+ unprocessed neighbours, \d+ configurations"):
        PaseSearch(max_table=50).fit(mlp, CM.cluster(GPUS), _Refuse())
    with pytest.raises(SearchError, match="option 'order' must be one of best, paper, dfs"):
        PaseSearch(order="bfs")


def test_pase_returns_the_fastest_simulated_and_never_loses_to_the_baselines(mlp):
    from fddps.search import StrategyEvaluator

    cluster = CM.cluster(GPUS[:2])
    r = PaseSearch().fit(mlp, cluster, CM)
    sim = r.info["simulated"]
    assert {"pase", "data parallel", "fddps", "one device"} <= set(sim)
    assert r.makespan == min(sim.values()) and r.info["returned"] in sim
    assert r.makespan <= sim["data parallel"] and r.makespan <= sim["fddps"]
    assert r.info["pase_simulated"] == sim["pase"]
    assert r.info["additive"]["pase"] == pytest.approx(r.info["additive_cost"], rel=1e-12)
    assert r.info["order"] in ("paper", "dfs")
    assert r.info["largest_table"][r.info["order"]] == min(r.info["largest_table"].values())
    validate(r.strategy, mlp, GPUS[:2])
    assert StrategyEvaluator(mlp, cluster, CM).full(r.strategy).makespan == r.makespan
    # The tables' optimum is the brute-force optimum on this real step.
    devices, vertices, configs = _space(mlp, 2)
    unary, pairwise = build_tables(mlp, cluster, CM, vertices, configs)
    assert np.prod([len(c) for c in configs]) < 5e6
    assert r.info["additive_cost"] == pytest.approx(_brute_force(unary, pairwise), rel=1e-12)
    choice = list(itertools.repeat(0, len(configs)))
    total, _ = additive_cost(mlp, cluster, CM, vertices, _strategy(mlp, configs, choice, devices))
    assert tables_cost(unary, pairwise, choice) == pytest.approx(total, rel=1e-9)



def test_runner_up_tries_caps_the_bans_and_keeps_the_answer(mlp):
    with pytest.raises(SearchError, match="option 'runner_up_tries' must be a positive integer"):
        PaseSearch(runner_up_tries=0)
    cluster = CM.cluster(GPUS[:2])
    every = PaseSearch(runner_up_tries=None, retime=50).fit(mlp, cluster, CM)
    capped = PaseSearch(runner_up_tries=2, retime=50).fit(mlp, cluster, CM)
    assert every.info["runner_up_tries"] > 2 == capped.info["runner_up_tries"]
    runners = [k for k in capped.info["simulated"] if k.startswith("pase runner-up")]
    assert 1 <= len(runners) <= 2
    # The DP's answer and the first runners-up are the same; only later ones are left out.
    for k in ["pase"] + runners:
        assert capped.info["simulated"][k] == every.info["simulated"][k]

def test_the_experiment_writes_its_table(tmp_path):
    from experiments import pase as experiment

    df = experiment.main(["--models", "alexnet", "--alexnet-devices", "2", "--batch", "4",
                          "--alexnet-dataset", "cifar10", "--flexflow-budget", "0.5",
                          "--main", "", "--out", str(tmp_path)])
    assert list(df["strategy"]) == ["data parallel", "fddps", "pase", "flexflow"]
    pase = df[df["strategy"] == "pase"].iloc[0]
    assert pase["step_ms"] <= df["step_ms"].iloc[:2].min() + 1e-9
    assert pase["returned"] in ("pase", "data parallel", "fddps", "one device") or \
        pase["returned"].startswith("pase runner-up")
    # The same DP timed again in a fresh process of this checkout, as `pase (before)` is.
    assert pase["fresh_s"] > 0
    text = (tmp_path / "pase.md").read_text()
    assert "| alexnet | 2 | 4 | 32 | pase |" in text and "cores" in text and "fresh_s" in text


def _small_cnn(batch=8, width=8):
    """Convolutions (halo rows), batch norm (statistics exchanged), pooling, a dense layer."""
    from fddps.tf.strategy_graph import step_graph

    g = tf.Graph()
    with g.as_default():
        x = tf.constant(np.random.default_rng(1).standard_normal((batch, 8, 8, 3)).astype(np.float32))
        labels = tf.one_hot(tf.constant(np.arange(batch) % 5), 5)
        w1 = tf.compat.v1.get_variable("w1", [3, 3, 3, width], use_resource=True)
        w2 = tf.compat.v1.get_variable("w2", [3, 3, width, width], use_resource=True)
        w3 = tf.compat.v1.get_variable("w3", [4 * 4 * width, 5], use_resource=True)
        gamma = tf.compat.v1.get_variable("gamma", [width], use_resource=True)
        beta = tf.compat.v1.get_variable("beta", [width], use_resource=True)
        h, _, _ = tf.compat.v1.nn.fused_batch_norm(tf.nn.conv2d(x, w1, 1, "SAME"), gamma, beta,
                                                   is_training=True)
        h = tf.nn.max_pool2d(tf.nn.relu(h), 2, 2, "VALID")
        h = tf.nn.relu(tf.nn.conv2d(h, w2, 1, "SAME"))
        loss = tf.reduce_mean(tf.nn.softmax_cross_entropy_with_logits(
            labels=labels, logits=tf.matmul(tf.reshape(h, [batch, -1]), w3)), name="loss")
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, name="train")
    return step_graph(g.as_graph_def(), [train.name, "loss:0"])


@pytest.mark.parametrize("k", [3, 4])
def test_vectorised_edge_tables_equal_the_record_by_record_costing(mlp, k, monkeypatch):
    # Same floats, so the DP's answer cannot change: splits of every dimension (partial
    # sums, halos, batch-norm statistics, slices and concatenations) at 3 and 4 devices,
    # by the arrays the vertex tables use (pase_vertex_tables.edge_table) and by the
    # older vectorised path (pase_edges.edge_table), which the first falls back to.
    from fddps.search import pase_tables, pase_vertex_tables

    made, older = [], []

    def array_edge_table(*args, **kw):
        made.append(pase_vertex_tables.edge_table(*args, **kw))
        return made[-1]

    def edge_table(*args, **kw):
        older.append(pase_edges.edge_table(*args, **kw))
        return older[-1]

    monkeypatch.setattr(pase_tables, "array_edge_table", array_edge_table)
    for step in (mlp, _small_cnn(), _resnet_block()):
        devices, vertices, configs = _space(step, k)
        cluster = CM.cluster(devices)
        _assert_same_tables(build_tables(step, cluster, CM, vertices, configs),
                            build_tables(step, cluster, CM, vertices, configs, vectorised=False))
    assert made and all(t is not None for t in made)  # no edge fell back
    monkeypatch.setattr(pase_tables, "array_edge_table", lambda *a, **kw: None)
    monkeypatch.setattr(pase_tables, "edge_table", edge_table)
    step = _small_cnn()
    devices, vertices, configs = _space(step, k)
    cluster = CM.cluster(devices)
    _assert_same_tables(build_tables(step, cluster, CM, vertices, configs),
                        build_tables(step, cluster, CM, vertices, configs, vectorised=False))
    assert older and all(t is not None for t in older)


def _resnet_block(batch=4, width=8):
    """A residual block with batch norm after each convolution (statistics split by
    sample), a strided convolution (halo), a shortcut join and a dense head."""
    from fddps.tf.strategy_graph import step_graph

    g = tf.Graph()
    with g.as_default():
        x = tf.constant(np.random.default_rng(2).standard_normal((batch, 8, 8, width))
                        .astype(np.float32))
        labels = tf.one_hot(tf.constant(np.arange(batch) % 3), 3)

        def bn(h, name):
            gamma = tf.compat.v1.get_variable(f"{name}_g", [width], use_resource=True)
            beta = tf.compat.v1.get_variable(f"{name}_b", [width], use_resource=True)
            return tf.compat.v1.nn.fused_batch_norm(h, gamma, beta, is_training=True)[0]

        w1 = tf.compat.v1.get_variable("w1", [3, 3, width, width], use_resource=True)
        w2 = tf.compat.v1.get_variable("w2", [3, 3, width, width], use_resource=True)
        w3 = tf.compat.v1.get_variable("w3", [4 * 4 * width, 3], use_resource=True)
        h = tf.nn.relu(bn(tf.nn.conv2d(x, w1, 1, "SAME"), "bn1"))
        h = tf.nn.relu(bn(tf.nn.conv2d(h, w2, 1, "SAME"), "bn2") + x)
        h = tf.nn.max_pool2d(h, 2, 2, "VALID")
        loss = tf.reduce_mean(tf.nn.softmax_cross_entropy_with_logits(
            labels=labels, logits=tf.matmul(tf.reshape(h, [batch, -1]), w3)), name="loss")
        train = tf.compat.v1.train.MomentumOptimizer(0.1, 0.9).minimize(loss, name="train")
    return step_graph(g.as_graph_def(), [train.name, "loss:0"])


@pytest.mark.parametrize("k", [2, 3, 4])
def test_vectorised_vertex_tables_equal_the_record_by_record_costing(mlp, k, monkeypatch):
    # Every vertex's table costed for all its configurations at once: the same floats as
    # expanding each configuration's records (tasks at their parts' shapes, halos, batch
    # norm's statistics passes and exchanges, partial sums, slices, concatenations), so the
    # DP's answer cannot change; and no vertex fell back to the records.
    from fddps.search import pase_tables, pase_vertex_tables

    made = []

    def vertex_table(*args, **kw):
        made.append(pase_vertex_tables.vertex_table(*args, **kw))
        return made[-1]

    monkeypatch.setattr(pase_tables, "vertex_table", vertex_table)
    steps = [mlp, _small_cnn(), _resnet_block()]
    if k == 2:
        from experiments.pase import build_step

        steps.append(build_step("alexnet", k, "cifar10", batch=4, alexnet_dataset="cifar10")[0])
    for step in steps:
        devices, vertices, configs = _space(step, k)
        cluster = CM.cluster(devices)
        _assert_same_tables(build_tables(step, cluster, CM, vertices, configs),
                            build_tables(step, cluster, CM, vertices, configs, vectorised=False))
    assert made and all(t is not None for t in made)


def _geometry_calls(step, k):
    """Every ``_feed_geometry`` call of one table build of ``step`` at ``k`` devices: its
    arguments (the feeds of the vertex and edge tables)."""
    from fddps.search import pase_vertex_tables as pvt

    calls, real = [], pvt._feed_geometry

    def spy(*args, **kwargs):
        calls.append(args)  # (the build's memo left out: each call alone)
        return real(*args, **kwargs)

    devices, vertices, configs = _space(step, k)
    pvt._feed_geometry = spy
    try:
        build_tables(step, CM.cluster(devices), CM, vertices, configs)
    finally:
        pvt._feed_geometry = real
    return calls


def _same_geometry(a, b):
    """Field by field, bit for bit (arrays: dtype, shape and values; None where None)."""
    if a is None or b is None:
        return a is b
    if isinstance(a, tuple):
        return isinstance(b, tuple) and len(a) == len(b) and all(
            _same_geometry(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    return a == b


@pytest.mark.parametrize("k", [3, 4])
@pytest.mark.parametrize("paired", [False, True])
def test_table_driven_feed_geometry_equals_the_cell_by_cell_intersections(k, paired,
                                                                           monkeypatch):
    # pase_vertex_tables._feed_geometry takes each part's shared elements with each piece
    # from per-axis overlap tables of the distinct intervals (spread over every pair of
    # groups at once where nearly all pairs are items); _feed_geometry_cells intersects
    # every (item, part, piece) box axis by axis. Same transfers, piece counts and rows,
    # bit for bit, on every feed of two small CNNs, for the build's own items (cross
    # products and vertex configurations) and for random pairs of groups (the per-item
    # path) and all pairs (the cross path), convolutions' halos and partial sums included.
    # ``paired``: the two halves' tables multiplied before the gather at any size (else
    # never).
    from fddps.search import pase_vertex_tables as pvt

    monkeypatch.setattr(pvt, "_PAIRED_CELLS", 0 if paired else 1 << 62)
    rng = np.random.default_rng(k)
    calls = _geometry_calls(_small_cnn(), k) + _geometry_calls(_resnet_block(), k)
    assert len(calls) > 20
    paths = set()
    for pc, inbox, og, lat, inv, gid, sg in calls:
        K, Kp = og.valid.shape[0], pc.K
        every = np.arange(K * Kp)
        some = np.sort(rng.choice(every, size=min(len(every), 1 + len(every) // 4),
                                  replace=False))
        for g, s in ((gid, sg), (every // Kp, every % Kp), (some // Kp, some % Kp)):
            paths.add(2 * len(g) >= K * Kp)
            fast = pvt._feed_geometry(pc, inbox, og, lat, inv, g, s)
            assert _same_geometry(fast, pvt._feed_geometry_cells(pc, inbox, og, lat, inv, g, s))
    assert paths == {True, False}  # both ways of spreading the tables were compared


@pytest.mark.parametrize("Q", [1, 2, 3, 4, 8, 16])
def test_pieces_met_counts_and_finds_the_first_piece_as_sum_and_argmax(Q):
    # _pieces_met reads a part's 2, 4 or 8 booleans as one integer (its set bits: the
    # pieces met); the other counts take numpy's reductions. Both as sum and argmax,
    # with no piece, every piece and one piece met.
    from fddps.search.pase_vertex_tables import _pieces_met

    rng = np.random.default_rng(Q)
    for share in (0.0, 0.2, 0.7, 1.0):
        hit = rng.random((50, 8, Q)) < share
        hit[0, :, :] = np.eye(8, Q, dtype=bool)
        count, one = _pieces_met(hit)
        assert count.dtype == one.dtype == np.int64
        assert np.array_equal(count, hit.sum(axis=2))
        assert np.array_equal(one, hit.argmax(axis=2))


def test_feed_geometry_comparison_fails_when_one_cell_differs(monkeypatch):
    # The pin above can fail: one cell's shared elements off by one (a transfer's bytes)
    # makes the geometry differ from the cell-by-cell one, and the tables differ from the
    # record-by-record costing; a box too large for exact float products (2**53 elements)
    # takes the cell-by-cell path.
    from fddps.search import pase_vertex_tables as pvt

    step = _small_cnn()
    calls = _geometry_calls(step, 2)
    real = pvt._elements

    def off_by_one(pc, inbox, og, gid, sg, memo=None):
        el = np.array(real(pc, inbox, og, gid, sg, memo=memo))
        met = np.flatnonzero(el > 0)
        if len(met):
            el.reshape(-1)[met[-1]] += 1.0
        return el

    monkeypatch.setattr(pvt, "_elements", off_by_one)
    moved = [c for c in calls if pvt._feed_geometry_cells(*c)[1] is not None]
    assert moved and not all(_same_geometry(pvt._feed_geometry(*c), pvt._feed_geometry_cells(*c))
                             for c in moved)
    devices, vertices, configs = _space(step, 2)
    cluster = CM.cluster(devices)
    with pytest.raises(AssertionError):
        _assert_same_tables(build_tables(step, cluster, CM, vertices, configs),
                            build_tables(step, cluster, CM, vertices, configs, vectorised=False))
    monkeypatch.setattr(pvt, "_elements", real)
    # Scaled by 2**20 per axis, a rank-4 box passes 2**53 elements: the cell-by-cell path.
    pc, inbox, og, lat, inv, gid, sg = next(c for c in calls if c[1][0].shape[2] == 4)
    big = 2 ** 20
    pc2 = type(pc).__new__(type(pc))
    pc2.__dict__.update({a: v for a, v in pc.__dict__.items() if a != "_intervals"})
    pc2.lo, pc2.hi = pc.lo * big, pc.hi * big
    inbox2 = (inbox[0] * big, inbox[1] * big)
    monkeypatch.setattr(pvt, "_elements", lambda *a: pytest.fail("took the tables"))
    assert _same_geometry(pvt._feed_geometry(pc2, inbox2, og, lat, inv, gid, sg),
                          pvt._feed_geometry_cells(pc2, inbox2, og, lat, inv, gid, sg))


def test_part_kernel_shapes_kept_across_ops_equal_each_cells_own():
    # _kernel_shapes keeps each part's kernel shape by the op's type, attributes, boxes'
    # extents and halo splits, across the ops of a build (a convolution and its gradients,
    # repeated layers): every kept cell's shape is still what part_kernel_shape gives
    # that cell's own boxes, and the memo spares calls.
    from fddps.search import pase_vertex_tables as pvt
    from fddps.strategy.kernel_shape import part_kernel_shape

    calls, made, real = [], [0], pvt._kernel_shapes

    def spy(op, dims, og, ins, outs, keep, memo=None):
        got = real(op, dims, og, ins, outs, keep, memo)
        calls.append((op, dims, og, ins, outs, keep, got))
        return got

    def counting(*args):
        made[0] += 1
        return part_kernel_shape(*args)

    step = _small_cnn()
    devices, vertices, configs = _space(step, 4)
    pvt._kernel_shapes, pvt.part_kernel_shape = spy, counting
    try:
        build_tables(step, CM.cluster(devices), CM, vertices, configs)
    finally:
        pvt._kernel_shapes, pvt.part_kernel_shape = real, part_kernel_shape
    cells = 0
    for op, dims, og, ins, outs, keep, got in calls:
        if got is None:
            assert op.kernel_shape is None
            continue
        for (g, p), shape in zip(zip(*np.nonzero(keep)), got):
            if not og.split[g]:
                assert shape == op.kernel_shape
                continue
            box = lambda lo, hi: tuple(zip(lo[g, p].tolist(), hi[g, p].tolist()))  # noqa: E731
            want = part_kernel_shape(op, dims, dict(zip(dims.dims, box(og.lo, og.hi))),
                                     [box(*x) for x in ins], [box(*x) for x in outs])
            assert shape == want, (op.name, g, p)
            cells += 1
    assert cells > made[0] > 0 and any(s is not None for *_, got in calls if got is not None
                                       for s in got)


def _repeated_blocks(batch=4, width=8, blocks=3):
    """``blocks`` residual blocks alike but for their names (batch norm's statistics, a
    shortcut join), then a dense head: vertices that repeat."""
    from fddps.tf.strategy_graph import step_graph

    g = tf.Graph()
    with g.as_default():
        h = tf.constant(np.random.default_rng(3).standard_normal((batch, 8, 8, width))
                        .astype(np.float32))
        labels = tf.one_hot(tf.constant(np.arange(batch) % 3), 3)
        for b in range(blocks):
            w = tf.compat.v1.get_variable(f"w{b}", [3, 3, width, width], use_resource=True)
            gamma = tf.compat.v1.get_variable(f"g{b}", [width], use_resource=True)
            beta = tf.compat.v1.get_variable(f"b{b}", [width], use_resource=True)
            y = tf.compat.v1.nn.fused_batch_norm(tf.nn.conv2d(h, w, 1, "SAME"), gamma, beta,
                                                 is_training=True)[0]
            h = tf.nn.relu(y + h)
        w = tf.compat.v1.get_variable("head", [8 * 8 * width, 3], use_resource=True)
        loss = tf.reduce_mean(tf.nn.softmax_cross_entropy_with_logits(
            labels=labels, logits=tf.matmul(tf.reshape(h, [batch, -1]), w)), name="loss")
        train = tf.compat.v1.train.MomentumOptimizer(0.1, 0.9).minimize(loss, name="train")
    return step_graph(g.as_graph_def(), [train.name, "loss:0"])


class _NamedCostModel:
    """The p100 model with each row's time scaled by a function of its names (as a
    profile would time each op by name): rows under the wrong names show."""

    def __getattr__(self, a):
        return getattr(CM, a)

    def times_read_names(self, device_type):
        return True

    def op_times(self, table, device_type):
        import zlib

        scale = np.array([1 + zlib.crc32(f"{n}|{p}".encode()) % 97 / 1000
                          for n, p in zip(table["name"], table["profile_name"])])
        return np.asarray(CM.op_times(table, device_type), dtype=np.float64) * scale


@pytest.mark.parametrize("k", [2, 4])
def test_repeated_vertices_are_costed_once_and_their_rows_named_their_own(k, monkeypatch):
    # Vertices (and edges) alike but for their ops' names (pase_repeats) take an earlier
    # one's table, their rows added again under their own names: the same floats as the
    # record by record costing, with a cost model that times each row by its names too.
    from fddps.search import pase_repeats, pase_tables

    made = []

    def vertex_table(*args, **kw):
        made.append(pase_tables.vertex_table(*args, **kw))
        return made[-1]

    step = _repeated_blocks()
    devices, vertices, configs = _space(step, k)
    cluster = CM.cluster(devices)
    repeated = [0, 0]  # vertices, edges
    real = pase_repeats.repeated_vertex_table

    def counting(ctx, i, vt):
        n = len(made)
        got = real(ctx, i, vertex_table)
        repeated[0] += len(made) == n and got is not None
        return got

    edges, real_edge = [], pase_repeats.repeated_edge_table

    def edge_table(*args, **kw):
        edges.append(pase_tables.array_edge_table(*args, **kw))
        return edges[-1]

    def counting_edges(ctx, u, v, readers, ku, kv, et):
        n = len(edges)
        got = real_edge(ctx, u, v, readers, ku, kv, edge_table)
        repeated[1] += len(edges) == n and got is not None
        return got

    monkeypatch.setattr(pase_tables, "repeated_vertex_table", counting)
    monkeypatch.setattr(pase_tables, "repeated_edge_table", counting_edges)
    for cm in (CM, _NamedCostModel()):
        made.clear()
        edges.clear()
        repeated[:] = [0, 0]
        _assert_same_tables(build_tables(step, cluster, cm, vertices, configs),
                            build_tables(step, cluster, cm, vertices, configs, vectorised=False))
        assert repeated[0] >= 1 and all(t is not None for t in made)
        assert repeated[1] >= (k == 2) and all(t is not None for t in edges)
    # The names matter to that model: the first block's rows for the others would differ.
    monkeypatch.setattr(pase_repeats, "_renamed", lambda names, vtx, cache: np.array(
        [None if x is None else f"x{x[0]}{x[1]}" for x in names[1]], dtype=object)[names[0]])
    with pytest.raises(AssertionError):
        _assert_same_tables(build_tables(step, cluster, _NamedCostModel(), vertices, configs),
                            build_tables(step, cluster, _NamedCostModel(), vertices, configs,
                                         vectorised=False))


def test_resolved_dims_equal_each_ops_own_and_shared_among_alike_ops(mlp):
    # resolve() read once per distinct (type, attributes, constants, shapes, FLOPs, bytes):
    # the same descriptions as resolving every op, equal ops' shared.
    from fddps.search.space import resolved_dims, resolved_or_none as _dims

    for step in (mlp, _repeated_blocks()):
        got = resolved_dims(step)
        assert list(got) == list(step.ops)
        assert all(got[n] == _dims(op) for n, op in step.ops.items())
    step = _repeated_blocks()
    got = resolved_dims(step)
    convs = [n for n, op in step.ops.items() if op.op_type == "Conv2D"]
    assert len(convs) == 3 and got[convs[0]] is got[convs[1]] is got[convs[2]]


def test_a_name_blind_sink_times_each_distinct_row_once_and_a_named_one_every_row():
    # RowSink.costs: rows that differ only in their names are timed once where the cost
    # model says its times do not read names (CostModel.times_read_names), and every
    # row is timed where it says they do; the costs per row are the same either way.
    from fddps.search.pase_vertex_tables import RowSink

    class Counting:
        def __init__(self, named):
            self.named, self.rows = named, []

        def times_read_names(self, device_type):
            return self.named

        def op_times(self, table, device_type):
            self.rows.append(len(table))
            return CM.op_times(table, device_type)

    cluster = CM.cluster(GPUS)
    got = {}
    for named in (False, True):
        cm = Counting(named)
        sink = RowSink(cluster, cm)
        # Two rows alike but for their names, one with another kernel shape (None vs a
        # shape), one with other FLOPs: three distinct rows of four.
        sink.add_block(np.array(["a", "b", "c", "d"], dtype=object), "Conv2D",
                       np.array([2e9, 2e9, 2e9, 3e9]), 1e6, 1e6, 0.0,
                       np.array(["a", "b", "c", "d"], dtype=object),
                       np.array([None, None, "conv:n8c64h32w32k64r3s3u1p1", None], dtype=object))
        got[named] = sink.costs()
        assert cm.rows == [3 if not named else 4]
        assert got[named][0].tolist() == got[named][1].tolist()
    np.testing.assert_array_equal(got[False], got[True])
    assert not RowSink(cluster, CM).named  # the preset reads no names
    assert RowSink(cluster, object()).named  # a model that does not say reads them
