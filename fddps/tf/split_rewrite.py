"""Write intra-op splits into a GraphDef: :func:`split_graph_def`.

For an op ``X`` split into ``k`` parts by a rule of :data:`fddps.strategy.fddps_splits.SPLIT_RULES`
(names from :func:`fddps.strategy.fddps_splits.part_name` and
:func:`fddps.strategy.fddps_splits.slice_name`,
the same as in the op graph the schedule was made on):

- one ``SplitV`` node ``X/fddps_slice/<producer>`` per sliced input, cutting it
  along the rule's axis into the parts' sizes (two ``Const`` inputs beside it:
  ``.../size_splits`` and ``.../axis``);
- ``k`` part nodes ``X/fddps_part_j``: copies of ``X``'s NodeDef (same op and
  attributes) reading output ``j`` of each slice and the other inputs whole; a
  shape-vector input (``Conv2DBackpropInput``'s ``input_sizes``,
  ``Conv2DBackpropFilter``'s ``filter_sizes``) becomes a ``Const``
  ``X/fddps_part_j/<input name>`` holding the part's shape. ``X``'s control
  inputs go to every part;
- the combine node, named ``X``: ``ConcatV2`` of the parts on the rule's axis
  (axis ``Const`` ``X/fddps_concat_axis``) or ``AddN`` of them. It produces the
  tensor ``X:0`` had, so every consumer, every ``^X`` control input and every
  fetch of the original graph is unchanged.

Every other node is kept as it is, in place; the new nodes are appended after
them. A ``Const`` goes on the device of the node that reads it.

Example
-------
>>> import tensorflow as tf
>>> from costmodel import default_cost_model
>>> from fddps.strategy.fddps_splits import SplitDecision
>>> from fddps.tf.graphdef import analyse
>>> from fddps.tf.split_candidates import split_candidates
>>> g = tf.Graph()
>>> with g.as_default():
...     x = tf.reshape(tf.range(30.0), [6, 5], name="x")
...     y = tf.matmul(x, tf.ones([5, 3]), name="y")
>>> cands, _ = split_candidates(analyse(g), default_cost_model(), ["CPU"], 4)
>>> rows = next(c for c in cands if c.rule.dim == "rows")
>>> gd = split_graph_def(g, [SplitDecision(rows, 4)])
>>> sorted(n.name for n in gd.node if n.name.startswith("y/"))[:3]
['y/fddps_concat_axis', 'y/fddps_part_0', 'y/fddps_part_1']
>>> with tf.compat.v1.Session(graph=tf.Graph()) as sess:
...     _ = tf.graph_util.import_graph_def(gd, name="")
...     float(sess.run("y:0").sum()) == 3 * sum(range(30))
True
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from ..errors import GraphError
from ..strategy.fddps_splits import part_name, slice_name
from .graphdef import _parse_input, _tf, analyse, const_node
from .static_values import shape_input_value


def concat_axis_name(op) -> str:
    """Name of the ``Const`` holding the axis of a split op's ``ConcatV2`` combine."""
    return f"{op}/fddps_concat_axis"


def split_node_names(decision) -> list:
    """Every node name the rewrite of one decision adds (slices, parts and their consts)."""
    cand, rule = decision.candidate, decision.candidate.rule
    names = []
    for producer, _ in cand.sliced:
        s = slice_name(cand.op, producer)
        names += [s, f"{s}/size_splits", f"{s}/axis"]
    for j in range(decision.parts):
        names.append(part_name(cand.op, j))
    if rule.combine == "concat":
        names.append(concat_axis_name(cand.op))
    return names


def _check(decision, op, node, data):
    """Raise GraphError unless ``decision`` fits node ``op`` of this graph."""
    cand, rule = decision.candidate, decision.candidate.rule
    if node.op != rule.op_type:
        raise GraphError(f"split of op {cand.op!r}: the rule is for {rule.op_type}, the node is "
                         f"a {node.op}")
    if len(op.outputs) != 1:  # the combine node stands for output 0 only
        raise GraphError(f"cannot split op {cand.op!r}: it has {len(op.outputs)} outputs, the "
                         "rewrite combines exactly one")
    i, axis = rule.size_from
    shape = op.inputs[i].shape
    if not shape.is_fully_defined() or shape.as_list()[axis] != cand.size:
        raise GraphError(f"split of op {cand.op!r} along {rule.dim}: the decision says size "
                         f"{cand.size}, the graph's input {i} has shape {shape}")
    if len(cand.sliced) != len(rule.sliced):
        raise GraphError(f"split of op {cand.op!r}: {len(cand.sliced)} sliced inputs given, "
                         f"the rule slices {len(rule.sliced)}")
    for (inp, _), (producer, _) in zip(rule.sliced, cand.sliced):
        if inp >= len(data) or _parse_input(data[inp])[0] != producer:
            raise GraphError(f"split of op {cand.op!r} slices {producer!r}, which is not its "
                             f"input {inp}")


def rewrite_splits(graph_def, analysis, decisions, device_of: Callable[[str], str] | None = None):
    """Apply ``decisions`` to ``graph_def`` in place (a copy the caller owns); see the module notes.

    Parameters
    ----------
    graph_def : GraphDef
        Modified in place: its nodes keep their positions, ``X`` becomes the
        combine node, the new nodes are appended.
    analysis : GraphAnalysis
        The same graph read by :func:`fddps.tf.graphdef.analyse` (shapes, dtypes).
    decisions : sequence of fddps.strategy.fddps_splits.SplitDecision
    device_of : callable name -> device string, optional
        Device of each slice, part and combine node (default: ``X``'s device).

    Returns
    -------
    list of str
        Names of the nodes added.

    Raises
    ------
    GraphError
        If a decision names an unknown node, a node twice, a node of another
        type, a size or producer that does not match the graph, or a shape
        input whose value is not static; or a new name is already taken.
    """
    tf = _tf()
    position = {node.name: k for k, node in enumerate(graph_def.node)}
    seen, added = set(), []
    for d in decisions:
        cand, rule = d.candidate, d.candidate.rule
        x = cand.op
        if x not in position:
            raise GraphError(f"split of unknown op {x!r}")
        if x in seen:
            raise GraphError(f"op {x!r} is split twice")
        seen.add(x)
        for name in split_node_names(d):
            if name in position:
                raise GraphError(f"cannot split op {x!r}: the graph already has a node {name!r}")
        node = graph_def.node[position[x]]
        op = analysis.graph.get_operation_by_name(x)
        data = [s for s in node.input if not s.startswith("^")]
        control = [s for s in node.input if s.startswith("^")]
        _check(d, op, node, data)

        def device(name, default=node.device):
            return device_of(name) if device_of is not None else default

        new = []
        sliced_from = {}
        for (inp, axis), (producer, _) in zip(rule.sliced, cand.sliced):
            s = slice_name(x, producer)
            dev = device(s)
            new.append(const_node(f"{s}/size_splits", list(d.part_sizes), tf.int32, dev))
            new.append(const_node(f"{s}/axis", axis, tf.int32, dev))
            split = tf.compat.v1.NodeDef(name=s, op="SplitV", device=dev,
                                         input=[data[inp], f"{s}/size_splits", f"{s}/axis"])
            split.attr["T"].type = op.inputs[inp].dtype.as_datatype_enum
            split.attr["Tlen"].type = tf.int32.as_datatype_enum
            split.attr["num_split"].i = d.parts
            new.append(split)
            sliced_from[inp] = s
        shapes = {}
        for inp, element in rule.shape_inputs:
            value = shape_input_value(op, inp)
            if value is None:
                raise GraphError(f"cannot split op {x!r}: its input {inp} "
                                 f"({op.op_def.input_arg[inp].name}) has no static value")
            shapes[inp] = (value, element)
        for j, size in enumerate(d.part_sizes):
            p = part_name(x, j)
            dev = device(p)
            part = tf.compat.v1.NodeDef()
            part.CopyFrom(node)
            part.name, part.device = p, dev
            if "_output_shapes" in part.attr:  # the part's shapes differ from X's
                del part.attr["_output_shapes"]
            del part.input[:]
            for inp, s in enumerate(data):
                if inp in sliced_from:
                    part.input.append(f"{sliced_from[inp]}:{j}")
                elif inp in shapes:
                    value, element = shapes[inp]
                    value = list(value)
                    value[element] = size
                    const = f"{p}/{op.op_def.input_arg[inp].name}"
                    new.append(const_node(const, value, op.inputs[inp].dtype, dev))
                    part.input.append(const)
                else:
                    part.input.append(s)
            part.input.extend(control)
            new.append(part)

        # X becomes the combine: same name, same output tensor X:0.
        dtype = op.outputs[0].dtype
        parts = [part_name(x, j) for j in range(d.parts)]
        node.ClearField("input")
        node.attr.clear()
        node.device = device(x)
        node.input.extend(parts)
        node.attr["N"].i = d.parts
        node.attr["T"].type = dtype.as_datatype_enum
        if rule.combine == "concat":
            node.op = "ConcatV2"
            node.input.append(concat_axis_name(x))
            node.attr["Tidx"].type = tf.int32.as_datatype_enum
            new.append(const_node(concat_axis_name(x), rule.concat_axis, tf.int32, node.device))
        else:
            node.op = "AddN"
        for n in new:
            position[n.name] = len(graph_def.node)
            graph_def.node.append(n)
            added.append(n.name)
    return added


def split_graph_def(graph_def, decisions, devices: Mapping | None = None, *, unknown_dim=1):
    """A copy of ``graph_def`` in which each decided op is split into slice, part and combine nodes.

    Parameters
    ----------
    graph_def : GraphDef, tf.Graph, bytes or path
        Never modified.
    decisions : sequence of fddps.strategy.fddps_splits.SplitDecision
        Made from this graph's candidates (:func:`fddps.tf.split_candidates.split_candidates`,
        or ``OpGraph.split_candidates`` of :func:`fddps.tf.read_graph_def`).
    devices : mapping of node name -> device string, optional
        Devices of the new slice, part and combine nodes; a name missing from
        it gets the split op's device.

    Returns
    -------
    GraphDef

    Raises
    ------
    GraphError
        See :func:`rewrite_splits`.
    """
    tf = _tf()
    analysis = analyse(graph_def, unknown_dim)
    out = tf.compat.v1.GraphDef()
    out.CopyFrom(analysis.graph_def)
    original = {node.name: node.device for node in out.node}
    devices = dict(devices or {})

    def device_of(name):
        if name in devices:
            return devices[name]
        return original.get(name) or original.get(name.split("/fddps_", 1)[0], "")

    rewrite_splits(out, analysis, decisions, device_of)
    return out
