"""FlexFlow as its paper runs it: the search's rules, its starts, its clusters and workloads."""

import math

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from costmodel import default_cost_model  # noqa: E402
from fddps.cluster_presets import (CLUSTER_PRESETS, get_preset, preset_cluster,  # noqa: E402
                                   preset_devices)
from fddps.errors import ClusterError  # noqa: E402
from fddps.search import SearchError, StrategyEvaluator, get_search  # noqa: E402
from fddps.search.flexflow_starts import (expert_strategy, random_strategy,  # noqa: E402
                                          sample_parallel)
from fddps.strategy import data_parallel, validate  # noqa: E402
from fddps.tf.strategy_graph import step_graph  # noqa: E402

from tests.test_search import small_cnn  # noqa: E402

GPUS = [f"/device:GPU:{i}" for i in range(4)]


@pytest.fixture(scope="module")
def cm():
    return default_cost_model("p100")


@pytest.fixture(scope="module")
def step():
    g, fetches, _, _ = small_cnn(batch=32, width=64)
    return step_graph(g.as_graph_def(), fetches)


def test_cluster_presets_have_the_papers_nodes_links_and_shared_resources():
    c, cm = preset_cluster("flexflow-p100")
    assert len(c) == 16 and len({d.host for d in c.devices}) == 4
    a, b, far = c.index[preset_devices("flexflow-p100")[0]], 1, 15
    assert c.bandwidth[a, b] == 18e9 and c.bandwidth[a, far] == 11.5e9  # NVLink, EDR
    hosts = {d.host for d in c.devices}
    assert {r.name for r in c.link_resources} == {f"host {h} NIC {way}" for h in hosts
                                                  for way in ("in", "out")}
    k80, _ = preset_cluster("flexflow-k80", 8)
    assert len({d.host for d in k80.devices}) == 2 and k80.memory[0] == 12e9
    names = {r.name for r in k80.link_resources}
    assert any("PCIe switch" in n for n in names) and any("NIC" in n for n in names)
    nic = next(r for r in k80.link_resources if r.name.endswith("NIC out"))
    assert nic.bandwidth == 6.0e9  # 56 Gb/s FDR
    assert all(p.source for p in CLUSTER_PRESETS.values())
    with pytest.raises(ClusterError, match="unknown cluster preset 'dgx'"):
        get_preset("dgx")
    with pytest.raises(ClusterError, match="6 GPUs do not fill whole nodes of 4"):
        preset_devices("flexflow-p100", 6)
    with pytest.raises(ClusterError, match="has 16 GPUs"):
        preset_devices("flexflow-p100", 32)


def test_rnntc_parameters_match_the_papers_configuration():
    import slim_models
    from slim_models.rnntc import FLEXFLOW_RNNTC, rnntc_parameter_count

    want = rnntc_parameter_count(**FLEXFLOW_RNNTC)
    # 4 LSTM layers of 1024 (FlexFlow Table 4), Movie Reviews' 18,765 words, 2 classes (Kim 2014)
    assert want["lstm"] == 4 * (4 * 1024 * 2048 + 4 * 1024)
    assert want["total"] == 52_788_226
    assert slim_models.model_parameter_count("rnntc") == want["total"]
    m = slim_models.build_training_graph("rnntc", 4, seq_length=3)
    assert m.logits.shape.as_list() == [4, 2] and m.num_classes == 2


def test_starts_are_valid_and_sample_parallel_splits_gradient_tuples(step, cm):
    cluster = cm.cluster(GPUS)
    dp_old, dp = data_parallel(step, GPUS), sample_parallel(step, GPUS)
    ex = expert_strategy(step, GPUS)
    rnd = random_strategy(step, GPUS, np.random.default_rng(0))
    for s in (dp, ex, rnd):
        validate(s, step, GPUS)
    tuples = [n for n in step.ops if "tuple/control_dependency" in n
              and dp_old.config(n).num_parts == 1 and dp.config(n).num_parts > 1]
    assert tuples  # kept whole by data_parallel, split by sample here
    ev = StrategyEvaluator(step, cluster, cm)
    assert ev.full(dp).makespan < ev.full(dp_old).makespan
    # untied, TF's gradient-tuple Identity ops are split by data parallelism itself
    from dataclasses import replace as copy_op

    from experiments.flexflow import untie_gradient_tuples
    from fddps.strategy.graph import StepGraph

    freed = StepGraph([copy_op(op) for op in step.ops.values()])
    assert untie_gradient_tuples(freed) >= len(tuples)
    assert all(data_parallel(freed, GPUS).config(n).num_parts > 1 for n in tuples)
    assert all(step.ops[n].tied for n in tuples)  # the original step is untouched
    # the expert CNN strategy splits the dense layer's MatMuls by parameter
    assert any(step.ops[n].op_type == "MatMul" and "c" in ex.config(n).split for n in step.ops)


def test_flexflow_follows_equation_1_and_the_half_budget_rule(step, cm):
    cluster = cm.cluster(GPUS)
    a = get_search("flexflow", max_proposals=60, seed=3).fit(step, cluster, cm)
    b = get_search("flexflow", max_proposals=60, seed=3).fit(step, cluster, cm)
    assert a.makespan == b.makespan and a.info["start_steps"] == b.info["start_steps"]
    assert set(a.info["start_steps"]) == {"data parallel", "random", "expert", "fddps"}
    # beta is fixed for the search: 50 / the first start's (data parallelism's) cost
    assert a.info["beta_per_second"] == pytest.approx(50 / a.info["start_steps"]["data parallel"])
    assert a.fits and a.makespan <= min(a.info["start_steps"].values()) * (1 + 1e-12)
    for chain in a.info["chains"].values():  # 15 proposals each; stop after 7 without gain
        assert chain["proposals"] <= 15
    assert any(c["stopped"] != "budget" for c in a.info["chains"].values()) or \
        all(c["proposals"] == 15 for c in a.info["chains"].values())
    paper = get_search("flexflow", max_proposals=20, starts=("data parallel", "random"),
                       seed=1).fit(step, cluster, cm)
    assert set(paper.info["start_steps"]) == {"data parallel", "random"}
    old = get_search("flexflow", max_proposals=20, acceptance="relative", stop="patience",
                     starts=("one device", "data parallel", "fddps")).fit(step, cluster, cm)
    assert old.info["acceptance"] == "relative" and old.fits
    assert ev_full(step, cluster, cm, old.strategy) == pytest.approx(old.makespan, rel=1e-12)
    with pytest.raises(SearchError, match="option 'acceptance' must be one of"):
        get_search("flexflow", acceptance="greedy")
    with pytest.raises(SearchError, match="option 'starts' must name some of"):
        get_search("flexflow", starts=("pipeline",))


def ev_full(step, cluster, cm, strategy):
    return StrategyEvaluator(step, cluster, cm).full(strategy).makespan


def test_flexflow_and_auto_prefer_a_plan_that_fits(step, cm):
    # Memory so small that only spreading the step fits: the search returns a fitting plan
    # (its own or a start) and says so; with no fitting plan at all it says it does not fit.
    cluster = cm.cluster(GPUS)
    ev = StrategyEvaluator(step, cluster, cm)
    dp_peak = float(np.max(ev.full(sample_parallel(step, GPUS)).peak))
    tight = cm.cluster(GPUS, memory=dp_peak * 1.01)
    r = get_search("flexflow", max_proposals=20, seed=0).fit(step, tight, cm)
    assert r.fits and float(np.max(r.peak)) <= dp_peak * 1.01
    none = cm.cluster(GPUS, memory=1.0)
    r = get_search("flexflow", max_proposals=8, seed=0).fit(step, none, cm)
    assert r.fits is False and math.isfinite(r.makespan)
    a = get_search("auto", time_budget=20, max_proposals=8).fit(step, tight, cm)
    assert a.fits and a.info["fits"][a.info["winner"]]
    assert all(a.makespan <= a.info["steps"][n] * (1 + 1e-12)
               for n, ok in a.info["fits"].items() if ok)


def test_experiment_smoke_run_writes_csv_and_page(tmp_path, capsys):
    import pandas as pd

    from experiments import flexflow as exp

    exp.main(["--quick", "--figure", "6,7,5", "--starts", "data parallel,random,expert",
              "--out", str(tmp_path)])
    fig6 = (tmp_path / "flexflow_fig6.csv").read_text()
    assert "expert" in fig6 and "flexflow" in fig6
    page = (tmp_path / "flexflow.md").read_text()
    assert "## Fig. 6" in page and "## Table 5" in page and "What differs" in page
    # Fig. 7: its three rows, the starts asked for, and the must-hold judged from the CSV.
    fig7 = pd.read_csv(tmp_path / "flexflow_fig7.csv").set_index("strategy")
    assert list(fig7.index) == ["data parallel", "expert", "flexflow"]
    assert [s.rsplit(" ", 2)[0] for s in fig7.loc["flexflow", "starts"].split("; ")] == \
        ["data parallel", "random", "expert"]
    assert fig7["fits"].dtype == bool and fig7.loc["flexflow", "chains"]
    assert "## Fig. 7" in page and "Issue 30's must-hold at 2 devices" in page
    ratios = exp.fig7_ratios(fig7.reset_index()).set_index("strategy")
    assert ratios.loc["data parallel", "over_dp"] == 1.0
    assert ratios.loc["flexflow", "over_expert"] == pytest.approx(
        fig7.loc["expert", "step_s"] / fig7.loc["flexflow", "step_s"])
    # --markdown-only writes the same page from the CSVs, running nothing
    (tmp_path / "flexflow.md").unlink()
    exp.main(["--markdown-only", "--out", str(tmp_path)])
    again = (tmp_path / "flexflow.md").read_text()
    assert again.split("\n", 3)[3] == page.split("\n", 3)[3]  # all but the command line
    with pytest.raises(SystemExit):
        exp.main(["--quick", "--figure", "7", "--starts", "pipeline", "--out", str(tmp_path)])
    assert "unknown --starts 'pipeline'; choose from data parallel, random" in capsys.readouterr().err


class _StubEvaluator:
    """Stands in for StrategyEvaluator with set costs: each start's cost is ``COSTS[name]``,
    and every proposal is ``SLOWER`` seconds slower than the current strategy."""

    COSTS, SLOWER = {}, 0.01

    def __init__(self, step, cluster, cost_model, memory_penalty):
        from fddps.strategy import OpConfig

        self.blank = {n: OpConfig({}, [GPUS[0]]) for n in step.ops}

    @staticmethod
    def _score(cost, configs):
        from types import SimpleNamespace

        return SimpleNamespace(makespan=cost, cost=cost, fits=True, peak=np.zeros(len(GPUS)),
                               configs=configs, seconds=0.0)

    def reset(self, strategy):
        self.configs, self.fragments = dict(self.blank), None
        self.current = self._score(self.COSTS[strategy], self.configs)
        return self.current

    def propose(self, changes):
        return self._score(self.current.cost + self.SLOWER, {**self.configs, **changes})

    def accept(self, proposal):
        self.configs, self.current = proposal.configs, proposal

    def strategy(self, configs, name=None):
        return name


@pytest.mark.parametrize("reference", ["first start", "chain start", "chain best"])
def test_beta_reference_sets_how_often_a_fast_chain_accepts_worse(step, cm, monkeypatch,
                                                                  reference):
    # Two starts, data parallelism at 1 s and one 10x faster at 0.1 s; every proposal is
    # 0.01 s worse than the current strategy. One beta for the search (50 / 1 s) accepts
    # such a proposal with exp(-0.5) = 0.61 in either chain; a beta per chain (50 / 0.1 s
    # in the fast chain) with exp(-5) = 0.007 in the fast chain, exp(-0.5) in the other.
    from fddps.search import flexflow

    monkeypatch.setattr(flexflow, "StrategyEvaluator", _StubEvaluator)
    monkeypatch.setattr(_StubEvaluator, "COSTS", {"data parallel": 1.0, "fast": 0.1})
    r = get_search("flexflow", max_proposals=800, seed=0, beta_reference=reference,
                   measure_full_every=0).fit(step, cm.cluster(GPUS), cm,
                                             starts={"data parallel": "data parallel",
                                                     "fast": "fast"})
    assert r.info["beta_reference"] == reference and r.makespan == 0.1
    fast, dp = r.info["chains"]["fast"], r.info["chains"]["data parallel"]
    for chain in (fast, dp):  # no proposal gains: each chain stops after half its share
        assert chain["worse"] == chain["proposals"] > 150
        assert chain["stopped"] == "half the share without improvement"
    rate = {n: c["worse_accepted"] / c["worse"] for n, c in (("fast", fast), ("dp", dp))}
    assert rate["dp"] == pytest.approx(math.exp(-0.5), abs=0.12)
    if reference == "first start":
        assert fast["beta_per_second"] == dp["beta_per_second"] == pytest.approx(50.0)
        assert rate["fast"] == pytest.approx(math.exp(-0.5), abs=0.12)
    else:
        assert fast["beta_per_second"] == pytest.approx(500.0)
        assert dp["beta_per_second"] == pytest.approx(50.0)
        assert rate["fast"] < 0.04
    with pytest.raises(SearchError, match="option 'beta_reference' must be one of"):
        get_search("flexflow", beta_reference="current")
