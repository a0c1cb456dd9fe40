"""Reading only the step: ``analyse(graph, fetches=...)`` imports and costs the fetches'
ancestors, and reads the other nodes (initializers, savers) from the op registry.

What must not change: every step row of the op table, every edge, and every node's
colocation group and loop frame are those of the whole-graph reading, so a placement
is the same either way (experiments.place_hashes checks the six networks)."""

import pandas as pd
import pytest

tf = pytest.importorskip("tensorflow")

import fddps  # noqa: E402
from fddps.errors import FddpsError, GraphError  # noqa: E402
from fddps.tf.graphdef import analyse  # noqa: E402
from fddps.tf.op_defs import UnknownOpDef, node_dtypes  # noqa: E402
from fddps.tf.structure import analysed_step  # noqa: E402


def _graph(resource):
    """A training step on a reference or resource variable, with what a TF1 training
    graph carries besides: initializers, a saver and an unused global step."""
    g = tf.Graph()
    with g.as_default():
        x = tf.random.normal([8, 6], seed=1, name="x")
        w = tf.compat.v1.get_variable("w", [6, 3], use_resource=resource)
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w)), name="loss")
        train = tf.compat.v1.train.MomentumOptimizer(0.1, 0.9).minimize(loss, name="train")
        tf.compat.v1.train.get_or_create_global_step()
        tf.compat.v1.global_variables_initializer()
        tf.compat.v1.train.Saver()
    return g.as_graph_def(), [train.name, loss.name]


@pytest.mark.parametrize("resource", [False, True])
def test_the_step_reading_equals_the_whole_reading_where_it_reads(resource):
    gd, fetches = _graph(resource)
    whole = analyse(gd)
    step = analyse(gd, fetches=fetches)
    keep = analysed_step(step, fetches)
    assert step.analysed.tolist() == keep.tolist() and 0 < keep.sum() < len(keep)
    assert whole.analysed.all()
    # Every step row as the whole reading has it; imported: only the step's ops.
    pd.testing.assert_frame_equal(step.table[keep].reset_index(drop=True),
                                  whole.table[keep].reset_index(drop=True))
    assert len(step.graph.get_operations()) == keep.sum()
    # Structure of every node: edges, groups, frames, dtypes, and the GraphDef written from.
    for col in ("name", "op_type", "colocation_group", "loop_frame", "requested_device",
                "num_outputs", "output_dtypes", "param_bytes"):
        assert step.table[col].tolist() == whole.table[col].tolist(), col
    e_step, e_whole = step.edges, whole.edges
    for col in ("src", "dst", "port", "back_edge"):
        assert e_step[col].tolist() == e_whole[col].tolist()
    inside = keep[e_step["dst"].to_numpy()]
    assert e_step["bytes"][inside].tolist() == e_whole["bytes"][inside].tolist()
    assert step.graph_def.SerializeToString(deterministic=True) == \
        whole.graph_def.SerializeToString(deterministic=True)
    # Outside the step: nothing inferred, and said so.
    out = step.table[~keep]
    assert not out["shapes_known"].any() and not out["flops_known"].any()
    assert (out["flops"] == 0).all() and out["kernel_types"].isna().all()
    # Initializers share their variable's group (a reference or resource edge), read
    # from the registry: the variable is in the step, its initializer is not.
    table = step.table.set_index("name")
    for var in ("w", "global_step"):
        assert not table.loc[var + "/Assign", "shapes_known"]
        assert table.loc[var + "/Assign", "colocation_group"] == var


def test_a_placement_is_the_same_read_either_way(monkeypatch):
    gd, fetches = _graph(False)
    devices = ["/device:CPU:0", "/device:CPU:1"]
    p = fddps.place(gd, devices, fetches=fetches)
    assert p.info["analysis"].analysed.sum() < len(gd.node)

    real = analyse

    def whole(graph_like, unknown_dim=1, *, fetches=None):  # the reading without fetches
        return real(graph_like, unknown_dim)

    monkeypatch.setattr(fddps.tf.place_graph, "analyse", whole)
    q = fddps.place(gd, devices, fetches=fetches)
    assert q.info["analysis"].analysed.all()
    assert p.graph_def.SerializeToString(deterministic=True) == \
        q.graph_def.SerializeToString(deterministic=True)


def test_an_analysis_read_for_one_step_refuses_another():
    gd, fetches = _graph(False)
    step = analyse(gd, fetches=fetches)
    analysed_step(step, fetches)
    analysed_step(step, ["loss"])  # a part of the step was read
    with pytest.raises(FddpsError, match="did not read"):
        analysed_step(step, None)  # every node: the saver's were not read
    with pytest.raises(GraphError, match="names no node"):
        analyse(gd, fetches=["nope"])


def test_a_graph_with_a_function_library_is_read_whole():
    @tf.function
    def square(v):
        return v * v

    g = tf.Graph()
    with g.as_default():
        x = tf.constant([1.0, 2.0], name="x")
        y = tf.identity(square(x), name="y")
        tf.identity(x, name="unused")
    a = analyse(g.as_graph_def(), fetches=[y.name])
    assert a.analysed.all() and a.table.set_index("name").loc["unused", "shapes_known"]


def test_registry_dtypes_of_a_node():
    g = tf.Graph()
    with g.as_default():
        v = tf.compat.v1.get_variable("v", [2], use_resource=False)
        tf.concat([v, v, v], 0, name="cat")
    gd = g.as_graph_def()
    node = {n.name: n for n in gd.node}
    assert node_dtypes(node["v"]) == (["float32_ref"], [])
    assert node_dtypes(node["v/Assign"]) == (["float32_ref"], [True, False])
    assert node_dtypes(node["cat"]) == (["float32"], [False] * 4)
    odd = tf.compat.v1.NodeDef(name="f", op="NoSuchOp")
    with pytest.raises(UnknownOpDef, match="NoSuchOp"):
        node_dtypes(odd)
    missing = tf.compat.v1.NodeDef(name="c", op="ConcatV2")
    with pytest.raises(UnknownOpDef, match="no attribute"):
        node_dtypes(missing)
    assert "N" not in missing.attr  # a missing attribute is not inserted
    # Answers are kept by op type and type attributes: another dtype or count is another answer.
    with g.as_default():
        tf.concat([tf.cast(v, tf.int32)] * 2, 0, name="icat")
    icat = [n for n in g.as_graph_def().node if n.name == "icat"][0]
    assert node_dtypes(icat) == (["int32"], [False] * 3)
    assert node_dtypes(node["cat"]) == (["float32"], [False] * 4)


def test_a_first_axis_slice_is_a_view_and_other_slices_copy():
    """``analyse`` zeroes the bytes of a ``Slice`` TensorFlow makes a view of its input
    (a cut of the first axis, rows aligned), and only of that one; a cut of another
    axis is a copy whether or not its begin and size are static."""
    g = tf.Graph()
    with g.as_default():
        x = tf.random.normal([8, 4, 16], seed=1, name="x")
        tf.slice(x, [2, 0, 0], [4, -1, 16], name="rows")        # a view
        tf.slice(x, [0, 0, 8], [8, 4, 8], name="channels")      # a copy
        tf.slice(x, [0, 1, 0], [8, 3, -1], name="middle")       # a copy
        size = tf.shape(x, name="size") - tf.constant([0, 0, 8])
        tf.slice(x, [0, 0, 0], size, name="dynamic")            # a copy, size not folded
    table = analyse(g.as_graph_def()).table.set_index("name")
    assert table.loc["rows", ["input_bytes", "output_bytes"]].tolist() == [0.0, 0.0]
    for name in ("channels", "middle", "dynamic"):
        assert table.loc[name, "input_bytes"] > 0 and table.loc[name, "output_bytes"] > 0
