"""Tests of the models that do not fit on one device (slim_models.LARGE_MODELS):
Tofu's wide ResNets and RNNs, FlexFlow's RNNLM and NMT.

Parameter counts at the papers' sizes are checked without running anything
(analytic helpers, and forward-only graph builds whose variables are never
initialised); training steps, determinism and placement use small sizes.
"""

import dataclasses

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import costmodel  # noqa: E402
import fddps  # noqa: E402
import slim_models  # noqa: E402
from slim_models import resnet, rnn  # noqa: E402

v1 = tf.compat.v1

GIB = 2 ** 30

# Small instances: a few thousand ops each, a step in well under a second.
SMALL = {
    "wide_resnet": dict(depth=50, width=0.25, image_size=32, num_classes=10),
    "rnn_lm": dict(num_layers=2, hidden_size=32, vocab_size=50, seq_length=6),
    "nmt": dict(num_layers=2, hidden_size=32, vocab_size=50, seq_length=5),
}
# Batch 8: at 32x32 the last block of a ResNet runs at 1x1, and batch norm over
# fewer examples blows up (see slim_models.training).
BATCH = 8
# Learning rates at which a few steps on the fixed batch lower the loss.
LEARNING_RATE = {"wide_resnet": 0.001, "rnn_lm": 0.5, "nmt": 0.5}

# A named preset's numbers, pinned, for CPU devices (the placed graph must run here).
P100_AS_CPU = dataclasses.replace(costmodel.presets["p100"], name="p100-as-cpu",
                                  device_type="CPU")


def _session(graph):
    cfg = v1.ConfigProto(intra_op_parallelism_threads=2, inter_op_parallelism_threads=2)
    return v1.Session(graph=graph, config=cfg)


def _build(name, **extra):
    options = dict(SMALL[name], learning_rate=LEARNING_RATE[name], **extra)
    return slim_models.build_training_graph(name, BATCH, **options)


@pytest.fixture(scope="module")
def built():
    """``built(name)``: the small instance, built once per module (the graph is
    never modified by the tests)."""
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = _build(name)
        return cache[name]
    return get


# -- interface -------------------------------------------------------------------------------
def test_registered_and_bad_input_named():
    assert slim_models.LARGE_MODELS == ("wide_resnet", "rnn_lm", "nmt")
    assert slim_models.ALL_MODELS == slim_models.MODELS + slim_models.LARGE_MODELS
    assert slim_models.resolved_options("wide_resnet") == dict(depth=50, width=4)
    assert slim_models.resolved_options("rnn_lm")["hidden_size"] == 2048
    with pytest.raises(ValueError, match="hidden"):
        slim_models.build_training_graph("wide_resnet", 2, hidden_size=8)
    with pytest.raises(ValueError, match="depth 77"):
        slim_models.build_training_graph("wide_resnet", 2, depth=77)
    with pytest.raises(ValueError, match="image_size"):
        slim_models.build_training_graph("rnn_lm", 2, image_size=32)
    with pytest.raises(ValueError, match="cifar10"):
        slim_models.build_training_graph("nmt", 2, dataset="cifar10")


# -- parameter counts against the papers -------------------------------------------------------
@pytest.mark.parametrize("depth,width", sorted(resnet.TOFU_TABLE2_GIB))
def test_wide_resnet_matches_tofu_table2(depth, width):
    """Tofu's Table 2 "total weight tensor sizes (GB)" are 12 bytes per parameter
    (weight, gradient, optimizer slot) in GiB: within 2.1% for all twelve."""
    gib = resnet.parameter_count(depth, width) * resnet.TOFU_BYTES_PER_PARAMETER / GIB
    assert gib == pytest.approx(resnet.TOFU_TABLE2_GIB[depth, width], rel=0.025)


@pytest.mark.parametrize("depth,width,image_size,classes", [
    (50, 4, None, None),  # WResNet-50-4 at ImageNet size, built (not run)
    pytest.param(101, 0.5, 32, 10, marks=pytest.mark.slow),
    pytest.param(152, 10, None, None, marks=pytest.mark.slow),  # 5.8e9 parameters
])
def test_wide_resnet_graph_has_the_counted_parameters(depth, width, image_size, classes):
    count = slim_models.model_parameter_count("wide_resnet", image_size, classes,
                                              depth=depth, width=width)
    assert count == resnet.parameter_count(depth, width, classes or 1000)


def test_unwidened_count_is_resnet50s():
    # The builder at width 1 is slim's resnet_v1_50 (its count is checked by
    # test_slim_models); the counter agrees with torchvision's figure.
    assert resnet.parameter_count(50, 1) == resnet.REFERENCE_PARAMS["resnet50"]
    assert resnet.layer_widths(152, 0.25)[0] == 16


def test_rnn_lm_and_nmt_graphs_have_the_counted_parameters():
    """At FlexFlow's sizes (2 x 2048 LSTM, 40 steps; 2 + 2 x 1024 with attention)."""
    lm = slim_models.model_parameter_count("rnn_lm")
    assert lm == rnn.rnn_lm_parameter_count(**rnn.FLEXFLOW_RNNLM)["total"] == 108_095_248
    assert lm == slim_models.SPECS["rnn_lm"].reference_params
    nmt = slim_models.model_parameter_count("nmt")
    assert nmt == rnn.nmt_parameter_count(**rnn.FLEXFLOW_NMT)["total"] == 100_701_184
    small = slim_models.model_parameter_count("rnn_lm", **dict(SMALL["rnn_lm"],
                                                               embedding_size=12))
    assert small == rnn.rnn_lm_parameter_count(**SMALL["rnn_lm"], embedding_size=12)["total"]


def test_rnn_lstm_stack_against_tofu_table2():
    """The LSTM stack at 12 bytes per parameter is within 10% of every entry of
    Tofu's Table 2; the entries fit (2L - 1) * 4H^2 parameters (a first layer
    without an H-wide input) within 3%, except RNN-8-6K (off the table's own
    progression: 18.6, 28.5, 32.1)."""
    for (layers, hidden), table in rnn.TOFU_TABLE2_GIB.items():
        lstm = rnn.rnn_lm_parameter_count(**rnn.tofu_rnn_options(layers, hidden))["lstm"]
        assert lstm * 12 / GIB == pytest.approx(table, rel=0.10), (layers, hidden)
        if (layers, hidden) != (8, 6144):
            assert (2 * layers - 1) * 4 * hidden ** 2 * 12 / GIB == pytest.approx(table, rel=0.03)


# -- graphs: plain DAGs, deterministic, train ----------------------------------------------------
@pytest.mark.parametrize("name", ["rnn_lm", "nmt"])
def test_rnn_step_is_a_plain_dag_of_readable_ops(name, built):
    m = built(name)
    ops = {n.op for n in m.graph_def.node}
    assert not ops & {"While", "StatelessWhile", "Enter", "Exit", "NextIteration", "Switch",
                      "Merge", "LoopCond"}
    assert {"MatMul", "Sigmoid", "Tanh", "ConcatV2", "Split"} <= ops
    assert "BlockLSTM" not in ops and "LSTMBlockCell" not in ops
    steps = SMALL[name]["seq_length"]
    assert m.logits.shape.as_list() == [BATCH, steps, 50]
    assert m.labels.shape.as_list() == [BATCH, steps]
    assert m.images is None and m.image_size is None and m.num_classes == 50
    # One cell per layer and step: the first LSTM layer's kernel feeds `steps` MatMuls.
    scope = "rnn_lm/lstm_0" if name == "rnn_lm" else "nmt/encoder/lstm_0"
    matmuls = [n for n in m.graph_def.node if n.op == "MatMul" and n.name.startswith(scope + "/t")
               and "gradients" not in n.name]
    assert len(matmuls) == steps


# The wide ResNet's graph (2.7k step ops) takes a few seconds to build: slow.
BUILT_MODELS = ["rnn_lm", "nmt", pytest.param("wide_resnet", marks=pytest.mark.slow)]


@pytest.mark.parametrize("name", BUILT_MODELS)
def test_same_arguments_same_graph_def(name, built):
    a, b = built(name), _build(name)
    assert (a.graph_def.SerializeToString(deterministic=True)
            == b.graph_def.SerializeToString(deterministic=True))


@pytest.mark.parametrize("name", BUILT_MODELS)
def test_training_steps_lower_the_loss_on_a_fixed_batch(name, built):
    m = built(name)
    inputs = list(m.inputs.values())
    with _session(m.graph) as sess:
        sess.run(m.init_op)
        first = sess.run(inputs)
        losses = [sess.run(m.fetches())[1] for _ in range(4)]
        assert sess.run(m.global_step) == 4
        for a, b in zip(first, sess.run(inputs)):  # the same batch on every step
            np.testing.assert_array_equal(a, b)
    assert np.all(np.isfinite(losses))
    assert losses[-1] < losses[0], losses


# -- placement ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", [
    "rnn_lm",
    pytest.param("nmt", marks=pytest.mark.slow),
    pytest.param("wide_resnet", marks=pytest.mark.slow),
])
def test_place_small_instance_and_run_it(name, built, tf_config, tf_train_step):
    """fddps places the step on two CPU devices (costed as P100s) and the placed
    graph computes what the original computes."""
    m = built(name)
    fetches = [m.train_op.name, m.loss.name]
    cm = costmodel.default_cost_model(cpu=P100_AS_CPU)
    p = fddps.place(m.graph_def, ["/cpu:0", "/cpu:1"], cost_model=cm, fetches=fetches,
                    split=False)
    assert [n.name for n in p.graph_def.node] == [n.name for n in m.graph_def.node]
    assert {n.device for n in p.graph_def.node} <= {"/cpu:0", "/cpu:1", "/device:CPU:0",
                                                     "/device:CPU:1"}
    assert p.makespan > 0
    model = type("M", (), dict(init=m.init_op.name, loss=m.loss.name, train=m.train_op.name,
                               feed={}, reads=[f"{v.op.name}/Read/ReadVariableOp:0"
                                               for v in m.trainable_variables]))
    ref = tf_train_step(m.graph_def, model, tf_config(2))
    got = tf_train_step(p.graph_def, model, tf_config(2))
    assert got.loss == pytest.approx(ref.loss, rel=1e-5)
    for a, b in zip(ref.variables, got.variables):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


# -- command line, experiments -------------------------------------------------------------------
def test_cli_places_a_large_model_with_its_options(tmp_path, capsys):
    from fddps.cli import main

    out = tmp_path / "placed.pb"
    assert main(["place", "--model", "rnn_lm", "--model-option", "num_layers=2",
                 "hidden_size=16", "vocab_size=20", "seq_length=3", "--batch-size", "2",
                 "--cpus", "2", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "rnn_lm training graph" in text and "hidden_size 16" in text
    placed = v1.GraphDef()
    placed.ParseFromString(out.read_bytes())
    assert any("rnn_lm/lstm_1" in n.name for n in placed.node)
    assert main(["place", "--model", "rnn_lm", "--model-option", "depth=50", "--cpus", "2",
                 "--out", str(out)]) == 2
    assert "takes no option 'depth'" in capsys.readouterr().err


def test_model_table_lists_the_large_models(tmp_path, capsys):
    import json

    from experiments import common, model_table

    path = tmp_path / "table.json"
    assert model_table.main(["--models", "rnn_lm", "--model-option", "hidden_size=16",
                             "vocab_size=20", "seq_length=3", "--batch", "2", "--run-large",
                             "--steps", "1", "--no-imagenet-params", "--json", str(path)]) == 0
    text = capsys.readouterr().out
    assert "WResNet-152-10" in text and "RNN-10-8K" in text and "FlexFlow NMT" in text
    data = json.loads(path.read_text())
    (row,) = data["graphs"]
    assert row["options"]["hidden_size"] == 16 and row["step_s"] > 0
    assert row["params"] == rnn.rnn_lm_parameter_count(num_layers=2, hidden_size=16,
                                                       vocab_size=20)["total"]
    papers = {r["model"]: r for r in data["papers"]}
    assert len(papers) == 12 + 9 + 2
    assert abs(papers["WResNet-152-10"]["diff_pct"]) < 1
    with pytest.raises(SystemExit):
        model_table.main(["--models", "rnn_lm", "--model-option", "width=2", "--no-run"])

    mg = common.load_model("nmt", 2, costmodel.default_cost_model(cpu=P100_AS_CPU),
                           devices=["/device:CPU:0"], model_options=SMALL["nmt"])
    assert mg.image_size is None and mg.ops > 500
    assert mg.parameters == rnn.nmt_parameter_count(**SMALL["nmt"])["total"]


@pytest.mark.parametrize("name", ["rnn_lm", "nmt"])
def test_strategy_layer_sizes_the_sparse_embedding_gradient(name, built):
    """The embedding's sparse gradient runs ``Unique``, whose output has no static
    extent: the strategy layer reads it as ``unknown_dim`` (bytes, not NaN), so
    the searches' whole-op graph builds and data parallelism expands and simulates."""
    from fddps.search.space import whole_op_graph
    from fddps.strategy import data_parallel, expand
    from fddps.tf import make_cluster
    from fddps.tf.strategy_graph import step_graph

    m = built(name)
    step = step_graph(m.graph_def, [m.train_op.name, m.loss.op.name])
    assert any(op.op_type == "Unique" for op in step.ops.values())
    cm = costmodel.default_cost_model("p100")
    cluster = make_cluster(["/gpu:0", "/gpu:1"], cm)
    graph = whole_op_graph(step, cluster, cm)  # raised: edge ... carries an invalid byte count nan
    assert np.isfinite(graph.bytes).all()
    timeline = expand(step, data_parallel(step, list(cluster.names)), cluster, cm).simulate(cluster)
    assert np.isfinite(timeline.makespan) and timeline.makespan > 0
