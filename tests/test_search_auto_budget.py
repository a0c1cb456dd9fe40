"""``auto``'s budget: FD-DPS over the strategy space first, never beaten by it when it finishes in
time; the total within the budget plus the stated overrun (fddps/search/auto.py)."""

import pytest

pytest.importorskip("tensorflow")

from costmodel import default_cost_model  # noqa: E402
from fddps.search import SearchError, get_search  # noqa: E402
from fddps.tf.strategy_graph import step_graph  # noqa: E402
from test_search import GPUS, small_cnn  # noqa: E402


@pytest.fixture(scope="module")
def cm():
    return default_cost_model("p100")  # pinned: no dependence on this machine


@pytest.fixture(scope="module")
def step():
    g, fetches, _, _ = small_cnn()
    return step_graph(g.as_graph_def(), fetches)


@pytest.mark.slow
def test_auto_is_never_slower_than_fddps_space_that_finishes_within_its_budget(step, cm):
    cluster = cm.cluster(GPUS)
    alone = get_search("fddps_space").fit(step, cluster, cm)
    assert alone.info["critical_ops"] > 0
    # Room for fddps_space and then some, yet far less than the old fixed 30% share needed
    # for slow machines to stay uncut; generous against a loaded machine.
    budget = 3 * alone.seconds + 2.0
    runs = [get_search("auto", time_budget=budget, max_proposals=20, seed=0).fit(step, cluster, cm)
            for _ in range(2)]
    for r in runs:
        assert "fddps_space" not in r.info["cut"] and "fddps_space" not in r.info["skipped"]
        # Run to its end, fddps_space is deterministic: auto found its very strategy ...
        assert r.info["steps"]["fddps_space"] == alone.makespan
        # ... so auto's answer is never predicted slower than it.
        assert r.makespan <= alone.makespan and r.fits
        assert r.makespan <= r.info["best_baseline"]
    assert runs[0].info["steps"]["fddps_space"] == runs[1].info["steps"]["fddps_space"]


def test_auto_with_no_budget_left_after_the_baselines_skips_every_search(step, cm):
    cluster = cm.cluster(GPUS[:2])
    r = get_search("auto", time_budget=1e-6).fit(step, cluster, cm)
    # The baselines and Tofu always run (auto promises never to be slower than the baselines;
    # Tofu's plan may be the only one that fits); nothing else starts once the budget is
    # spent, so the overrun is their seconds (and bookkeeping).
    assert set(r.info["skipped"]) == {"fddps_space", "pase", "flexflow"}
    assert all("no time left" in why for why in r.info["skipped"].values())
    assert set(r.info["steps"]) == {"one device", "data parallel", "fddps", "tofu"}
    assert r.search in r.info["steps"] and r.makespan == min(r.info["steps"].values())
    spent = r.info["seconds"]
    assert r.seconds <= spent["baselines"] + spent["tofu"] + 1.0  # generous: bookkeeping only
    assert r.info["over_budget"] == pytest.approx(r.seconds - 1e-6)


@pytest.mark.slow
def test_auto_stays_within_its_budget_plus_the_stated_overrun(step, cm):
    cluster = cm.cluster(GPUS)
    budget = 1.0
    r = get_search("auto", time_budget=budget, max_proposals=2000, seed=0).fit(step, cluster, cm)
    spent = r.info["seconds"]
    assert r.seconds == pytest.approx(sum(spent.values()), abs=0.5)
    # Overrun bound (module docstring): the baselines and Tofu plus one indivisible piece of
    # the search running when the budget ran out; on this small step far below 5 s.
    assert r.seconds <= budget + spent["baselines"] + spent["tofu"] + 5.0
    assert r.makespan <= r.info["best_baseline"] and r.fits


def test_auto_and_fddps_space_name_bad_shares():
    with pytest.raises(SearchError, match="option 'fddps_space_share' must be a share in"):
        get_search("auto", fddps_space_share=1.5)
    with pytest.raises(SearchError, match="option 'pase_share' must be a positive number"):
        get_search("auto", pase_share=0)
    with pytest.raises(SearchError, match=r"option 'choose_share' must be a number in \(0, 1\]"):
        get_search("fddps_space", choose_share=0)


def test_auto_default_budget_is_relative_to_its_baselines(step, cm):
    cluster = cm.cluster(GPUS)
    r = get_search("auto", max_proposals=20, seed=0).fit(step, cluster, cm)
    spent = r.info["seconds"]
    assert r.info["relative_budget"] is True
    # The budget: the baselines' seconds and twice as many after them.
    assert r.info["budget"] == pytest.approx(3 * spent["baselines"])
    # What did not start names the budget it ran out of (a search that started and ran out of
    # its own share says so in its own words).
    for why in r.info["skipped"].values():
        assert "2x the baselines' seconds" in why or "time_budget" in why, why
    # Never predicted slower than the best baseline, whatever ran.
    assert r.makespan <= r.info["best_baseline"] and r.fits
    # Overrun bound: one indivisible piece of the search running at the deadline.
    assert r.seconds <= r.info["budget"] + 5.0
    half = get_search("auto", budget_factor=0.5, max_proposals=20, seed=0).fit(step, cluster, cm)
    assert half.info["budget"] == pytest.approx(1.5 * half.info["seconds"]["baselines"])
    with pytest.raises(SearchError, match="option 'budget_factor' must be a positive number"):
        get_search("auto", budget_factor=0)
