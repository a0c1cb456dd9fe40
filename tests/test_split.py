"""Intra-op splitting in the scheduler (TF-free half): rules, planning, graph rewrite."""

import numpy as np
import pytest

import fddps
from fddps import Cluster, OpGraph
from fddps.errors import GraphError
from fddps.algorithms.split_step import plan_splits
from fddps.strategy.fddps_splits import (SPLIT_RULES, SplitCandidate, SplitDecision, SplitRule,
                                         apply_splits, decisions_table, part_name,
                                         register_split_rule, rules_for, slice_name)


def conv_chain(conv_cost=8.0, batch=8, act_bytes=1e3, filt_bytes=1e3, out_bytes=1e3):
    """x -> conv(x, w) -> relu, with the conv splittable on batch."""
    rule = rules_for("Conv2D", {"data_format": "NHWC"})[0]
    assert rule.dim == "batch"
    cand = SplitCandidate("conv", rule, batch, (("x", act_bytes),), out_bytes,
                          slice_cost=(0.01,), combine_cost=(0.01,))
    g = OpGraph(["x", "w", "conv", "relu"], [0.1, 0.0, conv_cost, 0.1],
                [("x", "conv", act_bytes), ("w", "conv", filt_bytes), ("conv", "relu", out_bytes)],
                transient=[0, 0, 100, 0], split_candidates=[cand])
    return g, cand


def test_registry_has_conv_and_matmul_families():
    dims = {(r.op_type, r.dim): r.combine for rules in SPLIT_RULES.values() for r in rules}
    assert dims[("Conv2D", "batch")] == "concat" and dims[("Conv2D", "channels")] == "concat"
    assert dims[("Conv2DBackpropInput", "batch")] == "concat"
    assert dims[("Conv2DBackpropInput", "channels")] == "sum"
    assert dims[("Conv2DBackpropFilter", "batch")] == "sum"
    assert dims[("Conv2DBackpropFilter", "channels")] == "concat"
    assert {d for (t, d) in dims if t == "MatMul"} == {"rows", "cols", "inner"}
    assert rules_for("Conv2D", {"data_format": "NCHW"}) == []
    assert rules_for("MatMul", {"transpose_a": True}) == []
    with pytest.raises(ValueError, match="concat_axis"):
        SplitRule("X", "d", (0, 0), ((0, 0),), "concat")


def test_adding_an_op_type_is_adding_an_entry():
    rule = register_split_rule(SplitRule("TestOnlyOp", "batch", (0, 0), ((0, 0),), "concat", 0))
    try:
        assert rules_for("TestOnlyOp") == [rule]
    finally:
        SPLIT_RULES.pop("TestOnlyOp")


def test_parts_cost_what_the_cost_model_says_at_their_shape():
    """A part pays the per-op overhead again: it is not its share of the whole op's time."""
    g, cand = conv_chain(conv_cost=8.0)
    # Overhead 1.5 s per op, work 6.5 s for the batch of 8: a part of 4 costs 4.75 s, of 2 3.125 s.
    costed = SplitCandidate(cand.op, cand.rule, cand.size, cand.sliced, cand.output_bytes,
                            cand.slice_cost, cand.combine_cost,
                            part_costs=((2, (3.125,)), (3, (3.9375,)), (4, (4.75,))))
    new = apply_splits(g, [SplitDecision(costed, 2)])
    assert [float(new.cost[new.index[part_name("conv", j)]][0]) for j in range(2)] == [4.75, 4.75]
    # Without part costs (a candidate built by hand), a part keeps its share of the whole.
    old = apply_splits(g, [SplitDecision(cand, 2)])
    assert float(old.cost[old.index[part_name("conv", 0)]][0]) == 4.0
    # Planning sees the same part costs: an overhead that eats the gain leaves the op whole.
    heavy = SplitCandidate(cand.op, cand.rule, cand.size, cand.sliced, cand.output_bytes,
                           cand.slice_cost, cand.combine_cost,
                           part_costs=((2, (7.9,)), (3, (7.9,)), (4, (7.9,))))
    g2 = OpGraph(list(g.names), g.cost, list(zip([g.names[u] for u in g.src],
                                                  [g.names[v] for v in g.dst], g.bytes)),
                 transient=g.transient, split_candidates=[heavy])
    cluster = Cluster.homogeneous(4)
    assert plan_splits(g, cluster) and plan_splits(g2, cluster) == []


def test_apply_splits_rewires_inputs_and_keeps_the_name():
    g, cand = conv_chain()
    new = apply_splits(g, [SplitDecision(cand, 3)])
    parts = [part_name("conv", j) for j in range(3)]
    assert set(parts) <= set(new.names) and slice_name("conv", "x") in new.names
    idx = new.index
    # The combine op is named "conv" and still feeds relu.
    assert new.op_types[idx["conv"]] == "ConcatV2"
    assert [new.names[j] for j in new.successors(idx["conv"])] == ["relu"]
    # Each part reads a slice of x and the whole filter.
    for j, p in enumerate(parts):
        ins = sorted(new.names[k] for k in new.predecessors(idx[p]))
        assert ins == sorted([slice_name("conv", "x"), "w"])
    # Part costs follow the uneven part sizes 3, 3, 2 of the batch of 8.
    costs = [new.cost[idx[p], 0] for p in parts]
    np.testing.assert_allclose(costs, [3.0, 3.0, 2.0])
    assert SplitDecision(cand, 3).part_sizes == (3, 3, 2)
    with pytest.raises(GraphError, match="cannot be split into 9 parts"):
        SplitDecision(cand, 9)
    with pytest.raises(GraphError, match="split twice"):
        apply_splits(g, [SplitDecision(cand, 2), SplitDecision(cand, 3)])


def test_fddps_splits_a_long_critical_op_and_predicts_a_shorter_step():
    g, _ = conv_chain()
    cluster = Cluster.homogeneous(4, bandwidth=1e6, latency=1e-4)
    whole = fddps.schedule(g, cluster, split=False).validate()
    split = fddps.schedule(g, cluster).validate()
    assert split.makespan < 0.5 * whole.makespan
    table = decisions_table(split.info["splits"])
    assert table[["op", "op_type", "dim", "parts"]].values.tolist() == [["conv", "Conv2D", "batch", 4]]
    assert len(set(split.device[[split.graph.index[part_name("conv", j)] for j in range(4)]])) == 4


def test_splitting_is_declined_when_transfers_cost_more_than_it_saves():
    g, _ = conv_chain(act_bytes=1e9, out_bytes=1e9)
    cluster = Cluster.homogeneous(4, bandwidth=1e6)
    s = fddps.schedule(g, cluster)
    assert s.info["splits"] == [] and s.graph is g
    assert plan_splits(g, Cluster.homogeneous(1)) == []


def test_split_never_worse_than_unsplit_on_random_training_graphs():
    from fddps.generators import training_graph

    base = training_graph(300, seed=5)
    rule = rules_for("Conv2D", {"data_format": "NHWC"})[0]
    cands = []
    for i in range(base.num_ops):
        if base.op_types[i] == "Conv2D":
            preds = [base.names[p] for p in base.predecessors(i) if base.op_types[p] != "Variable"]
            eids = [e for e in range(base.num_edges) if base.dst[e] == i and base.names[base.src[e]] in preds]
            cands.append(SplitCandidate(base.names[i], rule, 8, tuple((base.names[base.src[e]], base.bytes[e])
                                                                     for e in eids), 4e6,
                                        slice_cost=(1e-5,), combine_cost=(1e-5,)))
    g = OpGraph(base.names, base.cost, [(base.names[u], base.names[v], b) for u, v, b in
                                        zip(base.src, base.dst, base.bytes)],
                memory=base.memory, op_types=base.op_types,
                colocation=[c if c >= 0 else None for c in base.colocation], split_candidates=cands)
    for bw in (1e8, 1e10, 1e12):
        cluster = Cluster.homogeneous(4, bandwidth=bw, latency=1e-5)
        split = fddps.schedule(g, cluster).validate()
        whole = fddps.schedule(g, cluster, split=False)
        assert split.makespan <= whole.makespan
