"""fddps.strategy.fddps_splits's rules are derived from the op descriptions (fddps.strategy.ops):
one source of truth for which axes a split slices and how its parts combine."""

import pytest

from fddps.errors import GraphError
from fddps.strategy.fddps_splits import (FDDPS_SPLIT_DIMS, SPLIT_RULES, SplitCandidate,
                                         SplitDecision, SplitRule, dimension_letter,
                                         rule_from_description, rules_for)
from fddps.strategy.ops import OP_DESCRIPTIONS, OpDescription, resolve
from fddps.strategy.graph import OpInfo
from fddps.strategy.strategy import parts

_NHWC = (("data_format", "NHWC"),)
_PLAIN = (("transpose_a", False), ("transpose_b", False))

#: The rules FD-DPS's split step used before they were derived (written out by hand then);
#: the paper-reproduction experiments (table5, table7, fig5) depend on exactly these.
PAPER_RULES = [
    SplitRule("Conv2D", "batch", (0, 0), ((0, 0),), "concat", 0, when=_NHWC),
    SplitRule("Conv2D", "channels", (1, 3), ((1, 3),), "concat", 3, when=_NHWC),
    SplitRule("Conv2DBackpropInput", "batch", (2, 0), ((2, 0),), "concat", 0,
              shape_inputs=((0, 0),), when=_NHWC),
    SplitRule("Conv2DBackpropInput", "channels", (2, 3), ((1, 3), (2, 3)), "sum", when=_NHWC),
    SplitRule("Conv2DBackpropFilter", "batch", (0, 0), ((0, 0), (2, 0)), "sum", when=_NHWC),
    SplitRule("Conv2DBackpropFilter", "channels", (2, 3), ((2, 3),), "concat", 3,
              shape_inputs=((1, 3),), when=_NHWC),
    SplitRule("MatMul", "rows", (0, 0), ((0, 0),), "concat", 0, when=_PLAIN),
    SplitRule("MatMul", "cols", (1, 1), ((1, 1),), "concat", 1, when=_PLAIN),
    SplitRule("MatMul", "inner", (0, 1), ((0, 1), (1, 0)), "sum", when=_PLAIN),
]


def test_derived_rules_are_the_papers_rules():
    assert [r for t in FDDPS_SPLIT_DIMS for r in SPLIT_RULES[t]] == PAPER_RULES
    assert not rules_for("MatMul", {"transpose_a": True})
    assert len(rules_for("Conv2D", {"data_format": "NHWC"})) == 2


@pytest.mark.parametrize("rule", PAPER_RULES, ids=lambda r: f"{r.op_type}-{r.dim}")
def test_each_rule_agrees_with_the_resolved_iteration_domain(rule):
    """At real shapes, the sliced axes are the dimension's axes and a sum is a reduction."""
    shapes = {"Conv2D": (((8, 6, 6, 3), (3, 3, 3, 16)), ((8, 6, 6, 16),)),
              "Conv2DBackpropInput": (((4,), (3, 3, 3, 16), (8, 6, 6, 16)), ((8, 6, 6, 3),)),
              "Conv2DBackpropFilter": (((8, 6, 6, 3), (4,), (8, 6, 6, 16)), ((3, 3, 3, 16),)),
              "MatMul": (((8, 12), (12, 5)), ((8, 5),))}
    ins, outs = shapes[rule.op_type]
    dims = resolve(OpInfo("x", rule.op_type, input_shapes=ins, output_shapes=outs,
                          attrs=dict(rule.when)))
    letter = {v: k for k, v in FDDPS_SPLIT_DIMS[rule.op_type].items()}[rule.dim]
    assert {(k, a) for k, m in enumerate(dims.inputs) if isinstance(m, tuple)
            for a, d in enumerate(m) if d == letter} == set(rule.sliced)
    assert (rule.combine == "sum") == (letter in dims.reduction)
    assert ins[rule.size_from[0]][rule.size_from[1]] == dims.extent[letter]


@pytest.mark.parametrize("rule", PAPER_RULES, ids=lambda r: f"{r.op_type}-{r.dim}")
def test_a_decision_is_an_op_config_with_the_same_parts(rule):
    """SplitDecision.op_config names the dimension by its letter, and the strategy's parts
    cut it as the decision's part sizes (uneven: 7 into 3 is 3, 2, 2)."""
    shapes = {"Conv2D": (((7, 6, 6, 7), (3, 3, 7, 7)), ((7, 6, 6, 7),)),
              "Conv2DBackpropInput": (((4,), (3, 3, 7, 7), (7, 6, 6, 7)), ((7, 6, 6, 7),)),
              "Conv2DBackpropFilter": (((7, 6, 6, 7), (4,), (7, 6, 6, 7)), ((3, 3, 7, 7),)),
              "MatMul": (((7, 7), (7, 7)), ((7, 7),))}
    ins, outs = shapes[rule.op_type]
    op = OpInfo("x", rule.op_type, input_shapes=ins, output_shapes=outs, attrs=dict(rule.when))
    letter = dimension_letter(rule)
    assert resolve(op).extent[letter] == 7
    decision = SplitDecision(SplitCandidate("x", rule, 7, (), 0.0), 3)
    config = decision.op_config(["a", "b", "c"])
    assert config.split == {letter: 3} and config.devices == ("a", "b", "c")
    assert [p.box[letter][1] - p.box[letter][0] for p in parts(op, config)] == \
        list(decision.part_sizes) == [3, 2, 2]
    with pytest.raises(GraphError, match="3 parts but 2 devices"):
        decision.op_config(["a", "b"])


def test_a_rule_outside_fddps_split_dims_has_no_letter():
    rule = SplitRule("Relu", "batch", (0, 0), ((0, 0),), "concat", 0)
    with pytest.raises(GraphError, match="Relu/batch names no dimension"):
        dimension_letter(rule)


def test_a_description_without_fixed_specs_or_without_the_dimension_is_an_error():
    with pytest.raises(GraphError, match="Mean's description depends on constant inputs"):
        rule_from_description(OP_DESCRIPTIONS["Mean"][0], "n", "batch")
    with pytest.raises(GraphError, match="Relu2 has no input indexed by dimension 'q'"):
        rule_from_description(OpDescription("Relu2", ("nc",), ("nc",)), "q", "x")
