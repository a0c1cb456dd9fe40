"""Read a TensorFlow GraphDef: one row of facts per op (:func:`op_table`).

What is read, and from where:

- **Shapes and dtypes** of every output: the GraphDef is imported into a fresh
  ``tf.Graph``, which runs TensorFlow's own C++ shape functions (a ``tf.Graph``
  passed in is used as is). Shapes that stay unknown: dimensions TensorFlow
  cannot infer statically (a ``None`` batch in a placeholder, ``Reshape`` to a
  computed shape, ``Merge`` inside ``tf.while_loop`` bodies, ``Where``/``Unique``),
  and the size of ``string`` and ``variant`` tensors. Bytes are then estimated:
  an unknown dimension counts as ``unknown_dim`` (default 1), an unknown rank
  as one element, a ``string`` element as 8 bytes, a ``variant`` as 0; the row is
  flagged ``shapes_known=False``. ``resource`` handles count 0 bytes: the
  variable's data stays on its device.
- **FLOPs** as TensorFlow's registered ``"flops"`` statistics count them
  (``RegisterStatistics``: Conv2D and its two backprops, MatMul, BatchMatMul,
  DepthwiseConv2dNative, pooling and pooling grads, BiasAdd(Grad), the binary
  and unary arithmetic ops, Mean/Sum, Softmax, L2Loss, ...), from the shapes
  already inferred (:mod:`fddps.tf.flops`, formula for formula); a statistic
  registered for another op type is called as registered. Every other op
  (FusedBatchNorm* and its grads, Relu/ReluGrad, the ``Apply*`` optimizer
  updates, Tanh, Sigmoid, casts, control flow, ...) and every op whose shapes are
  unknown gets ``flops = 0`` and ``flops_known = False``.
- **Colocation groups**: ops TensorFlow's placer keeps on one device
  (``colocation_graph.cc``): ops sharing a ``_class`` ``loc:@name`` attribute,
  the two ends of every edge whose consumer input is a ``resource`` or reference
  type (the ops reading or updating one variable, reference-variable updates),
  except the few op types TensorFlow exempts (function calls, IdentityN, dataset
  ops). fddps adds one rule: all ops of a ``tf.while_loop`` frame (``Enter`` to
  ``Exit``, nested frames included) form one group, since a loop split across
  devices needs send/recv pairs inside the frame; keeping it whole is the
  simplest placement that is always faithful.
- **Kernels**: per node, the device types with a registered kernel whose type
  constraints the node satisfies (``tensorflow.python.framework.kernels``).
- **Only the step**, when :func:`analyse` is given the step's ``fetches``: the
  nodes the step does not run (40-50% of a TF-Slim training graph:
  initializers, savers) are not imported; their dtypes come from the op
  registry (:mod:`fddps.tf.op_defs`), which is all their colocation groups
  need, and their rows say ``shapes_known=False``. :func:`op_table` reads every node.

Examples
--------
>>> import tensorflow as tf
>>> g = tf.Graph()
>>> with g.as_default():
...     x = tf.compat.v1.placeholder(tf.float32, [8, 16], name="x")
...     y = tf.matmul(x, tf.ones([16, 4]), name="y")
>>> t = op_table(g)
>>> t.set_index("name").loc["y", ["flops", "output_bytes"]].tolist()
[1024.0, 128.0]
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..errors import GraphError
from ..strategy.ops import SHAPE_ONLY_OPS
from .flops import FLOPS_RULES, node_flops
from .lean_import import fill_defaults, import_graph
from .static_values import shape_input_value
from .tfimport import _no_deprecation_warnings, _tf

#: Op types that declare a loop frame boundary or iterate (v1 control flow).
ENTER_OPS = frozenset({"Enter", "RefEnter"})
EXIT_OPS = frozenset({"Exit", "RefExit"})
NEXT_ITERATION_OPS = frozenset({"NextIteration", "RefNextIteration"})
MERGE_OPS = frozenset({"Merge", "RefMerge"})
SWITCH_OPS = frozenset({"Switch", "RefSwitch"})
CONTROL_FLOW_OPS = (ENTER_OPS | EXIT_OPS | NEXT_ITERATION_OPS | MERGE_OPS | SWITCH_OPS
                    | {"LoopCond", "ControlTrigger"})

#: Ops that own a variable's storage: ``param_bytes`` is the variable's size.
VARIABLE_OPS = frozenset({"VarHandleOp", "VariableV2", "Variable", "TemporaryVariable"})

#: Consumers TensorFlow does not colocate with their resource inputs
#: (``REGISTER_INPUT_COLOCATION_EXEMPTION``); ops ending in "Dataset" too.
COLOCATION_EXEMPT_OPS = frozenset({"PartitionedCall", "StatefulPartitionedCall", "IdentityN"})

#: Bytes per element assumed for ``string`` tensors (their size is data-dependent).
STRING_ELEMENT_BYTES = 8


@dataclass
class GraphAnalysis:
    """Everything read from one GraphDef; :func:`op_table`'s table and more.

    Attributes
    ----------
    graph_def : GraphDef
        A copy of the input (never the caller's object).
    graph : tf.Graph
        The graph the shapes were inferred in.
    table : pandas.DataFrame
        :func:`op_table`'s answer.
    output_bytes : list of list of float
        Per node, estimated bytes of each output tensor.
    edges : pandas.DataFrame
        One row per GraphDef input: ``src``, ``dst`` (node positions), ``port``
        (-1 for control), ``bytes``, ``back_edge`` (``NextIteration -> Merge``).
    frames : list of str
        Per node, the outermost ``tf.while_loop`` frame it belongs to ('' outside loops).
    kernel_types : list of frozenset or None
        Per node, device types with a matching kernel; None where the registry
        cannot tell (function calls).
    checked_types : frozenset
        Device types whose kernels this TensorFlow build registers fully.
    notes : dict
        ``unknown_dim``, ``functions`` (library functions), ``analysed`` (count).
    analysed : numpy array of bool
        Per node, whether it was imported and costed (False: outside the step
        ``analyse`` was given; its table row holds only structure and dtypes).
    """

    graph_def: object
    graph: object
    table: pd.DataFrame
    output_bytes: list
    edges: pd.DataFrame
    frames: list
    kernel_types: list
    checked_types: frozenset
    notes: dict = field(default_factory=dict)
    analysed: np.ndarray = None

    def __post_init__(self):
        if self.analysed is None:
            self.analysed = np.ones(len(self.table), dtype=bool)

    def require_analysed(self, mask, what="the step"):
        """Raise :class:`~fddps.errors.FddpsError` unless every node of ``mask`` was analysed
        (an analysis read for one step cannot cost another)."""
        missing = np.flatnonzero(np.asarray(mask, dtype=bool) & ~self.analysed)
        if missing.size:
            from ..errors import FddpsError

            raise FddpsError(f"{what} runs node {self.table['name'].iat[int(missing[0])]!r}, "
                             "which this analysis did not read (it was read for other "
                             "fetches); analyse the graph with these fetches")

    def can_run(self, i: int, device_type: str) -> bool:
        """Whether node ``i`` has a kernel for ``device_type`` (True where unknowable)."""
        kinds = self.kernel_types[i]
        if kinds is None or device_type not in self.checked_types:
            return True
        return device_type in kinds or "DEFAULT" in kinds


# -- loading ------------------------------------------------------------------------
def const_node(name, value, dtype, device):
    """A ``Const`` NodeDef named ``name`` on ``device`` holding ``value`` as ``dtype``
    (a ``tf.DType``); the nodes the rewriters add use it.

    >>> import tensorflow as tf
    >>> const_node("k", [1, 2], tf.int32, "/cpu:0").attr["dtype"].type == tf.int32.as_datatype_enum
    True
    """
    tf = _tf()
    node = tf.compat.v1.NodeDef(name=name, op="Const", device=device)
    node.attr["dtype"].type = dtype.as_datatype_enum
    node.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(np.asarray(value, dtype.as_numpy_dtype),
                                                             dtype=dtype))
    return node


def load_graph(graph_like):
    """A private copy of a GraphDef and the ``tf.Graph`` holding its ops.

    Parameters
    ----------
    graph_like : GraphDef, tf.Graph, bytes, or path
        A ``tf.compat.v1.GraphDef``; a ``tf.Graph`` (its ``as_graph_def()``);
        the bytes of a serialized GraphDef; or the path of a ``.pb`` (binary) or
        ``.pbtxt`` (text) file.

    Returns
    -------
    (GraphDef, tf.Graph)

    Raises
    ------
    GraphError
        If the input is not a GraphDef, the bytes do not parse as one, or
        TensorFlow cannot import it (its message names the node at fault).
    """
    gd, graph = copy_graph_def(graph_like)
    return gd, graph if graph is not None else _import(gd)


def copy_graph_def(graph_like):
    """A private copy of a GraphDef, and the ``tf.Graph`` given (else None); nothing imported.

    Takes what :func:`load_graph` takes and raises what it raises, but for TensorFlow's import.
    """
    tf = _tf()
    from google.protobuf import message, text_format

    if isinstance(graph_like, tf.Graph):
        return graph_like.as_graph_def(), graph_like
    if isinstance(graph_like, (str, os.PathLike)):
        path = os.fspath(graph_like)
        if not os.path.isfile(path):
            raise GraphError(f"graph_def path {path!r} is not a file")
        with open(path, "rb") as f:
            data = f.read()
        if path.endswith((".pbtxt", ".txt")):
            gd = tf.compat.v1.GraphDef()
            try:
                text_format.Parse(data.decode("utf-8"), gd)
            except (text_format.ParseError, UnicodeDecodeError) as e:
                raise GraphError(f"file {path!r} is not a text GraphDef: {e}") from None
            graph_like = gd
        else:
            graph_like = data
    if isinstance(graph_like, (bytes, bytearray, memoryview)):
        data = bytes(graph_like)
        gd = tf.compat.v1.GraphDef()
        try:
            gd.ParseFromString(data)
        except message.DecodeError as e:
            raise GraphError(f"graph_def: the {len(data)} bytes given are not a serialized "
                             f"GraphDef ({e})") from None
        # Protobuf accepts many byte strings as "unknown fields": a real GraphDef
        # has nodes, and every field it parsed is one GraphDef knows.
        if data and not gd.node:
            raise GraphError(f"graph_def: the {len(data)} bytes given are not a serialized "
                             "GraphDef (no nodes parsed)")
        graph_like = gd
    if not (hasattr(graph_like, "node") and hasattr(graph_like, "library")
            and type(graph_like).__name__ == "GraphDef"):
        raise GraphError(f"graph_def must be a GraphDef, a tf.Graph, serialized GraphDef bytes "
                         f"or a .pb/.pbtxt path, got {type(graph_like).__name__}")
    gd = tf.compat.v1.GraphDef()
    gd.CopyFrom(graph_like)
    return gd, None


def _import(gd, defaults_filled=False):
    """``gd`` imported into a fresh ``tf.Graph`` (attribute defaults filled into ``gd``)."""
    tf = _tf()
    try:
        return import_graph(gd, tf.Graph(), defaults_filled)
    except (ValueError, TypeError, KeyError, tf.errors.OpError) as e:
        msg = str(e).strip().splitlines()
        raise GraphError("TensorFlow cannot import the GraphDef: " + " ".join(msg[:3])) from None


# -- per-tensor facts -------------------------------------------------------------------
def _dims(tensor):
    """A tensor's static dims (None for unknown ones), or None for an unknown rank.

    Read straight from the C graph when TensorFlow exposes it (``Tensor._shape``,
    dims with None or -1 for unknown), which skips building a ``TensorShape`` per tensor.
    """
    try:
        dims, unknown_rank = tensor._shape
    except (AttributeError, TypeError, ValueError):  # pragma: no cover - private API moved
        shape = tensor.shape
        return None if shape.rank is None else tuple(shape.as_list())
    return None if unknown_rank else tuple(
        None if d is None or d < 0 else int(d) for d in dims)


def _tensor_bytes(dtype, dims, unknown_dim):
    """(estimated bytes, whether exact) of one tensor of static ``dims`` (see :func:`_dims`)."""
    base = dtype.base_dtype
    if base.name == "resource":
        return 0.0, True
    if base.name == "variant":
        return 0.0, False
    known = True
    if dims is None:
        elements, known = 1.0, False
    else:
        elements = 1.0
        for d in dims:
            if d is None or d < 0:
                known = False
                d = unknown_dim
            elements *= d
    if base.name == "string":
        return elements * STRING_ELEMENT_BYTES, False
    return elements * base.size, known


def _attr_shape_bytes(node_def, unknown_dim):
    """Bytes of the variable a variable op owns, from its ``shape`` and ``dtype`` attrs."""
    tf = _tf()
    attr = node_def.attr
    if "shape" not in attr or "dtype" not in attr:
        return 0.0, False
    shape = tf.TensorShape(attr["shape"].shape)
    dims = None if shape.rank is None else tuple(shape.as_list())
    return _tensor_bytes(tf.as_dtype(attr["dtype"].type), dims, unknown_dim)


# -- kernels ------------------------------------------------------------------------------
class _KernelIndex:
    """Which device types have a kernel for a node, honouring kernel type constraints.

    ``checked_types``: the device types whose kernels this build registers in
    full: CPU, and GPU on a GPU build. A ``tensorflow-cpu`` build registers only
    a few hundred GPU kernels, so its registry cannot tell which ops lack one:
    there, GPU kernels are not checked (every op is assumed to have one).
    """

    def __init__(self):
        tf = _tf()
        from tensorflow.python.framework import kernels

        self._kernels = kernels
        self._by_op = {}
        self._constrained = {}  # op type -> attribute names its kernels constrain
        self._cache = {}        # (op type, those attributes' values) -> device types
        checked = {"CPU"}
        if tf.test.is_built_with_gpu_support():
            checked.add("GPU")
        self.checked_types = frozenset(checked)

    def _for_op(self, op_type):
        if op_type not in self._by_op:
            try:
                found = self._kernels.get_registered_kernels_for_op(op_type).kernel
            except Exception:  # noqa: BLE001 - registry lookup of an odd name
                found = []
            # XLA_*_JIT registrations are compilation kernels, not devices a
            # node can be placed on; they appear once XLA is loaded.
            self._by_op[op_type] = [
                (k.device_type, [(c.name, frozenset(c.allowed_values.list.type))
                                 for c in k.constraint]) for k in found
                if not k.device_type.startswith("XLA_")]
        return self._by_op[op_type]

    def device_types(self, node_def, functions):
        """Device types with a kernel for ``node_def``; None for a function call.

        Cached per op type and the values of the attributes its kernels
        constrain: a training graph has thousands of nodes but few such keys.
        """
        if node_def.op in functions:
            return None
        kernels = self._for_op(node_def.op)
        names = self._constrained.get(node_def.op)
        if names is None:
            names = self._constrained[node_def.op] = sorted(
                {name for _, constraints in kernels for name, _ in constraints})
        values = []
        for name in names:
            a = node_def.attr.get(name)
            values.append(None if a is None else
                          tuple(a.list.type) if a.HasField("list") else a.type)
        key = (node_def.op, tuple(values))
        found = self._cache.get(key)
        if found is None:
            found = self._cache[key] = self._match(node_def, kernels)
        return found

    @staticmethod
    def _match(node_def, kernels):
        out = set()
        for dtype, constraints in kernels:
            if dtype in out:
                continue
            ok = True
            for name, allowed in constraints:
                a = node_def.attr.get(name)
                if a is None:
                    continue
                values = list(a.list.type) if a.HasField("list") else [a.type]
                if any(v not in allowed for v in values):
                    ok = False
                    break
            if ok:
                out.add(dtype)
        return frozenset(out)


_KERNEL_INDEX = None


def _kernel_index() -> _KernelIndex:
    """This process's :class:`_KernelIndex`, made once: the registry answers per op type
    and attribute values do not change between graphs (a 20,000-node graph asks it
    about 50 op types, a few milliseconds each). A kernel library loaded later
    (``tf.load_op_library``) for an op type already asked about is not seen."""
    global _KERNEL_INDEX
    if _KERNEL_INDEX is None:
        _KERNEL_INDEX = _KernelIndex()
    return _KERNEL_INDEX


# -- structure: inputs, frames, colocation ---------------------------------------------
def _parse_input(s):
    """(node name, port) of a GraphDef input string; port -1 for ``^control``."""
    if s.startswith("^"):
        return s[1:], -1
    name, sep, port = s.rpartition(":")
    if sep and port.isdigit():
        return name, int(port)
    return s, 0


class _UnionFind:
    def __init__(self, n):
        self.parent = list(range(n))

    def find(self, i):
        root = i
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[i] != root:
            self.parent[i], i = root, self.parent[i]
        return root

    def union(self, i, j):
        ri, rj = self.find(i), self.find(j)
        if ri != rj:
            # The earlier node becomes the root, so group names are stable.
            if rj < ri:
                ri, rj = rj, ri
            self.parent[rj] = ri


def _loop_frames(nodes, src, dst):
    """Outermost ``tf.while_loop`` frame of every node ('' outside loops).

    Follows TensorFlow's ``BuildControlFlowInfo``: a breadth-first walk from the
    nodes without inputs; an ``Enter``'s consumers are in its ``frame_name``
    frame, an ``Exit``'s consumers in the parent of the Exit's frame. ``Enter``
    nodes are counted in the frame they enter.
    """
    n = len(nodes)
    if not any(node.op in ENTER_OPS for node in nodes):
        return [""] * n  # no loop: every node in the root frame
    succ = [[] for _ in range(n)]
    indeg = [0] * n
    for s, d in zip(src, dst):
        succ[s].append(d)
        indeg[d] += 1
    frame = [None] * n  # full frame path: tuple of frame names, () = root
    queue = [i for i in range(n) if indeg[i] == 0]
    for i in queue:
        frame[i] = ()
    head = 0
    while head < len(queue):
        i = queue[head]
        head += 1
        op = nodes[i].op
        out = frame[i]
        if op in ENTER_OPS:
            out = frame[i] + (nodes[i].attr["frame_name"].s.decode(),)
        elif op in EXIT_OPS:
            out = frame[i][:-1]
        for j in succ[i]:
            if frame[j] is None:
                frame[j] = out
                queue.append(j)
    result = []
    for i, f in enumerate(frame):
        if f is None:  # unreachable from a source: only on a cycle without sources
            f = ()
        if nodes[i].op in ENTER_OPS:
            f = f + (nodes[i].attr["frame_name"].s.decode(),)
        result.append(f[0] if f else "")
    return result


# -- the table -----------------------------------------------------------------------------
def kernel_attrs(node) -> dict:
    """The attributes :func:`costmodel.kernel_model.tf_kernel_shape` reads, of a NodeDef, as
    Python values (strings, bools, lists of ints); those the node does not set are left out."""
    from costmodel.kernel_model import TF_KERNEL_SHAPE_ATTRS

    from .static_values import node_attrs

    out = node_attrs(node, TF_KERNEL_SHAPE_ATTRS)
    for key in TF_KERNEL_SHAPE_ATTRS:  # and the lists of ints (strides, dilations, paddings)
        if key in node.attr and node.attr[key].WhichOneof("value") == "list" \
                and len(node.attr[key].list.i):
            out[key] = [int(v) for v in node.attr[key].list.i]
    return out


def kernel_shape(node, input_shapes, output_shape, output_dtype, attrs=None) -> str | None:
    """The kernel shape string of an FP32 convolution or MatMul (the op table's
    ``kernel_shape``: :func:`costmodel.kernel_model.tf_kernel_shape` of its static input and
    output shapes and attributes), or None for another op, another dtype or an unknown shape.

    ``input_shapes`` / ``output_shape`` may be those of a part of the op (a split's slice);
    ``attrs``, the node's :func:`kernel_attrs` where the caller read them already (the
    parts of one op share them).
    """
    from costmodel.kernel_model import TF_KERNEL_SHAPE_OPS, tf_kernel_shape

    if node.op not in TF_KERNEL_SHAPE_OPS or output_dtype != "float32":
        return None
    return tf_kernel_shape(node.op, input_shapes, output_shape,
                           kernel_attrs(node) if attrs is None else attrs)


def _first_axis_view(op) -> bool:
    from ..strategy.ops import first_axis_view

    shape = op.inputs[0].shape
    if not shape.is_fully_defined():
        return False
    out = op.outputs[0].shape
    if out.is_fully_defined() and out.as_list()[1:] != shape.as_list()[1:]:
        return False  # another axis cut (a valid slice keeps the full extent only at begin 0)
    return first_axis_view(tuple(shape.as_list()), shape_input_value(op, 1),
                           shape_input_value(op, 2), op.inputs[0].dtype.size)


def _ref_or_resource(dtype_name: str) -> bool:
    """Whether a tensor of dtype ``dtype_name`` (``DType.name``) is a reference or a resource."""
    return dtype_name == "resource" or dtype_name.endswith("_ref")


_FLOPS_FUNCTIONS = {}


def flops_function(op_type):
    """TensorFlow's registered ``"flops"`` statistic of ``op_type`` (``f(graph, node_def)
    -> OpStats``, what ``tf_ops.get_stats_for_node_def`` calls), or None where none is
    registered; looked up once per op type (a miss raises inside the registry)."""
    if op_type not in _FLOPS_FUNCTIONS:
        from tensorflow.python.framework import ops as tf_ops

        registry = getattr(tf_ops, "_stats_registry", None)
        if registry is None:  # pragma: no cover - private registry moved: ask per node
            return lambda graph, node: tf_ops.get_stats_for_node_def(graph, node, "flops")
        try:
            _FLOPS_FUNCTIONS[op_type] = registry.lookup(op_type + ",flops")
        except LookupError:
            _FLOPS_FUNCTIONS[op_type] = None
    return _FLOPS_FUNCTIONS[op_type]


def fetch_positions(position, fetches) -> list:
    """Node positions of ``fetches`` (op or tensor names, or objects with a ``name``).

    ``position``: node name -> position. Raises :class:`GraphError` naming a
    fetch that is not a name or names no node.
    """
    if isinstance(fetches, str):
        fetches = [fetches]
    roots = []
    for f in fetches:
        if not isinstance(f, str):
            f = getattr(f, "name", f)
        if not isinstance(f, str):
            raise GraphError(f"fetches must be op or tensor names, got {f!r}")
        name, _ = _parse_input(f)
        if name not in position:
            raise GraphError(f"fetch {f!r} names no node of the graph")
        roots.append(position[name])
    return roots


def ancestors(n, src, dst, roots) -> np.ndarray:
    """Mask of ``roots`` and every node with a path to one over the edges ``src -> dst``."""
    preds = [[] for _ in range(n)]
    for s, d in zip(src, dst):
        preds[d].append(s)
    keep = np.zeros(n, dtype=bool)
    stack = list(roots)
    keep[roots] = True
    while stack:
        for p in preds[stack.pop()]:
            if not keep[p]:
                keep[p] = True
                stack.append(p)
    return keep


def _off_step_dtypes(nodes, idx):
    """Registry dtypes (:func:`fddps.tf.op_defs.node_dtypes`) of the nodes at ``idx``, or
    None where one cannot be told (then the whole graph is imported)."""
    from .op_defs import UnknownOpDef, node_dtypes

    out = {}
    try:
        for i in idx:
            out[i] = node_dtypes(nodes[i])
    except UnknownOpDef:
        return None
    return out


def analyse(graph_like, unknown_dim: int = 1, *, fetches=None) -> GraphAnalysis:
    """Read a graph into a :class:`GraphAnalysis` (what :func:`op_table` and the placer use).

    With ``fetches`` (the op or tensor names one training step runs), only the
    step's nodes (the fetches' ancestors) are imported and costed; the other
    nodes (initializers, savers) get their structure, colocation group, loop
    frame and registry dtypes, and zeros with ``shapes_known`` and
    ``flops_known`` False in the table (``analysed`` says which rows are
    full). Where the registry cannot tell an outside node's dtypes (a function
    library, an unregistered op), the whole graph is read as without fetches.

    Raises
    ------
    GraphError
        See :func:`load_graph`; also if ``unknown_dim`` is not a positive
        integer, an input names no node, or a fetch is unknown.
    """
    if isinstance(graph_like, GraphAnalysis):
        return graph_like
    if not (isinstance(unknown_dim, (int, np.integer)) and unknown_dim >= 1):
        raise GraphError(f"unknown_dim must be a positive integer, got {unknown_dim!r}")
    _tf()  # quietly, before TensorFlow's own modules
    from costmodel.kernel_model import TF_KERNEL_SHAPE_OPS as shaped_ops

    gd, graph = copy_graph_def(graph_like)
    nodes = list(gd.node)
    n = len(nodes)
    # Each NodeDef field read once: a protobuf read builds a new Python object every time.
    names = [node.name for node in nodes]
    op_types = [node.op for node in nodes]
    position = {name: i for i, name in enumerate(names)}
    functions = {f.signature.name for f in gd.library.function}
    kernel_index = _kernel_index()

    # Structure, in GraphDef input order: every input names a node.
    src, dst, port = [], [], []
    for j, node in enumerate(nodes):
        for s in node.input:
            name, p = _parse_input(s)
            i = position.get(name)
            if i is None:
                raise GraphError(f"node {names[j]!r} has input {s!r}, which is not in the graph")
            src.append(i)
            dst.append(j)
            port.append(p)

    analysed = np.ones(n, dtype=bool)
    registry = {}
    if fetches is not None and n:
        step = ancestors(n, src, dst, fetch_positions(position, fetches))
        outside = np.flatnonzero(~step).tolist()
        if outside and (graph is not None or not functions):
            found = _off_step_dtypes(nodes, outside)
            if found is not None:
                analysed, registry = step, found
    if graph is None:
        if analysed.all():
            graph = _import(gd)
        else:
            fill_defaults(gd)  # in every node, as a whole import would (they are written)
            sub = _tf().compat.v1.GraphDef()
            sub.versions.CopyFrom(gd.versions)
            sub.node.extend(nodes[i] for i in np.flatnonzero(analysed).tolist())
            graph = _import(sub, defaults_filled=True)

    out_bytes, out_known, out_dtypes, out_shapes = [], [], [], []
    flops = np.zeros(n)
    flops_known = np.zeros(n, dtype=bool)
    param_bytes = np.zeros(n)
    param_known = np.ones(n, dtype=bool)
    kernel_types = [None] * n
    kernel_shapes = [None] * n
    # One dict of the imported ops (get_operation_by_name locks and checks per call).
    by_name = {op.name: op for op in graph.get_operations()}
    ops = [by_name[node.name] if analysed[i] else None for i, node in enumerate(nodes)]
    with _no_deprecation_warnings():  # once for the loop: a context per node costs more
        for i, (node, op) in enumerate(zip(nodes, ops)):
            op_type = op_types[i]
            if op_type in VARIABLE_OPS:
                param_bytes[i], param_known[i] = _attr_shape_bytes(node, unknown_dim)
            if op is None:  # outside the step: registry dtypes, nothing inferred
                dts = tuple(registry[i][0])
                out_bytes.append([0.0] * len(dts))
                out_known.append([False] * len(dts))
                out_dtypes.append(dts)
                out_shapes.append((None,) * len(dts))
                continue
            sizes, exact, dts, shps = [], [], [], []
            for t in op.outputs:
                dims = _dims(t)
                dtype = t.dtype
                b, k = _tensor_bytes(dtype, dims, unknown_dim)
                sizes.append(b)
                exact.append(k)
                dts.append(dtype.name)
                shps.append(dims)
            out_bytes.append(sizes)
            out_known.append(exact)
            out_dtypes.append(tuple(dts))
            out_shapes.append(tuple(shps))
            if op_type not in FLOPS_RULES:  # a statistic registered outside TensorFlow's own
                counter = flops_function(op_type)
                if counter is not None:
                    try:
                        value = counter(graph, node).value
                    except Exception:  # noqa: BLE001 - TF's stat functions raise on unknown shapes
                        value = None
                    if value is not None:
                        flops[i], flops_known[i] = float(value), True
            kernel_types[i] = kernel_index.device_types(node, functions)
            kernel_shapes[i] = (kernel_shape(node, [_dims(t) for t in op.inputs], shps[0], dts[0])
                                if shps and op_type in shaped_ops else None)

    # FLOPs once every output shape is known (GraphDef order need not be topological).
    def input_dims(s):
        name, p = _parse_input(s)
        dims = out_shapes[position[name]]
        return dims[p] if 0 <= p < len(dims) else None

    for i in np.flatnonzero(analysed).tolist():
        if op_types[i] in FLOPS_RULES:
            shps = out_shapes[i]
            value = node_flops(nodes[i], shps[0] if shps else None, input_dims)
            if value is not None:
                flops[i], flops_known[i] = float(value), True

    # Edge bytes and the colocation of reference and resource edges.
    nbytes, back = [], []
    # (Python lists in the loop, arrays after: a numpy element update costs several list ones)
    in_known = analysed.tolist()
    input_bytes = [0.0] * n
    uf = _UnionFind(n)
    next_iteration = [op_type in NEXT_ITERATION_OPS for op_type in op_types]
    # Edges come grouped by reader (the structure loop's order): ``e`` walks them.
    e, n_edges = 0, len(src)
    while e < n_edges:
        j = dst[e]
        op_type = op_types[j]
        shape_only = op_type in SHAPE_ONLY_OPS
        colocates = op_type not in COLOCATION_EXEMPT_OPS and not op_type.endswith("Dataset")
        merge = op_type in MERGE_OPS
        data_k = 0
        declared = None  # the reader's declared input types, read once when needed
        while e < n_edges and dst[e] == j:
            i, p = src[e], port[e]
            e += 1
            if p < 0:
                nbytes.append(0.0)
            else:
                b = out_bytes[i][p] if p < len(out_bytes[i]) else 0.0
                if shape_only and p < len(out_known[i]) and out_known[i][p]:
                    # Grappler folds a Shape of a static shape to a constant: the
                    # tensor never travels to it (as in the strategy expansion).
                    b = 0.0
                nbytes.append(b)
                input_bytes[j] += b
                if not (p < len(out_known[i]) and out_known[i][p]):
                    in_known[j] = False
                # A declared ref or resource input takes only a ref or resource tensor
                # (import_graph_def checks), so only then read the declared type.
                if colocates and p < len(out_dtypes[i]) and _ref_or_resource(out_dtypes[i][p]):
                    if declared is None:
                        declared = _declared_ref_or_resource(ops[j], registry.get(j))
                    if data_k < len(declared) and declared[data_k]:
                        uf.union(i, j)
                data_k += 1
            back.append(merge and next_iteration[i])
    in_known = np.array(in_known, dtype=bool)
    input_bytes = np.array(input_bytes, dtype=np.float64)
    edges = pd.DataFrame({"src": np.asarray(src, dtype=np.int64),
                          "dst": np.asarray(dst, dtype=np.int64),
                          "port": np.asarray(port, dtype=np.int64),
                          "bytes": np.asarray(nbytes, dtype=np.float64),
                          "back_edge": np.asarray(back, dtype=bool)})

    # Colocation: _class attributes, then loop frames.
    for j, node in enumerate(nodes):
        if "_class" in node.attr:
            for spec in node.attr["_class"].list.s:
                spec = spec.decode()
                if spec.startswith("loc:@") and spec[5:] in position:
                    uf.union(j, position[spec[5:]])
    fwd = ~edges["back_edge"].to_numpy()
    frames = _loop_frames(nodes, edges["src"].to_numpy()[fwd].tolist(),
                          edges["dst"].to_numpy()[fwd].tolist())
    first_in_frame = {}
    for i, f in enumerate(frames):
        if f:
            uf.union(first_in_frame.setdefault(f, i), i)
    roots = [uf.find(i) for i in range(n)]
    size = np.bincount(roots, minlength=n)
    # A group is named after its first variable op (its first node if it has none).
    label = {}
    for i, op_type in enumerate(op_types):
        if op_type in VARIABLE_OPS:
            label.setdefault(roots[i], names[i])
    group = [label.get(r, names[r]) if size[r] > 1 else None for r in roots]

    shapes_known = np.array([all(out_known[i]) for i in range(n)], dtype=bool) & in_known & param_known
    output_bytes = np.array([float(sum(b)) for b in out_bytes], dtype=np.float64)
    for j, op_type in enumerate(op_types):
        if op_type == "Slice" and ops[j] is not None and _first_axis_view(ops[j]):
            input_bytes[j] = output_bytes[j] = 0.0  # a view: copies and allocates nothing
    table = pd.DataFrame({
        "name": names,
        "op_type": op_types,
        "flops": flops,
        "flops_known": flops_known,
        "input_bytes": input_bytes,
        "output_bytes": output_bytes,
        "param_bytes": param_bytes,
        "shapes_known": shapes_known,
        "requested_device": [node.device for node in nodes],
        "colocation_group": pd.Series(group, dtype=object),  # None stays None
        "loop_frame": frames,
        "num_outputs": [len(b) for b in out_bytes],
        "output_dtypes": out_dtypes,
        "output_shapes": out_shapes,
        "kernel_types": [None if k is None else tuple(sorted(k)) for k in kernel_types],
        "kernel_shape": pd.Series(kernel_shapes, dtype=object),
    })
    notes = {"unknown_dim": int(unknown_dim), "functions": len(functions),
             "analysed": int(analysed.sum())}
    return GraphAnalysis(gd, graph, table, out_bytes, edges, frames, kernel_types,
                         kernel_index.checked_types, notes, analysed)


def _declared_ref_or_resource(op, registry_entry) -> list:
    """Per data input, whether it is declared a reference or resource: read from the
    imported ``op``, else from the node's registry entry (:func:`fddps.tf.op_defs.node_dtypes`)."""
    if op is not None:
        return [t._is_ref_dtype or t.name == "resource" for t in op._input_types]
    return list(registry_entry[1])


def op_table(graph_def_or_graph, unknown_dim: int = 1) -> pd.DataFrame:
    """One row per node of a TensorFlow graph, in GraphDef order.

    Parameters
    ----------
    graph_def_or_graph : GraphDef, tf.Graph, bytes, or path
        See :func:`load_graph`. The input is never modified.
    unknown_dim : int
        Size assumed for a dimension TensorFlow cannot infer (default 1).

    Returns
    -------
    pandas.DataFrame
        Columns:

        - ``name``, ``op_type`` (str)
        - ``flops`` (float): TensorFlow's registered statistic's count; 0 where it has
          none (``flops_known`` False, see the module notes for which ops)
        - ``flops_known`` (bool)
        - ``input_bytes``, ``output_bytes`` (float): bytes of the data inputs read
          and outputs written, from inferred shapes (unknown dims -> ``unknown_dim``)
        - ``param_bytes`` (float): bytes of the variable a ``VarHandleOp`` /
          ``VariableV2`` / ``Variable`` owns, else 0
        - ``shapes_known`` (bool): every input, output and variable shape fully
          known with a fixed-size dtype
        - ``requested_device`` (str, '' if none)
        - ``colocation_group`` (str or None): the group's first variable op, or
          its first node in GraphDef order if it has no variable; None for an op
          TensorFlow may place alone
        - ``loop_frame`` (str): outermost ``tf.while_loop`` frame, '' outside loops
        - ``num_outputs`` (int), ``output_dtypes`` (tuple of str),
          ``output_shapes`` (tuple of tuples, None for unknown rank, None dims unknown)
        - ``kernel_types`` (tuple of str or None): device types with a kernel
          matching the node's type attributes (``"DEFAULT"`` runs anywhere); None
          for calls of library functions
        - ``kernel_shape`` (str or None): an FP32 convolution's or MatMul's shape as
          the GPU presets' kernel model reads it (:func:`kernel_shape`:
          ``"N=64 C=3 H=32 W=32 K=64 R=3 S=3 stride_h=1 ..."``, ``"M=10 N=64 K=512
          transpose=NN"``); None for other ops and where a dimension is unknown

    Raises
    ------
    GraphError
        If the input is not a GraphDef TensorFlow can import (see :func:`load_graph`).
    """
    return analyse(graph_def_or_graph, unknown_dim).table
