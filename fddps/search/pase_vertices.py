"""The vertex-elimination DP's graph and configurations: :func:`coarsen`, :func:`vertex_configs`.

Vertices (:func:`coarsen`) cover every op of the step, so every op's time is in
the DP's objective and every tensor between two vertices is an edge:

- each forward op with its gradient ops (``gradients/<op>_grad/...``), the
  ops TensorFlow colocates with it (a variable's group: the variable, its
  reads, slots and update) and the single-reader element-wise ops after it
  is one vertex (Tofu's and the paper's coarsening: a layer);
- ops that neither compute, hold weights, nor are large splittable tensors
  (shapes, constants, scalar arithmetic) join the vertex they serve: their
  first reader's (latest first, so chains of them move together), else, for
  an op nobody reads, its first producer's.

A vertex's configuration is the paper's (Section 1): a split factor for every
dimension of the iteration domain of its *anchor* (the op of the vertex with
the most FLOPs that is neither tied to a variable nor a gradient: the layer's
forward op), all at once, their product at most the number of devices,
reduction dimensions included (their parts hold partial sums); plus the
whole vertex on any one device. Its other ops follow the anchor through the
tensors they share (:func:`letter_map`): a layer's forward op and its two
gradients share one iteration domain (a GEMM's ``(m, n, k)``; a
convolution's ``(n, o, i, h, w)``), each with its own reduction dimensions,
and element-wise ops follow the layout of the tensor they read. Parts map to
devices by one fixed rule: the part with coordinates ``x`` in the anchor's
dimensions (in the anchor's order, the last fastest) runs on
``devices[sum x_d * stride_d]``, so a configuration is device-agnostic and
every op of the vertex keeps the same piece of data on the same device. Ops
the configuration does not split run on ``devices[0]``; a variable's group
that it does not split on the group's home device (spread by bytes, as
:func:`~fddps.strategy.strategy.data_parallel` spreads them).
"""

from __future__ import annotations

import re
from collections import defaultdict

import numpy as np
from networkx.utils import UnionFind

from ..strategy.ops import HaloAxis
from ..strategy.strategy import VARIABLE_TYPES, OpConfig, group_devices, shardable_groups
from .space import decision_units, resolved_or_none, worth_deciding

_GRAD = re.compile(r"^gradients(?:_\d+)?/(.*)_grad/")

#: Op types folded into their producer's vertex (same layout in and out).
ELEMENTWISE = {"Relu", "Relu6", "BiasAdd", "AddV2", "Add", "Mul", "Sub", "FusedBatchNormV3",
               "Identity", "Tanh", "Sigmoid", "Cast", "Neg"}


def _readers(step) -> dict:
    out = defaultdict(list)
    for name, op in step.ops.items():
        for src in dict.fromkeys([p for p, _ in op.inputs] + list(op.control_inputs)):
            out[src].append(name)
    return out


#: Tensors of at most this many elements are scalars or shape vectors.
SCALAR = 8


def _elements(op, port) -> float:
    """Elements of output ``port`` of ``op`` (inf when unknown)."""
    shape = op.output_shapes[port] if port < len(op.output_shapes) else None
    if shape is None or any(d is None for d in shape):
        return float("inf")
    return float(np.prod(shape)) if shape else 1.0


def decides(op, worth=None) -> bool:
    """Whether an op makes a vertex of its own: it computes or holds weights
    (:func:`~fddps.search.space.worth_deciding`) and is not scalar or shape
    arithmetic (every output of at most 8 elements, no weights: ``Rank - 1``).
    ``worth``: ``worth_deciding`` or a function giving the same answers (a cache)."""
    if not (worth or worth_deciding)(op):
        return False
    if op.param_bytes > 0:
        return True
    return any(_elements(op, k) > SCALAR for k in range(len(op.output_shapes)))


def coarsen(step) -> list:
    """The DP's vertices: lists of op names, in step order, covering every op once.

    Example
    -------
    >>> from fddps.strategy.graph import OpInfo, StepGraph
    >>> g = StepGraph([OpInfo("x", "Const", output_shapes=((64, 512),), output_bytes=131072.0),
    ...                OpInfo("s", "Shape", inputs=(("x", 0),), output_shapes=((2,),)),
    ...                OpInfo("y", "Relu", inputs=(("x", 0),), flops=32768.0)])
    >>> coarsen(g)
    [['x', 'y', 's']]
    """
    units = decision_units(step)
    # (worth_deciding and decides resolve the op's description; asked several times per
    # op here: each answer kept)
    worth_of, decides_of = {}, {}

    def worth_op(op):
        got = worth_of.get(op.name)
        if got is None:
            got = worth_of[op.name] = worth_deciding(op)
        return got

    def decides_here(op):
        got = decides_of.get(op.name)
        if got is None:
            got = decides_of[op.name] = decides(op, worth_op)
        return got

    unit_of = {n: u for u in units for n in u}
    vertices = UnionFind(units)
    join = vertices.union
    readers = _readers(step)
    for name in step.ops:
        m = _GRAD.match(name)
        if m and m.group(1) in step.ops:  # a gradient op joins its forward op
            join(unit_of[m.group(1)], unit_of[name])
    data_readers = defaultdict(list)
    for name, op in step.ops.items():
        for src in dict.fromkeys(p for p, _ in op.inputs):
            data_readers[src].append(name)
    for name, op in step.ops.items():
        if op.tied and op.group is not None:
            if op.group in step.ops and not step.ops[op.group].tied:
                # TensorFlow colocates it with that op (a gradient's tuple/control_dependency).
                join(unit_of[op.group], unit_of[name])
            for r in data_readers[name]:  # variables join their first forward reader
                if not step.ops[r].tied and not _GRAD.match(r) and worth_op(step.ops[r]):
                    join(unit_of[r], unit_of[name])
                    break
        if op.op_type in ELEMENTWISE and op.inputs and not _GRAD.match(name):
            src = op.inputs[0][0]
            if len(readers[src]) == 1 and worth_op(step.ops[src]):
                join(unit_of[src], unit_of[name])
    for name, op in step.ops.items():
        # A reduction to a scalar (a weight decay's L2Loss, the loss's Mean) serves the
        # tensor it reads: it joins that tensor's producer.
        big = [src for src, port in op.inputs if _elements(step.ops[src], port) > SCALAR]
        if not op.tied and op.inputs and len(big) == 1 and not decides_here(op) and \
                worth_op(op) and not _GRAD.match(name):
            join(unit_of[big[0]], unit_of[name])
    groups = defaultdict(list)
    for u in units:
        groups[vertices[u]].extend(u)
    position = {n: i for i, n in enumerate(step.ops)}
    worth = {r for r, g in groups.items() if any(decides_here(step.ops[n]) for n in g)}
    if not worth:
        return [list(step.ops)]
    root_of = {n: r for r, g in groups.items() for n in g}
    home = {r: r for r in worth}
    rest = [r for r in groups if r not in worth]
    # Latest first: an op's readers are placed before it.
    for r in sorted(rest, key=lambda r: -max(position[n] for n in groups[r])):
        for n in sorted(groups[r], key=position.get, reverse=True):
            target = next((home[root_of[x]] for x in readers[n]
                           if root_of[x] != r and root_of[x] in home), None)
            if target is not None:
                home[r] = target
                break
    for r in sorted(rest, key=lambda r: min(position[n] for n in groups[r])):
        if r in home:
            continue
        for n in sorted(groups[r], key=position.get):
            op = step.ops[n]
            target = next((home[root_of[s]] for s in [p for p, _ in op.inputs] +
                           list(op.control_inputs) if root_of[s] in home), None)
            if target is not None:
                home[r] = target
                break
        home.setdefault(r, min(worth, key=lambda w: min(position[n] for n in groups[w])))
    merged = defaultdict(list)
    for r, g in groups.items():
        merged[home[r]].extend(g)
    out = [sorted(g, key=position.get) for g in merged.values()]
    return sorted(out, key=lambda g: position[g[0]])


def anchor(step, vertex, dims_of) -> str | None:
    """The op whose iteration domain a vertex's configurations split (module notes), or None."""
    ok = [n for n in vertex if dims_of[n] is not None and dims_of[n].dims and not step.ops[n].tied]
    if not ok:
        return None
    forward = [n for n in ok if not _GRAD.match(n)] or ok
    return max(forward, key=lambda n: (step.ops[n].flops, step.ops[n].output_bytes,
                                       -vertex.index(n)))


def _axis_letter(axis):
    if isinstance(axis, HaloAxis):
        return axis.dim
    return axis if isinstance(axis, str) else None


def _axes(spec):
    return tuple(_axis_letter(a) for a in spec) if isinstance(spec, tuple) and not (
        spec and spec[0] == "shape") else None


def letter_map(step, vertex, anchor_name, dims_of) -> dict:
    """Per op of ``vertex``: ``{its dimension letter: the anchor's letter}`` (module notes).

    Letters are matched through tensors: the anchor's inputs and outputs carry
    its letters; an op reading or writing a tensor whose axes carry known
    letters maps its letters onto them, then writes its outputs' axes. Letters
    left are matched by name (a convolution's gradients name ``n``, ``h``,
    ``w`` as the convolution does) or, when one is left on each side, to
    each other; always between dimensions of equal extent.
    """
    adims = dims_of[anchor_name]
    known = {}  # (op, port) -> anchor letters per axis
    anchor_op = step.ops[anchor_name]
    for (src, port), spec in zip(anchor_op.inputs, adims.inputs):
        if _axes(spec) is not None:
            known.setdefault((src, port), _axes(spec))
    for port, spec in enumerate(adims.outputs):
        if _axes(spec) is not None:
            known[(anchor_name, port)] = _axes(spec)
    out = {anchor_name: {d: d for d in adims.dims}}
    todo = [n for n in vertex if n != anchor_name and dims_of[n] is not None and dims_of[n].dims]
    for _ in range(3):  # a later op's output may be an earlier one's input (gradients)
        progress = False
        for n in todo:
            if n in out:
                continue
            op, dims = step.ops[n], dims_of[n]
            mapping = {}

            def match(own, theirs):
                if own is None or theirs is None or len(own) != len(theirs):
                    return
                for a, b in zip(own, theirs):
                    if a is None or b is None or a not in dims.extent:
                        continue
                    if a not in mapping and b not in mapping.values() and \
                            dims.extent[a] == adims.extent.get(b):
                        mapping[a] = b

            for (src, port), spec in zip(op.inputs, dims.inputs):
                match(_axes(spec), known.get((src, port)))
            for port, spec in enumerate(dims.outputs):
                match(_axes(spec), known.get((n, port)))
            if not mapping:
                continue
            free_own = [d for d in dims.dims if d not in mapping]
            free_anchor = [d for d in adims.dims if d not in mapping.values()]
            for d in list(free_own):
                if d in free_anchor and dims.extent[d] == adims.extent[d]:
                    mapping[d] = d
                    free_own.remove(d)
                    free_anchor.remove(d)
            if len(free_own) == 1 and len(free_anchor) == 1 and \
                    dims.extent[free_own[0]] == adims.extent[free_anchor[0]]:
                mapping[free_own[0]] = free_anchor[0]
            out[n] = mapping
            progress = True
            for port, spec in enumerate(dims.outputs):
                axes = _axes(spec)
                if axes is not None:
                    known.setdefault((n, port), tuple(mapping.get(a) for a in axes))
        if not progress:
            break
    return out


def factor_tuples(extents, k, powers_of_two=False) -> list:
    """Split factors for dimensions of ``extents``: every tuple with product at most ``k``,
    each at most its extent, the all-ones tuple left out (the paper's Algorithm 1, line 8).

    >>> factor_tuples([4, 4], 2)
    [(1, 2), (2, 1)]
    >>> len(factor_tuples([64, 64, 64], 4)), len(factor_tuples([64, 64, 64], 4, True))
    (12, 9)
    """
    out = []

    def rec(i, prod, acc):
        if i == len(extents):
            if prod > 1:
                out.append(tuple(acc))
            return
        f = 1
        while prod * f <= k and f <= extents[i]:
            rec(i + 1, prod * f, acc + [f])
            f = f * 2 if powers_of_two else f + 1

    rec(0, 1, [])
    return out


def config_key(cfgs) -> tuple:
    return tuple((n,) + c.key for n, c in cfgs.items())


def vertex_configs(step, vertex, devices, *, dims_of=None, homes=None, writable=False,
                   powers_of_two=False, memo=None) -> list:
    """A vertex's configurations: ``(label, {op: OpConfig})`` per choice (module notes).

    Whole on each device (``"whole@<device>"``), then every factor tuple of the
    anchor's dimensions (``"n2c2"``: the letters split and their factors).
    ``homes``: a variable group's device when a configuration leaves it whole
    (default :func:`~fddps.strategy.strategy.group_devices`). ``writable``: a
    variable group splits only where the GraphDef rewrite writes it
    (:func:`~fddps.strategy.strategy.shardable_groups`). Duplicates (two
    tuples that split no op differently) are left out. ``memo``: a dict kept across
    the vertices of one space, where equal configurations are made once and shared
    (the same values; fewer objects to make, and to key in the tables).
    """
    if dims_of is None:
        dims_of = {n: resolved_or_none(step.ops[n]) for n in vertex}
    if homes is None:
        homes = vertex_homes(step, devices)
    k = len(devices)
    memo = {} if memo is None else memo
    wholes = [_whole(memo, d) for d in devices]
    out = [(f"whole@{d}", dict.fromkeys(vertex, w)) for d, w in zip(devices, wholes)]
    a = anchor(step, vertex, dims_of)
    if a is None or k == 1:
        return out
    adims = dims_of[a]
    letters = list(adims.dims)
    maps = letter_map(step, vertex, a, dims_of)
    groups = defaultdict(list)
    for n in vertex:
        if step.ops[n].tied and step.ops[n].group is not None:
            groups[step.ops[n].group].append(n)
    shardable = shardable_groups(step) if writable and groups else {}
    whole = wholes[0]
    # Ops no letter maps to the anchor are whole on the first device in every split
    # configuration: built once, and left out of the duplicate check.
    mapped = [n for n in vertex if maps.get(n) and dims_of[n] is not None]
    grouped = [n for names in groups.values() for n in names]
    keyed = list(dict.fromkeys(mapped + grouped))
    signature = {n: (step.ops[n].tied and not maps[n],) + tuple(
        (d, maps[n].get(d), dims_of[n].extent[d]) for d in dims_of[n].dims) for n in mapped}
    seen = set()
    at = (tuple(letters), tuple(devices))
    for factors in factor_tuples([adims.extent[d] for d in letters], k, powers_of_two):
        f = dict(zip(letters, factors))
        fkey = at + (tuple(factors),)
        stride, s = {}, 1
        for d in reversed(letters):
            stride[d] = s
            s *= f[d]
        cfgs = dict.fromkeys(vertex, whole)
        made = {}  # ops with one signature (dimensions, their letters, extents) split alike
        for n in mapped:
            sig = signature[n]
            if sig not in made:
                # (a mapped op's configuration is a function of its signature, the
                # anchor's letters and factors, and the devices: shared across vertices)
                got = memo.get((sig, fkey))
                if got is None:
                    got = memo[sig, fkey] = _op_config(step.ops[n], dims_of[n], maps[n], f,
                                                       stride, devices)
                made[sig] = got
            cfgs[n] = made[sig]
        for g, names in groups.items():
            # Ops bound to one group share one configuration: the first split one's, if
            # every member has its dimensions (a variable, its reads, slots, update).
            split = next((cfgs[n] for n in names if cfgs[n].num_parts > 1), None)
            ok = split is not None and (not writable or set(names) <= set(shardable.get(g, ())))
            if ok:
                ref = dims_of[next(m for m in names if cfgs[m] is split)]
                for n in names:
                    dims = dims_of[n]
                    if dims is None or any(dims.extent.get(d) != ref.extent[d]
                                           for d in split.split):
                        ok = False
                        break
            for n in names:
                cfgs[n] = split if ok else _whole(memo, homes.get(g, devices[0]))
        key = tuple([(n,) + cfgs[n].key for n in keyed])  # (config_key's)
        if key in seen or not any(cfgs[n].num_parts > 1 for n in keyed):
            continue
        seen.add(key)
        label = "".join(f"{d}{f[d]}" for d in letters if f[d] > 1)
        out.append((label, cfgs))
    return out


def _whole(memo, device) -> OpConfig:
    """The configuration whole on ``device``, one object per ``memo`` (a dict)."""
    got = memo.get(("whole", device))
    if got is None:
        got = memo["whole", device] = OpConfig({}, (device,))
    return got


def _op_config(op, dims, mapping, f, stride, devices) -> OpConfig:
    """One op's configuration under the anchor factors ``f`` (fixed device rule)."""
    if dims is None or op.tied and not mapping:
        return OpConfig({}, (devices[0],))
    split = {d: f[mapping[d]] for d in dims.dims
             if d in mapping and f.get(mapping[d], 1) > 1 and f[mapping[d]] <= dims.extent[d]}
    if not split:
        return OpConfig({}, (devices[0],))
    # Each part's device: its coordinates times the anchor's strides, parts enumerated
    # over the op's dimensions with the last fastest (as itertools.product).
    offsets = [0]
    for d in dims.dims:
        if d in split:
            s = stride[mapping[d]]
            offsets = [o + x * s for o in offsets for x in range(split[d])]
    return OpConfig(split, tuple(devices[j] for j in offsets))


def vertex_homes(step, devices) -> dict:
    """Home device per variable group (spread by bytes, largest first)."""
    groups = {op.group for op in step.ops.values()
              if op.group is not None and op.op_type in VARIABLE_TYPES}
    return group_devices(step, list(devices), groups)


__all__ = ["ELEMENTWISE", "anchor", "coarsen", "config_key", "factor_tuples", "letter_map",
           "vertex_configs", "vertex_homes"]
