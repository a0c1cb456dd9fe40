"""Sharded variables: a variable split by a strategy, written as one variable per part.

When a strategy splits a resource variable's colocation group (the
``VarHandleOp``, its reads, its optimizer slots and update:
:func:`fddps.strategy.strategy.shardable_groups`) along a dimension of the
variable, :func:`fddps.tf.strategy_rewrite.rewrite_strategy` writes, as
TensorFlow's partitioned variables are named:

- per part ``j`` of the variable ``V``, a shard ``V/part_j``: a ``VarHandleOp``
  of the part's shape on the part's device, and a read of it,
  ``V/part_j/Read/ReadVariableOp`` (what :func:`gather_variables` fetches);
  the optimizer slots likewise (``V/Momentum/part_j``);
- each part of a read (``ReadVariableOp``) reads its own shard, each part of
  the update (``ResourceApplyMomentum``, ``ResourceApplyGradientDescent``,
  ``ResourceApplyAdam``) updates its own shards with its part of the
  gradient; a reader that needs the whole weight gathers it
  (:meth:`~fddps.tf.strategy_rewrite._Writer.read`), which the cost model
  charges (:func:`fddps.strategy.expand`);
- ``V`` itself is gone, so no device holds the whole variable; every other
  user of its handle keeps its name and is written per shard
  (:func:`write_handle_users`): a read becomes the shards' reads
  concatenated (``ConcatV2``) under the read's name, so fetching it gives the
  whole value; an assignment (the initializer's ``V/Assign``, a restore)
  computes its value once, slices it, and assigns each shard its slice,
  under a ``NoOp`` of its name, so ``init`` initialises the shards to exactly
  the corresponding slices of what the original initializer produces;
  ``VarIsInitializedOp`` becomes the ``LogicalAnd`` of the shards'.

Any other use of the handle (a gather, a scatter, a second optimizer
outside the step, a ref ``VariableV2``) cannot be written per shard:
:func:`handle_blockers` names it, the searches keep such a variable whole
(``OpInfo.attrs["unshardable"]``), and the rewrite refuses a strategy that
splits it with a :class:`~fddps.strategy.StrategyError` naming the op.

Example
-------
>>> import fddps
>>> p = fddps.place(graph_def, devices, algorithm="tofu", fetches=["train", "loss"])  # doctest: +SKIP
>>> p.sharded_variables["w"].shards[0]                                                # doctest: +SKIP
VariableShard(name='w/part_0', device='/device:CPU:0', slice=(slice(0, 256), ...), ...)
>>> values = gather_variables(sess, p.sharded_variables)  # name -> whole ndarray  # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..strategy.strategy import SHARDED_VARIABLE_OPS, StrategyError
from .graphdef import _parse_input, _tf

#: Users of a variable's handle outside the step that the rewrite writes per shard.
HANDLE_USERS_WRITTEN = frozenset({"ReadVariableOp", "AssignVariableOp", "AssignAddVariableOp",
                                  "AssignSubVariableOp", "VarIsInitializedOp"})


class VariableShard(NamedTuple):
    """One shard of a sharded variable.

    Attributes
    ----------
    name : str
        The shard's ``VarHandleOp`` (``V/part_j``).
    device : str
    slice : tuple of slice
        The shard's part of the whole variable: ``whole[shard.slice]``.
    read : str
        A tensor reading the shard (``V/part_j/Read/ReadVariableOp:0``).
    """

    name: str
    device: str
    slice: tuple
    read: str


@dataclass
class ShardedVariable:
    """A variable the rewrite wrote as shards: its name, whole shape and dtype, its shards."""

    name: str
    shape: tuple
    dtype: str
    shards: list

    def assemble(self, values) -> np.ndarray:
        """The whole value from the shards' values (in :attr:`shards` order)."""
        out = np.empty(self.shape, dtype=np.asarray(values[0]).dtype)
        for shard, value in zip(self.shards, values):
            out[shard.slice] = value
        return out


def gather_variables(session, sharded, names=None) -> dict:
    """The whole values of sharded variables, read from their shards in one run.

    Parameters
    ----------
    session : tf.compat.v1.Session
        A session of the placed graph (imported with ``name=""``).
    sharded : dict of str -> ShardedVariable
        :attr:`fddps.tf.Placement.sharded_variables` (or what
        :func:`~fddps.tf.strategy_rewrite.rewrite_strategy` returns with
        ``return_shards=True``).
    names : list of str, optional
        The variables to read (default: every one).

    Returns
    -------
    dict of str -> numpy.ndarray
        Whole values, ready to checkpoint or to assign into the original graph.

    Raises
    ------
    KeyError
        For a name that is not a sharded variable (named).
    """
    names = list(sharded) if names is None else list(names)
    for n in names:
        if n not in sharded:
            raise KeyError(f"{n!r} is not a sharded variable (sharded: {sorted(sharded)})")
    values = session.run({n: [s.read for s in sharded[n].shards] for n in names})
    return {n: sharded[n].assemble(values[n]) for n in names}


def handle_blockers(graph_def, step_names) -> dict:
    """Per resource variable of ``graph_def``: the first user of its handle that the
    rewrite cannot write per shard, as ``"op 'X' (Type) ..."``; variables without one
    are absent.

    Inside the step (``step_names``) a user is written when it is of
    :data:`~fddps.strategy.strategy.SHARDED_VARIABLE_OPS` (the strategy layer
    checks the group); outside it, when it is of :data:`HANDLE_USERS_WRITTEN`.
    """
    variables = {n.name for n in graph_def.node if n.op == "VarHandleOp"}
    out = {}
    for node in graph_def.node:
        allowed = SHARDED_VARIABLE_OPS if node.name in step_names else HANDLE_USERS_WRITTEN
        for s in node.input:
            src, port = _parse_input(s)
            if src in variables and port >= 0 and src not in out and node.op not in allowed:
                where = "in the step" if node.name in step_names else "outside the step"
                out[src] = (f"op {node.name!r} ({node.op}, {where}) uses its handle in a way the "
                            "rewrite cannot write per shard")
    return out


def _shape_attr(node, shape):
    del node.attr["shape"].shape.dim[:]
    for d in shape:
        node.attr["shape"].shape.dim.add().size = int(d)


def write_shards(w, name, parts_, box_of, original):
    """The shard ``VarHandleOp``s of variable ``name`` (one per part) and their reads.

    Records ``w.shards[name] = [(shard name, box, device)]``; returns the shard names.
    """
    tf = _tf()
    existing = w.names
    shards, names = [], []
    for p in parts_:
        box = box_of(p)
        sname = f"{name}/part_{p.index}"
        read = f"{sname}/Read/ReadVariableOp"
        for n in (sname, read):
            if n in existing:
                raise StrategyError(f"variable {name!r}: its shard's name {n!r} is taken by a node "
                                    "of the graph")
        node = tf.compat.v1.NodeDef()
        node.CopyFrom(original)
        node.name, node.device = sname, p.device
        for key in ("_class", "_output_shapes"):
            node.attr.pop(key, None)
        _shape_attr(node, [b - a for a, b in box])
        node.attr["shared_name"].s = sname.encode()
        w.add(node)
        r = tf.compat.v1.NodeDef(name=read, op="ReadVariableOp", device=p.device)
        r.input.append(sname)
        r.attr["dtype"].type = original.attr["dtype"].type
        w.add(r)
        shards.append((sname, box, p.device))
        names.append(sname)
    w.shards[name] = shards
    return names


def write_shard_users(w, name, op, parts_, original, controls):
    """The parts of a read or an update of sharded variables: part ``j`` uses shard ``j``
    of each variable input, its own box of every other input.

    Returns (per output the part entries ``[(tensor, box, device)]``, the part names).
    """
    from ..strategy.expand import _tensor_box as _box
    from ..strategy.ops import resolve

    tf = _tf()
    dims = resolve(op)
    outs, names = [[] for _ in op.output_shapes], []
    for p in parts_:
        pname = f"{name}/fddps_part_{p.index}"
        node = tf.compat.v1.NodeDef()
        node.CopyFrom(original)
        node.name, node.device = pname, p.device
        for key in ("_class", "_output_shapes"):
            node.attr.pop(key, None)
        del node.input[:]
        for k, ((src, port), axes) in enumerate(zip(op.inputs, dims.inputs)):
            if src in w.shards:
                shard, _, device = w.shards[src][p.index]
                if device != p.device:
                    raise StrategyError(f"op {name!r} ({op.op_type}): part {p.index} on {p.device!r} "
                                        f"uses shard {shard!r} on {device!r}")
                node.input.append(shard)
                continue
            shape = op.input_shapes[k]
            node.input.append(w.read(src, port, _box(axes, shape, p.box), p.device, shape))
        node.input.extend(controls)
        w.add(node)
        names.append(pname)
        for k, (m, s) in enumerate(zip(dims.outputs, op.output_shapes)):
            outs[k].append((f"{pname}:{k}" if k else pname, _box(m, s, p.box), p.device))
    return outs, names


def check_sharded_group(step, strategy, name, blockers):
    """Raise :class:`StrategyError` unless the split of variable ``name`` can be written:
    nothing blocks its handle, and every op of its group is a shardable op type
    configured as the variable is, over the same iteration domain."""
    from ..strategy.ops import resolve

    op = step.ops[name]
    if name in blockers:
        raise StrategyError(f"variable {name!r} cannot be split: {blockers[name]}; keep it, its "
                            "reads and updates whole")
    cfg, extent = strategy.config(name), resolve(op).extent
    for other in step.ops.values():
        if other.group != op.group or not other.tied or other.name == name:
            continue
        if other.op_type not in SHARDED_VARIABLE_OPS:
            raise StrategyError(f"variable {name!r} cannot be split: op {other.name!r} "
                                f"({other.op_type}) of its group is not written split")
        if strategy.config(other.name) != cfg or resolve(other).extent != extent:
            raise StrategyError(f"variable {name!r} is split but op {other.name!r} "
                                f"({other.op_type}) of its group is configured differently")


def write_handle_users(w, nodes):
    """Nodes outside the step that use split variables' handles, written per shard under
    their own names (see the module notes). ``nodes``: their original NodeDefs."""
    tf = _tf()
    for node in nodes:
        var = next(_parse_input(s)[0] for s in node.input
                   if _parse_input(s)[0] in w.shards and not s.startswith("^"))
        shards = w.shards[var]
        home = shards[0][2]
        controls = [s for s in node.input if s.startswith("^")]
        parts_ = []
        for k, (shard, box, device) in enumerate(shards):
            part = tf.compat.v1.NodeDef()
            part.CopyFrom(node)
            part.name, part.device = f"{node.name}/part_{k}", device
            for key in ("_class", "_output_shapes"):
                part.attr.pop(key, None)
            del part.input[:]
            part.input.append(shard)
            if node.op in ("AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp"):
                value = node.input[1]
                dtype = tf.as_dtype(node.attr["dtype"].type)
                # The value is computed once (on the first shard's device) and sliced:
                # each shard starts from exactly its slice of the original's value.
                full = tuple((0, b) for _, b in _whole_box(shards))
                part.input.append(w.slice(value, full, box, home, dtype, f"{node.name}/value"))
            part.input.extend(controls)
            w.add(part)
            parts_.append((box, part.name))
        if node.op == "ReadVariableOp":
            dtype = tf.as_dtype(node.attr["dtype"].type)
            whole = w.assemble(parts_, home, dtype, f"{node.name}/gather")
            out = tf.compat.v1.NodeDef(name=node.name, op="Identity", device=home)
            out.input.append(whole)
            out.attr["T"].type = dtype.as_datatype_enum
            w.add(out)
        elif node.op == "VarIsInitializedOp":
            acc = parts_[0][1]
            for k, (_, t) in enumerate(parts_[1:], start=1):
                last = k == len(parts_) - 1
                n = tf.compat.v1.NodeDef(name=node.name if last else f"{node.name}/and_{k}",
                                         op="LogicalAnd", device=home)
                n.input.extend([acc, t])
                w.add(n)
                acc = n.name
            if len(parts_) == 1:
                n = tf.compat.v1.NodeDef(name=node.name, op="Identity", device=home)
                n.input.append(acc)
                n.attr["T"].type = tf.bool.as_datatype_enum
                w.add(n)
        else:  # an assignment: its name runs every shard's
            n = tf.compat.v1.NodeDef(name=node.name, op="NoOp", device=home)
            n.input.extend(f"^{t}" for _, t in parts_)
            w.add(n)


def _whole_box(shards):
    """The box the shards tile (each axis from the smallest start to the largest stop)."""
    boxes = [b for _, b, _ in shards]
    return tuple((min(b[a][0] for b in boxes), max(b[a][1] for b in boxes))
                 for a in range(len(boxes[0])))


def retarget(out, split_names):
    """Colocation with and control inputs on a removed variable ``V`` now name its shards
    (``loc:@V`` -> ``loc:@V/part_0``; ``^V`` -> ``^V/part_j`` for every j)."""
    for node in out.node:
        if "_class" in node.attr:
            values = list(node.attr["_class"].list.s)
            new = [(f"loc:@{split_names[v[5:].decode()][0]}".encode()
                    if v.startswith(b"loc:@") and v[5:].decode() in split_names else v)
                   for v in values]
            if new != values:
                del node.attr["_class"].list.s[:]
                node.attr["_class"].list.s.extend(new)
        if any(s.startswith("^") and s[1:] in split_names for s in node.input):
            inputs = []
            for s in node.input:
                if s.startswith("^") and s[1:] in split_names:
                    inputs.extend(f"^{t}" for t in split_names[s[1:]])
                else:
                    inputs.append(s)
            del node.input[:]
            node.input.extend(inputs)


def sharded_table(w, graph) -> dict:
    """``{variable: ShardedVariable}`` of what the writer sharded."""
    out = {}
    for name, shards in w.shards.items():
        t = graph.get_operation_by_name(name)
        shape = tuple(d.size for d in t.node_def.attr["shape"].shape.dim)
        dtype = _tf().as_dtype(t.node_def.attr["dtype"].type).name
        out[name] = ShardedVariable(name, shape, dtype, [
            VariableShard(s, d, tuple(slice(a, b) for a, b in box), f"{s}/Read/ReadVariableOp:0")
            for s, box, d in shards])
    return out
