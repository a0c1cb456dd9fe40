"""What a placed GraphDef's training step runs, recorded in the GraphDef itself.

:func:`fddps.tf.place` predicts the step that runs ``fetches``. A file of the
placed graph alone would be simulated as if every node ran each step
(initializers and savers included), a different prediction for the same
placement. So the placed GraphDef carries the fetches: each fetched node gets
an attribute ``_fddps_fetch`` listing the fetch names that refer to it.
TensorFlow ignores attributes whose name starts with an underscore when it
checks a node against its op (as it does ``_class``), so the graph imports and
runs unchanged; ``fddps simulate``, ``fddps plot`` and :func:`recorded_fetches`
read them back.
"""

from __future__ import annotations

#: Node attribute holding the fetch names that refer to the node.
FETCH_ATTR = "_fddps_fetch"


def _node_name(fetch: str) -> str:
    return fetch.lstrip("^").split(":")[0]


def record_fetches(graph_def, fetches) -> int:
    """Mark the nodes of ``graph_def`` that ``fetches`` name (in place); return how many.

    Parameters
    ----------
    graph_def : GraphDef
    fetches : sequence of str
        Op or tensor names (``"train_op"``, ``"loss:0"``).

    Raises
    ------
    ValueError
        If a fetch names no node of ``graph_def``.
    """
    by_node = {}
    for f in fetches or ():
        by_node.setdefault(_node_name(str(f)), []).append(str(f))
    names = {node.name for node in graph_def.node}
    missing = [n for n in by_node if n not in names]
    if missing:
        raise ValueError(f"fetch {missing[0]!r} names no node of the graph")
    for node in graph_def.node:
        if node.name in by_node:
            attr = node.attr[FETCH_ATTR].list
            del attr.s[:]
            attr.s.extend(f.encode() for f in by_node[node.name])
    return len(by_node)


def recorded_fetches(graph_def) -> list | None:
    """The fetches :func:`record_fetches` marked, in node order; ``None`` if none is.

    Examples
    --------
    >>> from tensorflow.core.framework import graph_pb2
    >>> g = graph_pb2.GraphDef()
    >>> g.node.add(name="loss", op="NoOp") and None
    >>> record_fetches(g, ["loss"]); recorded_fetches(g)
    1
    ['loss']
    """
    out = []
    for node in graph_def.node:
        if FETCH_ATTR in node.attr:
            out.extend(s.decode() for s in node.attr[FETCH_ATTR].list.s)
    return out or None


#: Node attribute holding the device strings of the cluster a graph was placed on.
DEVICES_ATTR = "_fddps_devices"


def record_devices(graph_def, devices) -> None:
    """Record the devices a graph was placed on (all of them, used or not), in place.

    ``fddps simulate`` of the file then rebuilds the same cluster: the same
    hosts and network interfaces, hence the same transfer times, even where the
    placement leaves devices idle. Written on the first node of the graph (a
    GraphDef has no attributes of its own); TensorFlow ignores it.

    Raises
    ------
    ValueError
        If the graph has no node.
    """
    if not len(graph_def.node):
        raise ValueError("the graph has no node to record the devices on")
    attr = graph_def.node[0].attr[DEVICES_ATTR].list
    del attr.s[:]
    attr.s.extend(str(d).encode() for d in devices)


def recorded_devices(graph_def) -> list | None:
    """The devices :func:`record_devices` recorded; ``None`` if none are.

    Examples
    --------
    >>> from tensorflow.core.framework import graph_pb2
    >>> g = graph_pb2.GraphDef()
    >>> g.node.add(name="a", op="NoOp") and None
    >>> record_devices(g, ["/device:GPU:0", "/device:GPU:1"]); recorded_devices(g)
    ['/device:GPU:0', '/device:GPU:1']
    """
    for node in graph_def.node:
        if DEVICES_ATTR in node.attr:
            return [s.decode() for s in node.attr[DEVICES_ATTR].list.s]
    return None
