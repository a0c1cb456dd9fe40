"""One straight path through fddps.tf.place: the graph is read once per call, and
the adapter's modules import one another without a circle."""

import ast
import pathlib

import networkx as nx
import pytest

tf = pytest.importorskip("tensorflow")

import fddps  # noqa: E402
from fddps.tf import graphdef  # noqa: E402

DEVICES = ["/device:CPU:0", "/device:CPU:1"]


def _graph():
    g = tf.Graph()
    with g.as_default():
        x = tf.random.normal([16, 8, 8, 4], seed=1, name="x")
        w = tf.compat.v1.get_variable("w", [3, 3, 4, 8])
        y = tf.nn.conv2d(x, w, 1, "SAME", name="conv")
        loss = tf.reduce_mean(tf.square(y), name="loss")
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, name="train")
    return g.as_graph_def(), [train.name, loss.name]


@pytest.mark.parametrize("how", [dict(), dict(algorithm="heft"), dict(algorithm="pase"),
                                 dict(algorithm="tofu"), "data_parallel",
                                 # Verifying writes and runs the finalists from what was
                                 # decided: still one analysis.
                                 dict(verify=True), dict(algorithm="pase", verify=True),
                                 dict(algorithm="tofu", verify=True)])
def test_the_input_graph_is_analysed_once_per_place_call(monkeypatch, how):
    graph_def, fetches = _graph()
    names = [n.name for n in graph_def.node]
    loads = []
    real = graphdef.copy_graph_def  # every read of a graph starts here

    def counting(graph_like):
        gd, g = real(graph_like)
        loads.append([n.name for n in gd.node] == names)
        return gd, g

    monkeypatch.setattr(graphdef, "copy_graph_def", counting)
    if how == "data_parallel":
        how = dict(strategy=fddps.data_parallel(graph_def, DEVICES, fetches))
        loads.clear()  # building the strategy reads the graph too: place() alone counts
    p = fddps.place(graph_def, DEVICES, fetches=fetches, **how)
    assert loads.count(True) == 1, loads
    # The read, decide, write (and verify) stages are timed, and add up to the call.
    info = p.info
    stages = (info["read_seconds"] + info["decide_seconds"] + info["write_seconds"]
              + info.get("verify_seconds", 0.0))
    assert stages == pytest.approx(info["place_seconds"], rel=1e-6)
    if how.get("verify"):
        record = info["verified"]
        assert record["reason"] in ("", "one distinct finalist: nothing to choose between")
        assert all(r["error"] == "" for r in record["finalists"])


def _imports(package_dir: pathlib.Path, package: str) -> nx.DiGraph:
    """Module -> module imports inside ``package`` (lazy imports in functions too)."""
    g = nx.DiGraph()
    for path in package_dir.glob("*.py"):
        mod = f"{package}.{path.stem}"
        g.add_node(mod)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                targets = ([f"{package}.{node.module}"] if node.module else
                           [f"{package}.{a.name}" for a in node.names])
                g.add_edges_from((mod, t) for t in targets)
    return g


def test_no_import_circle_in_the_tensorflow_adapter():
    root = pathlib.Path(fddps.__file__).parent
    cycles = list(nx.simple_cycles(_imports(root / "tf", "fddps.tf")))
    assert cycles == []


def test_the_model_layer_does_not_import_the_schedulers():
    root = pathlib.Path(fddps.__file__).parent
    for name in ("bounds", "graph", "cluster", "cluster_presets", "paths", "schedule",
                 "simulate", "topology", "errors", "generators", "stg", "trace"):
        tree = ast.parse((root / f"{name}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                assert not (node.module or "").startswith("algorithms"), (name, node.module)


@pytest.mark.parametrize("enabled", [True, False])
def test_place_holds_the_cyclic_collector_off_and_restores_it(monkeypatch, enabled):
    import gc

    graph_def, fetches = _graph()
    during = []
    real = graphdef.analyse

    def recording(*args, **kwargs):
        during.append(gc.isenabled())
        return real(*args, **kwargs)

    monkeypatch.setattr("fddps.tf.place_graph.analyse", recording)
    was = gc.isenabled()
    try:
        gc.enable() if enabled else gc.disable()
        fddps.place(graph_def, DEVICES, fetches=fetches)
        assert gc.isenabled() is enabled
        with pytest.raises(fddps.FddpsError):
            fddps.place(graph_def, DEVICES, enforce_order="sometimes")
        assert gc.isenabled() is enabled
    finally:
        gc.enable() if was else gc.disable()
    assert during == [False]
