"""Ops TensorFlow fuses into one kernel, kept on one device: :func:`fusion_groups`.

TensorFlow rewrites a graph after fddps has placed it, and two of its
rewrites merge ops into one kernel regardless of the devices written on them:

- **Grappler's remapper** (``grappler/optimizers/remapper.cc``) replaces a
  contraction and the ops after it (``Conv2D`` + ``BiasAdd`` (+ ``Relu``, +
  ``Add``), ``MatMul`` + ``BiasAdd``, ``DepthwiseConv2dNative`` + ``BiasAdd``,
  ``x * sigmoid(x)``, ...) by one fused op named after the *last* op of the
  pattern and put on the *first* op's device. When fddps placed the two on
  different devices, the last op silently runs on the first op's device
  (:meth:`fddps.tf.StepPlacement.moved_ops` shows it), and the fused-away
  first op disappears from the partition graphs without a trace.
- **oneDNN's layout pass** (``mkl_layout_pass.cc``, on x86 CPUs by default)
  fuses ``Conv2D`` + ``BiasAdd`` and ``Conv2DBackpropFilter`` + ``BiasAddGrad``
  of the same gradient, but only when both are on one device. Split across
  two, each runs its own kernel, which rounds differently: in float32 the step
  then differs from the unplaced one by rounding, which batch norm at a small
  batch amplifies (see :mod:`fddps.tf.float64`).

So the ops of each fusion are placed together: :func:`colocate_fusions`
writes a ``_class`` ``loc:@`` attribute on them, which both fddps
(:func:`fddps.tf.graphdef.analyse` reads it as a colocation group) and
TensorFlow's placer honour. The remapper's fusions are found by running the
remapper itself (:func:`fusion_groups`) on a copy of the graph with every node
on one device of the type given, so they follow the TensorFlow version
installed rather than a list written here; the oneDNN pairs, which are decided
after partitioning, are found by their pattern.

Example
-------
>>> import tensorflow as tf
>>> g = tf.Graph()
>>> with g.as_default():
...     x = tf.compat.v1.placeholder(tf.float32, [2, 8, 8, 3], name="x")
...     c = tf.nn.conv2d(x, tf.ones([3, 3, 3, 4]), 1, "SAME", name="conv")
...     b = tf.nn.bias_add(c, tf.ones([4]), name="bias")
>>> fusion_groups(g.as_graph_def(), fetches=["bias"])
[['conv', 'bias']]
"""

from __future__ import annotations

from ..errors import GraphError
from .devices import same_device
from .graphdef import _parse_input, _tf, load_graph

#: oneDNN's post-partitioning fusions: (producer op, consumer op, producer input
#: the consumer must share, or None when the consumer reads the producer's output).
ONEDNN_PAIRS = (
    ("Conv2D", "BiasAdd", None),
    ("Conv2DBackpropFilter", "BiasAddGrad", 2),
)


def _remapper_groups(graph_def, fetches, device):
    """Groups of node names Grappler's remapper fuses, with every node on ``device``."""
    _tf()  # TensorFlow, quietly imported
    from tensorflow.core.protobuf import config_pb2, meta_graph_pb2
    from tensorflow.python.grappler import tf_optimizer

    meta = meta_graph_pb2.MetaGraphDef()
    meta.graph_def.CopyFrom(graph_def)
    for node in meta.graph_def.node:
        node.device = device
    names = {node.name for node in graph_def.node}
    keep = [_parse_input(f)[0] for f in (fetches or [])] or [
        node.name for node in graph_def.node]
    keep = [name for name in keep if name in names]
    meta.collection_def["train_op"].node_list.value.extend(keep)
    config = config_pb2.ConfigProto()
    rewrite = config.graph_options.rewrite_options
    rewrite.optimizers.append("remap")
    rewrite.min_graph_nodes = -1
    rewrite.meta_optimizer_iterations = 1  # ONE
    try:
        out = tf_optimizer.OptimizeGraph(config, meta)
    except Exception:  # noqa: BLE001 - grappler refuses some graphs; then no fusions are known
        return []
    before = {node.name: node for node in graph_def.node}
    after = {node.name: node for node in out.node}
    groups = []
    for name, node in after.items():
        old = before.get(name)
        if old is None or old.op == node.op:
            continue
        # The fused op keeps the last op's name; the ops it absorbed are its
        # ancestors that the rewrite removed, reached through removed ops only.
        group, stack = [], [name]
        seen = {name}
        while stack:
            for s in before[stack.pop()].input:
                src = _parse_input(s)[0]
                if src in seen or src in after or src not in before:
                    continue
                seen.add(src)
                group.append(src)
                stack.append(src)
        if group:
            groups.append(sorted(group, key=list(before).index) + [name])
    return groups


def _onednn_groups(graph_def):
    """Producer-consumer pairs oneDNN fuses when they share a device (:data:`ONEDNN_PAIRS`)."""
    nodes = list(graph_def.node)
    consumers = {}
    by_input = {}
    for node in nodes:
        for k, s in enumerate(node.input):
            if s.startswith("^"):
                continue
            name, port = _parse_input(s)
            consumers.setdefault(name, []).append((node, k, port))
            by_input.setdefault(s if ":" in s else s + ":0", []).append((node, k))
    by_name = {node.name: node for node in nodes}
    groups = []
    for producer, consumer, shared in ONEDNN_PAIRS:
        for node in nodes:
            if node.op != producer:
                continue
            if shared is None:
                users = [c for c, k, port in consumers.get(node.name, ()) if port == 0]
                if len(users) == 1 and users[0].op == consumer:
                    groups.append([node.name, users[0].name])
            elif len(node.input) > shared:
                s = node.input[shared]
                key = s if ":" in s else s + ":0"
                for c, k in by_input.get(key, ()):
                    if c.op == consumer and k == 0 and c.name in by_name:
                        groups.append([node.name, c.name])
                        break
    return groups


def fusion_groups(graph_def, fetches=None, device_type="CPU"):
    """Groups of ops TensorFlow fuses into one kernel on a ``device_type`` device.

    Parameters
    ----------
    graph_def : GraphDef, tf.Graph, bytes or path
        The graph (as :func:`fddps.tf.load_graph` reads it).
    fetches : list of str, optional
        What a step runs; the remapper keeps these nodes whole. Default: every node.
    device_type : str
        ``"CPU"`` (default) or ``"GPU"``: the fusions differ by device type. A
        type this process has no device of is run by Grappler as if present.

    Returns
    -------
    list of list of str
        Each group's node names, the fused op's name last, each group once;
        groups may overlap (they are merged when colocated).

    Raises
    ------
    GraphError
        If ``graph_def`` is not a graph.
    """
    tf = _tf()
    if not isinstance(graph_def, tf.compat.v1.GraphDef):
        graph_def, _ = load_graph(graph_def)
    device = f"/job:localhost/replica:0/task:0/device:{device_type}:0"
    groups = _remapper_groups(graph_def, fetches, device)
    if device_type == "CPU":
        groups += _onednn_groups(graph_def)
    # A pair both the remapper fuses and oneDNN would (Conv2D + BiasAdd) is one group.
    return [list(g) for g in dict.fromkeys(tuple(g) for g in groups)]


def colocate_fusions(graph_def, fetches=None, device_types=("CPU",)):
    """Write a ``_class`` ``loc:@`` attribute so each fusion's ops share a device, in place.

    Parameters
    ----------
    graph_def : tf.compat.v1.GraphDef
        Modified in place: every op of a fusion group (:func:`fusion_groups`,
        for each device type given) but its first gets ``loc:@FIRST`` added to
        its ``_class`` list. Ops already in a colocation group stay in it (the
        groups merge).
    fetches : list of str, optional
        As for :func:`fusion_groups`.
    device_types : sequence of str
        Device types the graph may be placed on.

    Returns
    -------
    list of list of str
        The groups colocated.

    Raises
    ------
    GraphError
        If ``graph_def`` is not a ``GraphDef``.
    """
    tf = _tf()
    if not isinstance(graph_def, tf.compat.v1.GraphDef):
        raise GraphError(f"colocate_fusions needs a GraphDef to modify, got "
                         f"{type(graph_def).__name__}")
    groups = []
    for t in dict.fromkeys(device_types):
        groups += fusion_groups(graph_def, fetches, t)
    nodes = {node.name: node for node in graph_def.node}
    for group in groups:
        first = group[0]
        spec = f"loc:@{first}".encode()
        for name in group[1:]:
            attr = nodes[name].attr["_class"].list.s
            if spec not in attr:
                attr.append(spec)
    return groups


#: Op types TensorFlow's placer does not colocate with their resource inputs
#: (``colocation_graph.cc``): function calls and IdentityN.
RESOURCE_COLOCATION_EXEMPT = frozenset({"PartitionedCall", "StatefulPartitionedCall",
                                        "IdentityN"})


def follow_resources(graph_def, resources):
    """Put every op that reads a pinned resource handle on the handle's device, in place.

    TensorFlow runs an op with a ``resource`` input (``ReadVariableOp``,
    ``AssignVariableOp``, ``ResourceApply*``, ...) on the device of the
    resource, whatever device the op carries, and ops colocated with it by a
    ``_class`` ``loc:@`` attribute go along. A placement that put them
    elsewhere (a strategy's rewrite places a replica's reads on the replica's
    device) would be silently moved; this writes where they will run.

    Parameters
    ----------
    graph_def : tf.compat.v1.GraphDef
        The placed graph, modified in place.
    resources : mapping of str to str
        Name of each node producing a resource handle that cannot move (a
        traced step's captured variables) -> the device the resource lives on
        (the node's own device is set to it too).

    Returns
    -------
    list of (str, str, str)
        ``(node, device it was placed on, device it now carries)`` for each op changed.
    """
    nodes = {node.name: node for node in graph_def.node}
    home = {name: device for name, device in resources.items() if name in nodes}
    changed = []
    for name, device in home.items():
        if not same_device(nodes[name].device or device, device):
            changed.append((name, nodes[name].device, device))
            nodes[name].device = device
    resources = set(home)
    # Follow resource edges and _class links until nothing changes (chains are short).
    while True:
        moved = False
        for node in graph_def.node:
            if node.name in home or node.op in RESOURCE_COLOCATION_EXEMPT:
                continue
            target = None
            for s in node.input:
                if s.startswith("^"):
                    continue
                src = _parse_input(s)[0]
                if src in resources and src in home:
                    target = home[src]
                    break
            if target is None and "_class" in node.attr:
                for spec in node.attr["_class"].list.s:
                    spec = spec.decode()
                    if spec.startswith("loc:@") and spec[5:] in home:
                        target = home[spec[5:]]
                        break
            if target is None:
                continue
            home[node.name] = target
            if not same_device(node.device or target, target):
                changed.append((node.name, node.device, target))
                node.device = target
            moved = True
        if not moved:
            break
    return changed
