"""Tofu with variables partitioned (``writable=False``) against whole variables, on the tanh
MLPs of tests/test_tofu.py: the partitioned plan's fullest device holds no more than the
whole-variable plan's, at every memory weight (a reported oddity said otherwise; it does
not reproduce, see the README's Tofu section)."""

import numpy as np
import pytest

pytest.importorskip("tensorflow")

from test_tofu import CPUS, _wide_mlp  # noqa: E402

from costmodel import default_cost_model  # noqa: E402
from fddps.search.tofu import Tofu  # noqa: E402
from fddps.strategy import simulate_strategy  # noqa: E402
from fddps.tf.strategy_graph import step_graph  # noqa: E402


@pytest.mark.slow
@pytest.mark.parametrize("widths", [(256, 512, 512, 512, 512, 512, 512, 10), (256, 1024, 1024, 10)])
def test_partitioned_variables_peak_no_higher_than_whole_ones(widths):
    cm = default_cost_model("p100")
    g, fetches, _, _ = _wide_mlp(widths=widths)
    step = step_graph(g.as_graph_def(), fetches)
    cluster = cm.cluster(CPUS)
    weights = sum(op.param_bytes for op in step.ops.values())
    for w in (0.0, 4.0, 64.0):
        peak = {}
        for writable in (True, False):
            plan = Tofu(writable=writable).plan(step, CPUS, w)
            peak[writable] = float(np.max(simulate_strategy(step, plan.strategy, cluster,
                                                            cm).peak_memory))
        assert peak[False] <= peak[True], (w, peak)
        # Partitioned, every device holds about a quarter of the weights and slots.
        assert peak[False] < 0.5 * weights, (w, peak)
