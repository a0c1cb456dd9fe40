"""Which ops of a TensorFlow graph FD-DPS may split, from their shapes: :func:`split_candidates`.

For every scheduled node whose op type has split rules
(:data:`fddps.strategy.fddps_splits.SPLIT_RULES`: Conv2D and its two backprops
in NHWC, MatMul without transposes), each rule that applies to the node's
attributes gives one :class:`~fddps.strategy.fddps_splits.SplitCandidate`: the
extent of the split dimension, the input edges that are sliced (producer and
bytes), the output's bytes, and what slicing and combining cost. Those two
costs come from the cost model itself, asked about synthetic op-table rows of
the ops the rewrite adds (``SplitV`` of the largest sliced input; ``ConcatV2``
or ``AddN`` of the parts), so splitting is judged with the same model as every
other op. So does each part: a row of the op at the part's shape (FLOPs and
sliced inputs by its share, unsliced inputs whole, the output by its share
or whole for partial sums; as :func:`fddps.strategy.expand.expand` costs a
part) for every extent a split into 2 .. ``max_parts`` parts gives.

Ops are left whole, and counted by reason in the ``skipped`` dict, when:

- ``"in a tf.while_loop frame"`` / ``"in a tf.cond branch"``: new nodes there
  would need frame entries or deadness handling;
- ``"colocated"`` / ``"pinned"``: their computation is tied to a device: a
  requested device, a ``_class`` colocation attribute of their own, or a
  resource or reference input. An op in a colocation group only because other
  nodes ask to sit with it (the ``tuple/control_dependency`` Identity that
  ``tf.gradients`` colocates with every gradient) can be split: the combine
  node keeps its name, so they sit with the combine;
- ``"unknown shapes"``: an input or the output shape is not fully known;
- ``"size < 2"``: the dimension has nothing to split;
- ``"producer feeds a sliced and another input"``: one node feeds the sliced
  input and another input of the op (``MatMul(a, a)``), which the op graph
  cannot tell apart;
- ``"shape input not static"``: a shape-vector input (``Conv2DBackpropInput``'s
  ``input_sizes``) whose value TensorFlow cannot tell before running;
- ``"several outputs"``: the combine node stands for one output;
- ``"no rule for its attributes"``: NCHW convolutions, transposed MatMuls.

Counts are per (op, rule) pair, except the last, which is per op.

Example
-------
>>> import tensorflow as tf
>>> from costmodel import default_cost_model
>>> from fddps.tf.graphdef import analyse
>>> g = tf.Graph()
>>> with g.as_default():
...     x = tf.ones([8, 16], name="x")
...     y = tf.matmul(x, tf.ones([16, 4]), name="y")
>>> cands, skipped = split_candidates(analyse(g), default_cost_model(), ["CPU"], 2)
>>> sorted((c.op, c.rule.dim, c.size) for c in cands)
[('y', 'cols', 4), ('y', 'inner', 16), ('y', 'rows', 8)]
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

from ..errors import FddpsError
from ..strategy.fddps_splits import SPLIT_RULES, SplitCandidate, part_extents, part_name, rules_for
from .graphdef import _parse_input, kernel_attrs, kernel_shape
from .static_values import node_attrs, shape_input_value
from .structure import cond_branch_nodes



def _tied_to_group(op, node_def) -> bool:
    """Whether the op itself asks for colocation: a ``_class`` attribute, or a
    resource or reference input (TensorFlow puts it with the variable)."""
    if "_class" in node_def.attr:
        return True
    return any(t.dtype._is_ref_dtype or t.dtype.base_dtype.name == "resource" for t in op.inputs)


def _data_inputs(node_def):
    return [s for s in node_def.input if not s.startswith("^")]


def _candidate_for(rule, op, node_def, output_bytes, edge_bytes):
    """(SplitCandidate fields, or None) and the reason when None."""
    if len(op.outputs) != 1:
        return None, "several outputs"
    data = _data_inputs(node_def)
    in_shapes = [t.shape for t in op.inputs]
    needed = {rule.size_from[0]} | {i for i, _ in rule.sliced}
    if (not op.outputs[0].shape.is_fully_defined()
            or any(i >= len(in_shapes) or not in_shapes[i].is_fully_defined() for i in needed)):
        return None, "unknown shapes"
    i, axis = rule.size_from
    size = int(in_shapes[i].as_list()[axis])
    if size < 2:
        return None, "size < 2"
    producers = [_parse_input(s)[0] for s in data]
    sliced = []
    for inp, _ in rule.sliced:
        name = producers[inp]
        if producers.count(name) > 1:
            return None, "producer feeds a sliced and another input"
        sliced.append((name, float(edge_bytes[name])))
    for inp, _ in rule.shape_inputs:
        if shape_input_value(op, inp) is None:
            return None, "shape input not static"
    # Inputs every part needs whole (shape vectors become constants of the part).
    special = {i for i, _ in rule.sliced} | {i for i, _ in rule.shape_inputs}
    whole = {producers[i] for i in range(len(data)) if i not in special}
    return dict(rule=rule, size=size, sliced=tuple(sliced), output_bytes=float(output_bytes),
                whole_bytes=float(sum(edge_bytes[name] for name in whole)),
                elements=float(op.outputs[0].shape.num_elements()),
                kernel=(node_def, [tuple(s.as_list()) if s.is_fully_defined() else None
                                   for s in in_shapes],
                        tuple(op.outputs[0].shape.as_list()), op.outputs[0].dtype.name)), None


def _part_kernel_shape(fields, extent, attrs):
    """The kernel shape string of a part covering ``extent`` of the split dimension (the
    op's shapes with the sliced inputs' and a concatenated output's split axis at ``extent``),
    or None where the op has none (:func:`fddps.tf.graphdef.kernel_shape`; ``attrs`` the
    op's :func:`~fddps.tf.graphdef.kernel_attrs`, read once for all its parts)."""
    node_def, in_shapes, out_shape, dtype = fields["kernel"]
    rule = fields["rule"]
    ins = [None if s is None else list(s) for s in in_shapes]
    for k, axis in rule.sliced:
        ins[k][axis] = extent
    out = list(out_shape)
    if rule.combine == "concat":
        out[rule.concat_axis] = extent
    return kernel_shape(node_def, ins, out, dtype, attrs)


def _synthetic_rows(found, max_parts):
    """Op-table rows of the slice and combine ops of every candidate (two rows each)."""
    rows = []
    for name, fields in found:
        biggest = max((b for _, b in fields["sliced"]), default=0.0)
        out = fields["output_bytes"]
        rows.append(dict(name=f"{name}/fddps_slice", op_type="SplitV", flops=0.0,
                         input_bytes=biggest, output_bytes=biggest, param_bytes=0.0))
        if fields["rule"].combine == "concat":
            rows.append(dict(name=name, op_type="ConcatV2", flops=0.0, input_bytes=out,
                             output_bytes=out, param_bytes=0.0))
        else:
            # AddN of k parts: k inputs, k - 1 additions per element; k = the most
            # parts the cluster allows (plan_splits takes one combine cost for every k).
            k = max(2, min(max_parts, fields["size"]))
            rows.append(dict(name=name, op_type="AddN", flops=(k - 1) * fields["elements"],
                             input_bytes=k * out, output_bytes=out, param_bytes=0.0))
    return pd.DataFrame(rows, columns=["name", "op_type", "flops", "input_bytes",
                                       "output_bytes", "param_bytes"])


def _part_rows(found, rows_of, max_parts):
    """Op-table rows of every candidate's parts, one per extent (:func:`part_extents`).

    ``rows_of[name]`` is the op's own op-table row (a dict); a part's row is a
    copy with FLOPs and the sliced inputs' bytes scaled by its share, and the
    output's bytes by its share for a concatenated output (whole for partial sums),
    and ``profile_name`` the op's: a profiled cost model scales the op's own
    measurement to the part; ``kernel_shape`` the part's own (:func:`_part_kernel_shape`),
    so that a GPU preset's kernel model times the part as it times the whole op.

    Returns
    -------
    (pandas.DataFrame, list of (candidate index, extent)) : the rows and what each is.
    """
    from costmodel.kernel_model import TF_KERNEL_SHAPE_OPS

    rows, keys = [], []
    attrs_of, shape_of = {}, {}  # (an op's rules share its attributes; repeated layers, shapes)
    for c, (name, fields) in enumerate(found):
        whole = rows_of[name]
        sliced = sum(b for _, b in fields["sliced"])
        # (only an FP32 convolution or MatMul has a kernel shape: the others' attributes
        # are not read, and their parts get None, as kernel_shape gives them)
        node_def, in_shapes, out_shape, dtype = fields["kernel"]
        shaped = node_def.op in TF_KERNEL_SHAPE_OPS and dtype == "float32"
        attrs = head = None
        if shaped:
            attrs = attrs_of.get(name)
            if attrs is None:
                attrs = attrs_of[name] = kernel_attrs(node_def)
            head = (node_def.op, tuple(in_shapes), out_shape, fields["rule"],
                    tuple(sorted((k, tuple(v) if isinstance(v, list) else v)
                                 for k, v in attrs.items())))
        for extent in part_extents(fields["size"], max_parts):
            share = extent / fields["size"]
            out = fields["output_bytes"] * (share if fields["rule"].combine == "concat" else 1.0)
            shape = None
            if shaped:
                shape = shape_of.get((head, extent))
                if shape is None:
                    shape = shape_of[head, extent] = _part_kernel_shape(fields, extent, attrs)
            rows.append(dict(whole, name=part_name(name, 0), profile_name=name,
                             flops=whole["flops"] * share,
                             input_bytes=whole["input_bytes"] - sliced * (1 - share),
                             output_bytes=out, kernel_shape=shape))
            keys.append((c, extent))
    return pd.DataFrame(rows), keys


def _costs(cost_model, rows, device_types):
    """(n_rows, T) seconds of the synthetic rows, one column per device type."""
    try:
        from costmodel import ProfileCoverageWarning
    except ImportError:  # pragma: no cover - costmodel ships with fddps
        ProfileCoverageWarning = None
    saved = getattr(cost_model, "last_report", None)
    out = np.empty((len(rows), len(device_types)))
    for t, dtype in enumerate(device_types):
        with warnings.catch_warnings():
            # The rewrite's ops are not in any profile: their estimate is expected.
            if ProfileCoverageWarning is not None:
                warnings.simplefilter("ignore", ProfileCoverageWarning)
            times = np.asarray(cost_model.op_times(rows, dtype), dtype=np.float64)
        if times.shape != (len(rows),) or not np.all(np.isfinite(times) & (times >= 0)):
            raise FddpsError(f"cost_model.op_times gave invalid times for the slice, part or "
                             f"combine ops of intra-op splitting on {dtype!r}: {times!r}")
        out[:, t] = times
    if hasattr(cost_model, "last_report"):
        cost_model.last_report = saved  # the graph's own report, not the synthetic rows'
    return out


def split_candidates(analysis, cost_model, device_types, max_parts, *, step_nodes=None,
                     pinned=()):
    """Split candidates of the scheduled nodes of a graph.

    Parameters
    ----------
    analysis : fddps.tf.graphdef.GraphAnalysis
        The graph read by :func:`fddps.tf.graphdef.analyse`.
    cost_model : object
        ``op_times(ops, device_type) -> seconds`` per op-table row.
    device_types : sequence of str
        The OpGraph's device types (one cost per type).
    max_parts : int
        The most parts an op may be split into (the number of devices); sets the
        number of inputs assumed for an ``AddN`` combine.
    step_nodes : array of bool, optional
        Mask of the nodes that are scheduled (default: all).
    pinned : collection of str
        Names of nodes pinned to a device.

    Returns
    -------
    (list of SplitCandidate, dict)
        The candidates, in graph order (several per op: one per rule that
        applies), and ``{reason: count}`` of the (op, rule) pairs skipped.

    Raises
    ------
    FddpsError
        If the cost model gives invalid times for the slice, part or combine ops.
    """
    table = analysis.table
    n = len(table)
    keep = np.ones(n, dtype=bool) if step_nodes is None else np.asarray(step_nodes, dtype=bool)
    types = table["op_type"].to_numpy()
    splittable = keep & np.isin(types, list(SPLIT_RULES))
    skipped = {}
    if not splittable.any():
        return [], skipped
    in_cond = np.zeros(n, dtype=bool)
    if table["op_type"].isin(["Switch", "RefSwitch"]).any():
        in_cond = cond_branch_nodes(analysis)
    pinned = set(pinned)
    nodes = analysis.graph_def.node
    names = table["name"].tolist()
    frames, groups = table["loop_frame"].tolist(), table["colocation_group"].tolist()
    output_bytes = table["output_bytes"].tolist()
    e = analysis.edges
    src, dst, nbytes = e["src"].to_numpy(), e["dst"].to_numpy(), e["bytes"].to_numpy()
    # Edges grouped by consumer once (stable: each op's inputs stay in GraphDef order),
    # rather than a scan of every edge per candidate op.
    by_dst = np.argsort(dst, kind="stable")
    in_ptr = np.searchsorted(dst[by_dst], np.arange(n + 1)).tolist()
    in_src, in_bytes = src[by_dst].tolist(), nbytes[by_dst].tolist()

    def skip(reason, count=1):
        skipped[reason] = skipped.get(reason, 0) + count

    found = []
    for i in np.flatnonzero(splittable).tolist():
        node = nodes[i]
        keys = {key for rule in SPLIT_RULES[node.op] for key, _ in rule.when}
        rules = rules_for(node.op, node_attrs(node, keys))
        if not rules:
            skip("no rule for its attributes")
            continue
        op = analysis.graph.get_operation_by_name(names[i])
        reason = ("in a tf.while_loop frame" if frames[i]
                  else "in a tf.cond branch" if in_cond[i]
                  else "pinned" if names[i] in pinned
                  else "colocated" if groups[i] is not None and _tied_to_group(op, node)
                  else None)
        if reason:
            skip(reason, len(rules))
            continue
        edge_bytes = {}
        for e_k in range(in_ptr[i], in_ptr[i + 1]):
            producer = names[in_src[e_k]]
            edge_bytes[producer] = edge_bytes.get(producer, 0.0) + in_bytes[e_k]
        for rule in rules:
            fields, why = _candidate_for(rule, op, node, output_bytes[i], edge_bytes)
            if fields is None:
                skip(why)
            else:
                found.append((names[i], fields))
    if not found:
        return [], skipped
    types = list(device_types)
    costs = _costs(cost_model, _synthetic_rows(found, max_parts), types)
    position = {name: k for k, name in enumerate(names)}
    # One selection of the candidates' rows, not a pandas row lookup per candidate.
    chosen = sorted({position[name] for name, _ in found})
    rows_of = dict(zip(table["name"].iloc[chosen].tolist(),
                       table.iloc[chosen].to_dict("records")))
    rows, keys = _part_rows(found, rows_of, max_parts)
    # No rows when at most one part fits (one device): the candidates then have no part costs.
    part_times = _costs(cost_model, rows, types) if keys else np.empty((0, len(types)))
    part_costs = [[] for _ in found]
    for (c, extent), times in zip(keys, part_times.tolist()):
        part_costs[c].append((extent, tuple(times)))
    out = [SplitCandidate(name, fields["rule"], fields["size"], fields["sliced"],
                          fields["output_bytes"], slice_cost=tuple(costs[2 * j].tolist()),
                          combine_cost=tuple(costs[2 * j + 1].tolist()),
                          whole_bytes=fields["whole_bytes"], part_costs=tuple(part_costs[j]))
           for j, (name, fields) in enumerate(found)]
    return out, skipped
