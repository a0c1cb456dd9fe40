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


# --- place()'s call budget (fddps.tf.search_place): what auto writes and re-times ---------------

class _Written:
    """A stand-in for a written candidate's Placement: its predicted step and whether it fits."""

    def __init__(self, step, fits=True):
        import numpy as np
        import pandas as pd
        from types import SimpleNamespace

        self.makespan = self.executor_makespan = step
        self.peak_memory = pd.Series([1.0 if fits else 3.0])
        self.cluster = SimpleNamespace(memory=np.array([2.0]))


def _result(steps, fits=None, same=()):
    """A SearchResult of auto with candidates of these simulated steps (``same``: names whose
    strategy is the first name's)."""
    import numpy as np

    from fddps.search import SearchResult
    from fddps.strategy.strategy import whole_placement

    names = list(steps)
    candidates = {n: whole_placement({}, f"/device:GPU:{0 if n in same else k}")
                  for k, n in enumerate(names)}
    fits = fits or {n: True for n in names}
    return SearchResult(candidates[names[0]], steps[names[0]], np.zeros(1), True, names[0], 1.0,
                        dict(steps=dict(steps), fits=fits), candidates=candidates)


def _retime(monkeypatch, result, written_steps, default_step=10.0, *, end=1e9,
            default_seconds=1.0, write_seconds=0.0, within=0.1):
    """``_retime_within_budget`` with a stub clock that a write advances by ``write_seconds``;
    returns (placement, name, written, the order of the writes)."""
    from types import SimpleNamespace

    from fddps.tf import search_place

    now = [0.0]
    monkeypatch.setattr(search_place, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    calls = []
    by_strategy = {id(s): n for n, s in result.candidates.items()}

    def write(strategy):
        name = by_strategy[id(strategy)]
        calls.append(name)
        now[0] += write_seconds
        return _Written(written_steps[name])

    budget = dict(start=0.0, end=end, seconds=end, default_seconds=default_seconds, factor=2.5)
    placement, name, written = search_place._retime_within_budget(
        result, write, _Written(default_step), budget, within)
    return placement, name, written, calls


def test_auto_writes_only_the_candidates_simulated_faster_than_the_default(monkeypatch):
    from fddps.tf.search_place import DEFAULT_PLACEMENT

    result = _result({"fddps": 8.0, "data parallel": 12.0, "one device": 30.0,
                      "fddps_space": 9.0, "tofu": 7.0},
                     fits={"fddps": True, "data parallel": True, "one device": True,
                           "fddps_space": True, "tofu": False})
    p, name, written, calls = _retime(monkeypatch, result,
                                      {"fddps": 9.5, "fddps_space": 10.2})
    # Fastest simulated first; data parallelism (12 >= 10 x 1.1) and one device are not
    # written, nor Tofu's plan, which does not fit as simulated.
    assert calls == ["fddps", "fddps_space"]
    assert set(written) == {"fddps", "fddps_space", DEFAULT_PLACEMENT}
    assert name == "fddps" and p.executor_makespan == 9.5
    why = result.info["not_written"]
    assert set(why) == {"data parallel", "one device", "tofu"}
    assert why["tofu"] == "does not fit memory as simulated"
    assert "not below the default's" in why["data parallel"]
    assert result.info["written_steps"][DEFAULT_PLACEMENT] == 10.0


def test_auto_is_never_predicted_slower_than_the_default_as_written(monkeypatch):
    from fddps.tf.search_place import DEFAULT_PLACEMENT

    # Simulated faster, written slower (the rewrite's slices): the default's placement wins.
    result = _result({"fddps_space": 8.0, "fddps": 9.0})
    p, name, written, calls = _retime(monkeypatch, result, {"fddps_space": 10.5, "fddps": 10.01})
    assert calls == ["fddps_space", "fddps"]
    assert name == DEFAULT_PLACEMENT and p.executor_makespan == 10.0
    # A candidate with the strategy of one written is not written again.
    result = _result({"fddps": 8.0, "fddps_space": 8.0}, same=("fddps", "fddps_space"))
    p, name, written, calls = _retime(monkeypatch, result, {"fddps": 9.0})
    assert calls == ["fddps"] and written["fddps_space"] is written["fddps"]


def test_auto_writes_a_candidate_only_while_a_write_fits_the_call_budget(monkeypatch):
    from fddps.tf.search_place import DEFAULT_PLACEMENT

    result = _result({"fddps": 8.0, "fddps_space": 9.0, "pase": 9.5})
    # The first write is estimated at the default's 4 s (fits before 10), measured at 5.5 s;
    # then 5.5 + 5.5 > 10: the next is not written.
    p, name, written, calls = _retime(monkeypatch, result, {"fddps": 9.0, "fddps_space": 8.5},
                                      end=10.0, default_seconds=4.0, write_seconds=5.5)
    assert calls == ["fddps"] and name == "fddps"
    assert result.info["not_written"]["fddps_space"].startswith("no time left of the call budget")
    assert set(result.info["not_written"]) == {"fddps_space", "pase"}
    # No room even for the first write: the default's placement, nothing written.
    result = _result({"fddps": 8.0})
    p, name, written, calls = _retime(monkeypatch, result, {"fddps": 1.0}, end=3.0,
                                      default_seconds=4.0)
    assert calls == [] and name == DEFAULT_PLACEMENT and set(written) == {DEFAULT_PLACEMENT}


def test_place_auto_with_no_call_budget_left_returns_the_default_placement(cm):
    import fddps
    from fddps.tf.search_place import DEFAULT_PLACEMENT

    g, fetches, _, _ = small_cnn()
    default = fddps.place(g, GPUS, cost_model=cm, fetches=fetches)
    p = fddps.place(g, GPUS, cost_model=cm, fetches=fetches, algorithm="auto", call_budget=1e-9)
    found = p.info["search_info"]
    # The baselines always run (the candidates are ranked on them); no search starts and
    # nothing is written, so auto answers the default's own placement.
    assert {"fddps_space", "pase", "flexflow"} <= set(found["skipped"])
    assert all("call budget" in found["skipped"][n] for n in ("fddps_space", "pase", "flexflow"))
    assert p.info["search"] == DEFAULT_PLACEMENT
    assert set(found["written_steps"]) == {DEFAULT_PLACEMENT}
    assert found["not_written"] and all(
        why.startswith(("no time left of the call budget", "simulated step not below",
                        "does not fit")) for why in found["not_written"].values())
    assert found["call_budget"]["factor"] == 1e-9 and found["call_budget"]["write_seconds"] == {}
    assert (p.graph_def.SerializeToString(deterministic=True)
            == default.graph_def.SerializeToString(deterministic=True))
    assert p.executor_makespan == default.executor_makespan
    assert "call budget" in p.summary()


def test_place_auto_by_default_budgets_the_call_and_is_never_predicted_slower(cm):
    import fddps
    from fddps.tf.search_place import DEFAULT_PLACEMENT

    g, fetches, _, _ = small_cnn()
    p = fddps.place(g, GPUS, cost_model=cm, fetches=fetches, algorithm="auto", max_proposals=20)
    found = p.info["search_info"]
    budget = found["call_budget"]
    assert budget["factor"] == 2.5
    assert budget["seconds"] == pytest.approx(2.5 * budget["default_seconds"])
    written = found["written_steps"]
    default_step = written[DEFAULT_PLACEMENT]
    # Whatever the machine's speed let it write: only candidates simulated below the
    # default's step, and the answer the fastest of them and the default's placement.
    for name in set(written) - {DEFAULT_PLACEMENT}:
        assert found["steps"][name] < default_step and found["fits"][name]
    assert set(written) | set(found["not_written"]) >= set(found["steps"])
    assert p.executor_makespan == written[p.info["search"]] == min(written.values())
    assert p.executor_makespan <= default_step
    with pytest.raises(SearchError, match="option 'call_budget' must be a positive number"):
        get_search("auto", call_budget=0)
    with pytest.raises(SearchError, match="option 'retime_within' must be a number >= 0"):
        get_search("auto", retime_within=-0.1)


def test_place_auto_with_time_left_runs_fddps_space_from_fddps_and_writes_it_when_faster(cm):
    import fddps
    from fddps.tf.search_place import DEFAULT_PLACEMENT

    g, fetches, _, _ = small_cnn()
    p = fddps.place(g, GPUS, cost_model=cm, fetches=fetches, algorithm="auto", call_budget=1e6)
    found = p.info["search_info"]
    # Under the call budget only FD-DPS's whole-op placement is simulated as a baseline;
    # with time left, FD-DPS over the strategy space runs from it, and nothing else.
    assert set(found["steps"]) == {"fddps", "fddps_space"}
    assert "fddps_space" not in found["skipped"] and found["seconds"]["fddps_space"] > 0
    assert {"tofu", "pase", "flexflow"} <= set(found["skipped"])
    written = found["written_steps"]
    for name in ("fddps", "fddps_space"):  # each written when simulated below the limit
        below = found["steps"][name] < written[DEFAULT_PLACEMENT] and found["fits"][name]
        assert (name in written) == below, (name, found["not_written"])
    assert p.executor_makespan == min(written.values()) <= written[DEFAULT_PLACEMENT]
    with pytest.raises(SearchError, match="option 'call_baselines' must name some of"):
        get_search("auto", call_baselines=("two devices",))
