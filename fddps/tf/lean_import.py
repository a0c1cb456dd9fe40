"""Import a GraphDef into a fresh ``tf.Graph`` doing only what fddps reads back.

:func:`fddps.tf.graphdef.analyse` imports the graph to let TensorFlow's C++
shape functions infer every tensor's shape and dtype. ``tf.import_graph_def``
does that in C (``TF_GraphImportGraphDefWithResults``), then spends most of
its time in Python on bookkeeping fddps never reads from the imported graph:
it clears and re-applies every op's device (``_set_device``, device
functions), reads every op's ``_class`` attribute to copy devices within
colocation groups (fddps reads ``_class`` from the NodeDefs itself), and
re-checks every input's control-flow context (the C import has validated the
graph; a fresh graph has no Python control-flow contexts). Without that part,
importing ResNet-50 (5,182 nodes) and NASNet-A Large (39,716) took 0.30-0.59 of
``tf.import_graph_def``'s time (two rounds each, loaded 2-core machine).

:func:`import_graph` runs the same C import with the same options, after the
same canonicalisation of the GraphDef (attribute defaults filled in, in
place), and wraps each imported op in its ``tf.Operation`` without the rest.
Shapes, dtypes, attributes, inputs and names are the C graph's, so what
``analyse`` reads is what ``tf.import_graph_def`` would give; only the Python
ops' ``device`` differs for colocated ops (fddps reads devices from the
GraphDef). It uses TensorFlow's private importer helpers: where they are
missing (another TensorFlow version), where the graph already has ops, or
where the GraphDef has a function library (whose Python-side definitions
``tf.import_graph_def`` also registers), it calls ``tf.import_graph_def`` itself.

Example
-------
>>> import tensorflow as tf
>>> g = tf.Graph()
>>> with g.as_default():
...     x = tf.compat.v1.placeholder(tf.float32, [8, 16], name="x")
...     y = tf.matmul(x, tf.ones([16, 4]), name="y")
>>> h = import_graph(g.as_graph_def(), tf.Graph())
>>> h.get_tensor_by_name("y:0").shape.as_list()
[8, 4]
"""

from __future__ import annotations

from .tfimport import _tf


def _private_importer():
    """TensorFlow's private import helpers, or None where this version lacks them."""
    try:
        from tensorflow.python.client import pywrap_tf_session as c_api
        from tensorflow.python.framework import c_api_util, importer
        from tensorflow.python.util import compat
    except ImportError:  # pragma: no cover - private modules moved
        return None
    needed = (getattr(importer, "_ProcessGraphDefParam", None),
              getattr(importer, "_PopulateTFImportGraphDefOptions", None),
              getattr(c_api, "TF_GraphImportGraphDefWithResults", None),
              getattr(c_api_util, "ScopedTFImportGraphDefOptions", None),
              getattr(c_api_util, "ScopedTFImportGraphDefResults", None))
    if not all(needed) or not getattr(importer, "is_oss", False):
        return None  # pragma: no cover - another TensorFlow build
    return c_api, c_api_util, importer, compat


def import_graph(graph_def, graph, defaults_filled=False):
    """Import ``graph_def`` (nodes unprefixed) into ``graph`` and return ``graph``.

    Like ``tf.graph_util.import_graph_def(graph_def, name="")`` inside
    ``graph.as_default()``, including filling in ``graph_def``'s attribute
    defaults in place (``defaults_filled``: the caller has, with
    :func:`fill_defaults`); see the module notes for what it leaves out.

    Raises
    ------
    ValueError
        Where TensorFlow cannot import the GraphDef (its message, as
        ``tf.import_graph_def`` raises it).
    """
    tf = _tf()
    private = _private_importer()
    lean = (private is not None and not graph_def.library.function
            and not graph.get_operations() and hasattr(graph, "_create_op_from_tf_operation")
            and hasattr(graph, "new_operations"))
    if not lean:
        with graph.as_default():
            tf.graph_util.import_graph_def(graph_def, name="")
        return graph
    c_api, c_api_util, importer, compat = private
    if not defaults_filled:
        fill_defaults(graph_def)  # as TF's import does, in place
    scoped = c_api_util.ScopedTFImportGraphDefOptions()
    importer._PopulateTFImportGraphDefOptions(scoped.options, "", {}, None, True)
    with graph._mutation_lock():
        buffer = c_api.TF_NewBufferFromString(compat.as_bytes(graph_def.SerializeToString()))
        try:
            with graph._c_graph.get() as c_graph:
                results = c_api.TF_GraphImportGraphDefWithResults(c_graph, buffer,
                                                                   scoped.options)
            c_api_util.ScopedTFImportGraphDefResults(results)  # frees them when collected
        except tf.errors.InvalidArgumentError as e:
            raise ValueError(str(e)) from None  # what tf.import_graph_def raises
        finally:
            c_api.TF_DeleteBuffer(buffer)
        for c_op in graph.new_operations():
            graph._create_op_from_tf_operation(c_op, compute_device=False)
    return graph


def fill_defaults(graph_def):
    """Fill in the attribute defaults of ``graph_def``'s nodes in place, as TensorFlow's
    import does (``importer._ProcessGraphDefParam``): every attribute the op registry
    gives a default that the node leaves unset. Nodes of unregistered op types
    (library functions) are left as they are; the import checks them."""
    for node in graph_def.node:
        defaults = _attr_defaults(node.op)
        if defaults:
            attr = node.attr
            for name, value in defaults:
                # Indexing a missing key inserts an empty value, which the copy then fills.
                if attr[name].WhichOneof("value") is None:
                    attr[name].CopyFrom(value)


_ATTR_DEFAULTS = {}


def _attr_defaults(op_type):
    """``[(attribute name, default AttrValue)]`` of ``op_type``'s registered OpDef, or None
    for an op type not registered (yet: a miss is asked again). Kept per op type: reading
    them from the OpDef per node was half of :func:`fill_defaults`' time."""
    got = _ATTR_DEFAULTS.get(op_type)
    if got is None:
        from tensorflow.python.framework import op_def_registry

        op_def = op_def_registry.get(op_type)
        if op_def is None:
            return None
        got = _ATTR_DEFAULTS[op_type] = [(a.name, a.default_value) for a in op_def.attr
                                         if a.HasField("default_value")]
    return got
