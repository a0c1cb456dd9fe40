"""A NodeDef's input and output dtypes from TensorFlow's op registry, without importing it.

:func:`fddps.tf.graphdef.analyse` imports only the nodes a training step runs
when it is told the step's fetches; the nodes outside the step (initializers,
savers, summaries: 40-50% of a TF-Slim training graph) still need their
dtypes, to know which of their edges carry a reference or a resource (the two
ends of such an edge share a device). The registry's ``OpDef`` declares each
argument's type, directly or through an attribute, as the C++ importer reads it.

Example
-------
>>> import tensorflow as tf
>>> node = tf.compat.v1.NodeDef(name="w/Assign", op="Assign")
>>> node.attr["T"].type = tf.float32.as_datatype_enum
>>> node_dtypes(node)
(['float32_ref'], [True, False])
"""

from __future__ import annotations

from .tfimport import _tf

#: ``types_pb2.DT_RESOURCE``.
_DT_RESOURCE = 20


class UnknownOpDef(LookupError):
    """The registry cannot tell a node's dtypes: an unregistered op type (a
    library function, a custom op not loaded) or an attribute the node lacks."""


def _attr(node, name):
    # A missing key must not be read with [] (protobuf maps insert it).
    if name not in node.attr:
        raise UnknownOpDef(f"node {node.name!r} ({node.op}) has no attribute {name!r}")
    return node.attr[name]


def _arg_types(args, node):
    """(dtype enum, is_ref) of every tensor of ``args`` (an OpDef's input or output
    args), expanded by their ``number_attr`` / ``type_list_attr``."""
    out = []
    for arg in args:
        if arg.type_list_attr:
            types = list(_attr(node, arg.type_list_attr).list.type)
        else:
            t = arg.type or _attr(node, arg.type_attr).type
            types = [t] * (_attr(node, arg.number_attr).i if arg.number_attr else 1)
        out.extend((t, arg.is_ref) for t in types)
    return out


def _type_attrs(op_def) -> tuple:
    """The attribute names an OpDef's argument types and counts are read from."""
    names = []
    for arg in (*op_def.input_arg, *op_def.output_arg):
        names.extend(a for a in (arg.type_list_attr, arg.type_attr, arg.number_attr) if a)
    return tuple(dict.fromkeys(names))


#: node_dtypes' answers by (op type, the node's type attributes serialised): a
#: training graph's off-step nodes are thousands of a few kinds (Assign, Const...).
_ANSWERS: dict = {}
#: Registered OpDefs and their type attributes, by op type.
_OP_DEFS: dict = {}


def node_dtypes(node):
    """``(output dtype names, declared-input flags)`` of a NodeDef, from the op registry.

    Output names are ``tf.DType.name`` (``"float32_ref"`` for a reference,
    ``"resource"``); an input's flag is True where the op declares a reference or
    ``resource`` input there, per data input in order.

    Raises
    ------
    UnknownOpDef
        If the op type is not registered or the node lacks an attribute its
        OpDef reads (defaults filled in first, as the importer does).
    """
    from tensorflow.python.framework import op_def_registry

    known = _OP_DEFS.get(node.op)
    if known is None:
        op_def = op_def_registry.get(node.op)
        if op_def is None:
            raise UnknownOpDef(f"op type {node.op!r} of node {node.name!r} is not registered")
        known = _OP_DEFS[node.op] = (op_def, _type_attrs(op_def))
    op_def, type_attrs = known
    attrs = node.attr
    key = (node.op, *(attrs[a].SerializeToString() if a in attrs else None for a in type_attrs))
    answer = _ANSWERS.get(key)
    if answer is None:
        as_dtype = _tf().as_dtype
        names = []
        for t, ref in _arg_types(op_def.output_arg, node):
            dtype = as_dtype(t)
            names.append((dtype._as_ref if ref else dtype).name)
        declared = [ref or t == _DT_RESOURCE for t, ref in _arg_types(op_def.input_arg, node)]
        answer = _ANSWERS[key] = (tuple(names), tuple(declared))
    return list(answer[0]), list(answer[1])
