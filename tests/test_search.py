"""fddps.search: delta simulation equals full simulation; FlexFlow's MCMC, the DP, auto."""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from costmodel import default_cost_model  # noqa: E402
from fddps.search import (SearchError, StrategyEvaluator, decision_units, get_search,  # noqa: E402
                          unit_splits)
from fddps.strategy import OpConfig, validate  # noqa: E402
from fddps.tf.strategy_graph import step_graph  # noqa: E402

GPUS = [f"/device:GPU:{i}" for i in range(4)]
CPUS = [f"/device:CPU:{i}" for i in range(4)]
CONFIG = tf.compat.v1.ConfigProto(device_count={"CPU": 4}, allow_soft_placement=False,
                                  inter_op_parallelism_threads=2, intra_op_parallelism_threads=1)
raw = tf.raw_ops


@pytest.fixture(scope="module")
def cm():
    return default_cost_model("p100")


def small_cnn(batch=16, width=32, batch_norm=True):
    """A real small CNN training step: conv, batch norm, relu, pool, conv, dense, softmax, momentum."""
    g = tf.Graph()
    with g.as_default():
        tf.compat.v1.set_random_seed(1)
        x = tf.constant(np.random.default_rng(1).standard_normal((batch, 8, 8, 3)).astype(np.float32))
        labels = tf.one_hot(tf.constant(np.arange(batch) % 5), 5)
        w1 = tf.compat.v1.get_variable("w1", [3, 3, 3, width], use_resource=True)
        w2 = tf.compat.v1.get_variable("w2", [3, 3, width, width], use_resource=True)
        b2 = tf.compat.v1.get_variable("b2", [width], use_resource=True)
        w3 = tf.compat.v1.get_variable("w3", [4 * 4 * width, 5], use_resource=True)
        h = tf.nn.conv2d(x, w1, 1, "SAME")
        if batch_norm:
            gamma = tf.compat.v1.get_variable("gamma", [width], use_resource=True,
                                              initializer=tf.compat.v1.ones_initializer())
            beta = tf.compat.v1.get_variable("beta", [width], use_resource=True,
                                             initializer=tf.compat.v1.zeros_initializer())
            h, _, _ = tf.compat.v1.nn.fused_batch_norm(h, gamma, beta, is_training=True)
        h = tf.nn.max_pool2d(tf.nn.relu(h), 2, 2, "VALID")
        h = tf.nn.relu(tf.nn.bias_add(tf.nn.conv2d(h, w2, 1, "SAME"), b2))
        h = tf.reshape(h, [batch, -1])
        loss = tf.reduce_mean(tf.nn.softmax_cross_entropy_with_logits(
            labels=labels, logits=tf.matmul(h, w3)), name="loss")
        train = tf.compat.v1.train.MomentumOptimizer(0.1, 0.9).minimize(loss, name="train")
        init = tf.compat.v1.global_variables_initializer()
        variables = tf.compat.v1.trainable_variables()
    return g, [train.name, "loss:0"], init.name, variables


@pytest.fixture(scope="module")
def cnn():
    g, fetches, init, variables = small_cnn()
    return g, fetches, init, variables, step_graph(g.as_graph_def(), fetches)


def _random_config(rng, step, unit, devices):
    splits = unit_splits(step, unit, len(devices))
    split = splits[int(rng.integers(len(splits)))]
    n = int(np.prod(list(split.values()))) if split else 1
    return OpConfig(split, [devices[j] for j in rng.permutation(len(devices))[:n]])


@pytest.mark.slow
def test_delta_simulation_equals_full_simulation_on_random_proposals(cnn, cm):
    from fddps.strategy import data_parallel

    step = cnn[-1]
    cluster = cm.cluster(GPUS)
    ev = StrategyEvaluator(step, cluster, cm)
    ev.reset(data_parallel(step, GPUS))
    rng = np.random.default_rng(3)
    units = [u for u in decision_units(step) if len(unit_splits(step, u, 4)) > 1]
    assert len(units) > 10
    changed = 0
    for i in range(40):
        changes = {}
        for _ in range(1 + i % 3):  # one to three units at once
            unit = units[int(rng.integers(len(units)))]
            cfg = _random_config(rng, step, unit, GPUS)
            changes.update({n: cfg for n in unit})
        proposal = ev.propose(changes)
        full = ev.full(ev.strategy(proposal.configs))
        assert proposal.makespan == full.makespan
        np.testing.assert_array_equal(proposal.peak, full.peak)
        changed += proposal.makespan != ev.current.makespan
        if rng.random() < 0.6:
            ev.accept(proposal)
    assert changed > 10  # the proposals did change the step


def _run_step(gd, fetches, init, variables):
    with tf.Graph().as_default() as graph:
        tf.graph_util.import_graph_def(gd, name="")
        # Each variable's own read: a sharded variable's handle is gone, its read
        # gathers the shards under the same name.
        reads = [f"{v.op.name}/Read/ReadVariableOp:0" for v in variables]
        with tf.compat.v1.Session(graph=graph, config=CONFIG) as sess:
            sess.run(init)
            loss = sess.run(fetches)[1]
            return [loss] + sess.run(reads)


def _assert_computes_the_original(original, gd, fetches, init, variables):
    """``gd``'s step (loss, variables after it) is ``original``'s: in float32 to 1e-5, and in
    float64, where reordered sums cannot hide a mistake, to 1e-10."""
    from fddps.tf.float64 import as_float64

    for widen, rtol, atol in ((lambda x: x, 1e-5, 1e-6), (as_float64, 1e-10, 1e-12)):
        want = _run_step(widen(original), fetches, init, variables)
        got = _run_step(widen(gd), fetches, init, variables)
        for a, b in zip(want, got):
            assert np.asarray(b).dtype == np.asarray(a).dtype
            np.testing.assert_allclose(b, a, rtol=rtol, atol=atol)


def _assert_runs_like_original(g, fetches, init, variables, strategy):
    from fddps.tf.strategy_rewrite import rewrite_strategy

    gd = rewrite_strategy(g.as_graph_def(), strategy, fetches, CPUS)
    _assert_computes_the_original(g.as_graph_def(), gd, fetches, init, variables)


@pytest.mark.slow
def test_flexflow_is_reproducible_fits_and_never_worse_than_its_starts(cnn, cm):
    step = cnn[-1]
    cluster = cm.cluster(GPUS)
    a = get_search("flexflow", max_proposals=120, seed=5).fit(step, cluster, cm)
    b = get_search("flexflow", max_proposals=120, seed=5).fit(step, cluster, cm)
    assert {n: (c.split, c.devices) for n, c in a.strategy.configs.items()} == \
        {n: (c.split, c.devices) for n, c in b.strategy.configs.items()}
    assert a.makespan == b.makespan and a.fits
    validate(a.strategy, step, GPUS)
    assert a.makespan <= min(a.info["start_steps"].values()) * (1 + 1e-12)
    assert a.info["proposals"] > 50 and a.info["accepted"] > 0
    ev = StrategyEvaluator(step, cluster, cm)
    assert ev.full(a.strategy).makespan == pytest.approx(a.makespan, rel=1e-12)


@pytest.mark.slow
def test_flexflow_writable_result_runs_with_the_original_loss_and_variables(cm):
    g, fetches, init, variables = small_cnn(batch=64, width=64)
    step = step_graph(g.as_graph_def(), fetches)
    cluster = cm.cluster(CPUS)
    r = get_search("flexflow", max_proposals=100, seed=1, writable=True).fit(step, cluster, cm)
    assert r.fits and sum(c.num_parts > 1 for c in r.strategy.configs.values()) > 0
    _assert_runs_like_original(g, fetches, init, variables, r.strategy)


def test_searches_name_bad_options():
    with pytest.raises(SearchError, match="'time_budget' must be a positive number"):
        get_search("flexflow", time_budget=0)
    with pytest.raises(SearchError, match="'time_budget' must be a positive number"):
        get_search("flexflow", time_budget="10s")
    with pytest.raises(SearchError, match="has no option 'temperature'"):
        get_search("flexflow", temperature=3)
    with pytest.raises(SearchError, match="'max_proposals' must be a positive integer"):
        get_search("flexflow", max_proposals=2.5)
    with pytest.raises(ValueError, match="unknown strategy search 'annealing'"):
        get_search("annealing")


def _brute_force(unary, pairwise):
    """Every strategy's additive cost at once (numpy broadcasting), and the best one."""
    n = len(unary)
    sizes = [len(u) for u in unary]
    total = np.zeros(sizes)
    for v, u in enumerate(unary):
        shape = [1] * n
        shape[v] = sizes[v]
        total = total + np.reshape(u, shape)
    for (a, b), t in pairwise.items():
        shape = [1] * n
        shape[a], shape[b] = sizes[a], sizes[b]
        total = total + (np.reshape(t, shape) if a < b else np.reshape(t.T, shape))
    best = np.unravel_index(int(np.argmin(total)), total.shape)
    return float(total.min()), [int(i) for i in best]


@pytest.mark.parametrize("seed", range(6))
def test_elimination_finds_the_exhaustive_optimum_of_random_factor_graphs(seed):
    from fddps.search.pase import eliminate

    rng = np.random.default_rng(seed)
    n = 7
    unary = [rng.random(int(rng.integers(2, 5))) for _ in range(n)]
    pairwise = {}
    for a in range(n):
        for b in range(a + 1, n):
            if rng.random() < 0.45:
                key = (a, b) if rng.random() < 0.5 else (b, a)
                pairwise[key] = rng.random((len(unary[key[0]]), len(unary[key[1]]))) * 2
    cost, choice = eliminate(unary, pairwise)
    want, _ = _brute_force(unary, pairwise)
    assert cost == pytest.approx(want, rel=1e-12)
    got = sum(unary[v][c] for v, c in enumerate(choice)) + sum(
        t[choice[a], choice[b]] for (a, b), t in pairwise.items())
    assert got == pytest.approx(want, rel=1e-12)


def test_pase_is_the_exhaustive_optimum_of_its_cost_on_a_real_step_and_mcmc_beats_it(cm):
    from fddps.search.pase import PaseSearch, eliminate

    g, fetches, _, _ = small_cnn(batch=32, width=64, batch_norm=False)
    step = step_graph(g.as_graph_def(), fetches)
    cluster = cm.cluster(GPUS[:2])
    search = PaseSearch()
    vertices, configs, unary, pairwise = search.costs(step, cluster, cm)
    # Whole on either GPU, and (where the vertex splits) in two along each dimension of
    # its layer's iteration domain (a convolution's n, o, i, h, w: 5 + 2 configurations).
    assert 6 <= len(vertices) <= 12 and all(len(c) >= 2 for c in configs)
    assert sum(len(c) >= 4 for c in configs) >= 3 and max(len(c) for c in configs) == 7
    assert any(t.max() > 0 for t in pairwise.values())
    cost, choice = eliminate(unary, pairwise)
    want, best = _brute_force(unary, pairwise)
    assert cost == pytest.approx(want, rel=1e-12)
    result = search.fit(step, cluster, cm)
    assert result.info["additive_cost"] == pytest.approx(want, rel=1e-12)
    validate(result.strategy, step, GPUS[:2])
    assert result.fits and result.makespan > 0
    ev = StrategyEvaluator(step, cluster, cm)
    assert ev.full(result.strategy).makespan == result.makespan  # re-timed by the simulator
    mcmc = get_search("flexflow", max_proposals=60, seed=2).fit(
        step, cluster, cm, starts={"pase": result.strategy})
    assert mcmc.makespan <= result.makespan


def test_pase_names_the_vertex_whose_table_is_too_large(cnn, cm):
    from fddps.search.pase import PaseSearch

    with pytest.raises(SearchError, match=r"vertex '.+' \(\d+ ops\) would need a table of \d+ "
                                          r"entries"):
        PaseSearch(max_table=20).fit(cnn[-1], cm.cluster(GPUS), cm)
    with pytest.raises(SearchError, match="'max_table' must be a positive integer"):
        PaseSearch(max_table=-1)


def test_pase_writable_result_runs_with_the_original_loss_and_variables(cnn, cm):
    from fddps.search.pase import PaseSearch

    g, fetches, init, variables, step = cnn
    r = PaseSearch(writable=True).fit(step, cm.cluster(CPUS), cm)
    assert r.fits
    validate(r.strategy, step, CPUS)
    _assert_runs_like_original(g, fetches, init, variables, r.strategy)


def test_place_auto_picks_the_fastest_fitting_strategy_and_it_runs_like_the_original(cnn, cm):
    import fddps
    from fddps.tf.search_place import DEFAULT_PLACEMENT

    g, fetches, init, variables, step = cnn
    before = g.as_graph_def()
    p = fddps.place(g, CPUS, cost_model=cm, fetches=fetches, algorithm="auto", time_budget=30,
                    max_proposals=40, seed=0)
    found = p.info["search_info"]
    assert found["winner"] in found["steps"]
    assert set(found["steps"]) >= {"one device", "data parallel", "fddps", "pase", "flexflow"}
    # The winner, the baselines and the runners-up are re-timed as written (with the
    # slices and concatenations the rewrite adds); the fastest of those is placed.
    written = found["written_steps"]
    baselines = ("one device", "data parallel", "fddps")
    # ... and so is place()'s default placement of the same graph (what its executor runs).
    assert set(written) >= {found["winner"], *baselines, DEFAULT_PLACEMENT}
    default = fddps.place(g, CPUS, cost_model=cm, fetches=fetches)
    assert written[DEFAULT_PLACEMENT] == default.executor_makespan
    assert p.info["search"] == found["written_winner"]
    assert p.executor_makespan == written[found["written_winner"]] == min(written.values())
    assert p.executor_makespan <= min(written[n] for n in baselines)
    assert p.executor_makespan <= default.executor_makespan  # never predicted slower
    text = p.summary()
    assert f"{found['winner']} won" in text and "the best of one device" in text
    assert f"as written (with the ops the rewrite adds): {found['written_winner']} won" in text
    _assert_computes_the_original(before, p.graph_def, fetches, init, variables)
    assert g.as_graph_def() == before


def test_place_with_a_search_names_bad_options(cnn, cm):
    import fddps

    g, fetches = cnn[0], cnn[1]
    for bad in (0, -3.0, float("nan"), "fast"):
        with pytest.raises(SearchError, match="option 'time_budget' must be a positive number"):
            fddps.place(g, CPUS, cost_model=cm, fetches=fetches, algorithm="auto", time_budget=bad)
    with pytest.raises(SearchError, match="strategy search 'pase' has no option 'beta'"):
        fddps.place(g, CPUS, cost_model=cm, fetches=fetches, algorithm="pase", beta=3)


def test_auto_skips_a_dp_that_outlasts_its_share_of_the_budget(cnn, cm):
    from fddps.search.pase import PaseSearch

    step = cnn[-1]
    # The budget counts the set-up (the evaluator, the vertices' configurations):
    # seconds on a big step, so a tiny budget stops before any vertex is costed.
    with pytest.raises(SearchError, match=r"pase: out of its time_budget \(1e-09 s\) while costing "
                                          r"the configurations of vertex 1 of \d+ \(.*, before any cost\)"):
        PaseSearch(time_budget=1e-9).fit(step, cm.cluster(GPUS[:2]), cm)
    # Likewise MCMC: its chains get what is left, here nothing; it keeps the best start.
    mc = get_search("flexflow", time_budget=1e-9, max_proposals=50).fit(step, cm.cluster(GPUS[:2]), cm)
    assert mc.info["proposals"] == 0 and mc.fits
    r = get_search("auto", time_budget=5, max_proposals=10, pase_share=1e-10).fit(
        step, cm.cluster(GPUS[:2]), cm)
    assert "out of its time_budget" in r.info["skipped"]["pase"] and "pase" not in r.info["steps"]
    assert r.makespan <= r.info["best_baseline"] and r.fits


def test_baseline_strategies_makes_only_the_baselines_named_and_the_same_ones(cnn, cm):
    from fddps.search.space import baseline_strategies

    step = cnn[4]
    cluster = cm.cluster(GPUS[:2])
    every = baseline_strategies(step, cluster, cm, writable=True)
    only = baseline_strategies(step, cluster, cm, writable=True, names=("fddps",))
    assert list(every) == ["one device", "data parallel", "fddps"]
    assert list(only) == ["fddps"]
    assert dict(only["fddps"].configs) == dict(every["fddps"].configs)
    assert baseline_strategies(step, cluster, cm, names=()) == {}
