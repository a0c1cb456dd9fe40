"""fddps.tf.lean_import: the analysis's import gives what tf.import_graph_def gives."""

import pytest

tf = pytest.importorskip("tensorflow")

from fddps.tf.graphdef import analyse  # noqa: E402
from fddps.tf.lean_import import fill_defaults, import_graph  # noqa: E402


def _training_graph():
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [8, 6, 6, 3], name="x")
        w = tf.compat.v1.get_variable("w", [3, 3, 3, 4])
        y = tf.nn.relu(tf.nn.conv2d(x, w, 1, "SAME"), name="y")
        loss = tf.reduce_mean(tf.square(y), name="loss")
        with tf.compat.v1.colocate_with(w):
            tf.identity(w, name="w_copy")
        tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, name="train")
    return g.as_graph_def()


def _outputs(graph):
    return {op.name: [(t.dtype.name, t.shape.as_list() if t.shape.rank is not None else None)
                      for t in op.outputs] for op in graph.get_operations()}


def test_lean_import_matches_tensorflows_import():
    import fddps.tf.lean_import as lean_import

    assert lean_import._private_importer() is not None  # this TensorFlow takes the lean path
    reference, lean = _training_graph(), _training_graph()
    g = tf.Graph()
    with g.as_default():
        tf.compat.v1.import_graph_def(reference, name="")
    h = import_graph(lean, tf.Graph())
    assert _outputs(h) == _outputs(g)
    assert [op.type for op in h.get_operations()] == [op.type for op in g.get_operations()]
    # Both fill in the GraphDef's attribute defaults in place, identically.
    assert lean.SerializeToString(deterministic=True) == \
        reference.SerializeToString(deterministic=True)
    assert h.get_tensor_by_name("y:0").shape.as_list() == [8, 6, 6, 4]


def test_analysis_of_the_lean_import_equals_the_public_imports(monkeypatch):
    lean = analyse(_training_graph())
    import fddps.tf.lean_import as lean_import

    monkeypatch.setattr(lean_import, "_private_importer", lambda: None)  # tf.import_graph_def
    public = analyse(_training_graph())
    assert lean.table.equals(public.table)
    assert lean.edges.equals(public.edges)
    assert lean.graph_def.SerializeToString(deterministic=True) == \
        public.graph_def.SerializeToString(deterministic=True)


def test_a_graph_with_functions_and_a_bad_graph_import_as_tensorflow_does():
    @tf.function
    def double(v):
        return 2.0 * v

    g = tf.Graph()
    with g.as_default():
        double(tf.constant(1.0, name="c"))
    gd = g.as_graph_def()
    assert gd.library.function  # the public import path: it registers the functions
    h = import_graph(gd, tf.Graph())
    names = {f.signature.name for f in gd.library.function}
    assert names <= {f.signature.name for f in h.as_graph_def().library.function}
    assert _outputs(h) == _outputs(g)

    bad = tf.compat.v1.GraphDef()
    bad.node.add(name="a", op="Identity", input=["missing"])
    bad.node[0].attr["T"].type = tf.float32.as_datatype_enum
    with pytest.raises(ValueError) as lean_error:
        import_graph(bad, tf.Graph())
    with pytest.raises(ValueError) as public_error:
        with tf.Graph().as_default():
            tf.compat.v1.import_graph_def(bad, name="")
    assert str(lean_error.value) == str(public_error.value)


def test_fill_defaults_fills_what_tensorflows_import_fills():
    """A GraphDef with every default-valued attribute stripped (as a saved graph may
    have them): filled in place exactly as TensorFlow's import canonicalises it."""
    from tensorflow.python.framework import importer, op_def_registry

    gd = _training_graph()
    stripped = 0
    for node in gd.node:
        for attr in op_def_registry.get(node.op).attr:
            if (attr.HasField("default_value") and attr.name in node.attr
                    and node.attr[attr.name] == attr.default_value):
                del node.attr[attr.name]
                stripped += 1
    assert stripped > 10
    want, got = tf.compat.v1.GraphDef(), tf.compat.v1.GraphDef()
    want.CopyFrom(gd)
    got.CopyFrom(gd)
    importer._ProcessGraphDefParam(want)
    fill_defaults(got)
    assert got == want and got != gd
