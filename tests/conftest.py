"""Shared pytest fixtures. TensorFlow ones import it lazily (only tests that use them pay).

TF fixtures (fddps.tf tests):

- ``tf_config(cpus=4, grappler=False)``: a session ``ConfigProto`` with ``cpus``
  CPU devices; by default Grappler and the graph optimizer (constant folding,
  CSE) are off, so every node keeps its GraphDef name in
  ``RunMetadata.partition_graphs`` and fidelity can be checked node by node.
- ``cnn_graph`` / ``while_graph``: small training graphs (session-scoped).
- ``tf_train_step``: run init + one training step, return loss, variables, metadata.

Portability across CPUs: a test marked ``reads_cpu`` (its outcome goes through
this machine's CPU preset, ``costmodel.cpu_preset``) runs three times: on this
machine's CPU and with ``/proc/cpuinfo`` faked (``FDDPS_CPUINFO``) to an
AVX2-only CPU at 2.0 GHz and an AVX-512 CPU at 3.5 GHz, whose presets differ
by 3.5x in peak FLOP/s. A slow test names one of them (``reads_cpu("avx2-2.0GHz")``)
and runs twice; between them the slow ones cover both. Tests that merely need
a cost model pin a named preset instead; tests whose costs come from a profile
(``experiments.costmodel_accuracy``, ``real_cluster``) are not marked. ``FDDPS_CPUINFO=tests/data/cpuinfo/<name> pytest`` runs the whole
suite on a faked CPU.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# A CPU calibration cached by `fddps calibrate` changes every CPU prediction of the
# default cost model: the suite gets an empty cache folder of its own (inherited by
# the processes it starts), so it never reads the user's and runs the same anywhere.
import atexit  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402

os.environ["FDDPS_CACHE_DIR"] = tempfile.mkdtemp(prefix="fddps-test-cache-")
atexit.register(shutil.rmtree, os.environ["FDDPS_CACHE_DIR"], ignore_errors=True)

# OR-Tools before TensorFlow: the other way round CP-SAT crashes in-process, and
# fddps runs it in a child process (tested in test_exact.py); this keeps the
# suite's many small exact solves in-process.
import ortools.sat.python.cp_model  # noqa: E402,F401

# Property tests (hypothesis): the suite that gates a change draws the same
# examples every run, so a red run is the change's fault and reproduces;
# ``HYPOTHESIS_PROFILE=explore pytest`` draws fresh random examples each run,
# to hunt for new counterexamples (run it a few times before landing risky work).
from hypothesis import settings as _hypothesis_settings  # noqa: E402

_hypothesis_settings.register_profile("gate", derandomize=True, print_blob=True)
_hypothesis_settings.register_profile("explore", derandomize=False, print_blob=True)
_hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "gate"))

CPUINFO_DIR = Path(__file__).parent / "data" / "cpuinfo"
#: CPUs the ``reads_cpu`` tests run on: None is this machine's (or the one
#: ``FDDPS_CPUINFO`` already names).
CPUS = {"this-cpu": None, "avx2-2.0GHz": CPUINFO_DIR / "avx2-2.0GHz",
        "avx512-3.5GHz": CPUINFO_DIR / "avx512-3.5GHz"}


def pytest_configure(config):
    # Notebook kernels and workers run from other folders: a faked cpuinfo
    # given relative to where pytest started must still be found there.
    if os.environ.get("FDDPS_CPUINFO"):
        os.environ["FDDPS_CPUINFO"] = os.path.abspath(os.environ["FDDPS_CPUINFO"])
    config.addinivalue_line("markers", "reads_cpu(*fakes): runs on this machine's CPU and on the "
                                       "faked CPUs named (default: all of CPUS), see tests/conftest.py")


def pytest_generate_tests(metafunc):
    marker = metafunc.definition.get_closest_marker("reads_cpu")
    if marker is None:
        return
    fakes = list(marker.args) or [name for name, path in CPUS.items() if path is not None]
    unknown = [f for f in fakes if f not in CPUS]
    if unknown:
        raise ValueError(f"reads_cpu names unknown CPUs {unknown}; known: {list(CPUS)}")
    metafunc.fixturenames.append("cpu_model")
    metafunc.parametrize("cpu_model", ["this-cpu", *fakes], indirect=True)


@pytest.fixture
def cpu_model(request, monkeypatch):
    """The CPU a ``reads_cpu`` test runs on: its name in :data:`CPUS`."""
    path = CPUS[request.param]
    if path is not None:
        monkeypatch.setenv("FDDPS_CPUINFO", str(path))
    return request.param


def _tf():
    return pytest.importorskip("tensorflow")


def _make_config(cpus=4, grappler=False):
    tf = _tf()
    v1 = tf.compat.v1
    config = v1.ConfigProto(device_count={"CPU": cpus}, allow_soft_placement=False)
    if not grappler:
        opts = config.graph_options.optimizer_options
        opts.opt_level = v1.OptimizerOptions.L0
        opts.do_constant_folding = False
        opts.do_common_subexpression_elimination = False
        config.graph_options.rewrite_options.disable_meta_optimizer = True
    return config


@pytest.fixture(scope="session")
def tf_config():
    """Factory of session configs: ``tf_config(cpus=4, grappler=False)``."""
    return _make_config


def _variable_reads(graph_def):
    """Tensor names reading every resource variable (its ``<var>/Read/ReadVariableOp``)."""
    names = {n.name for n in graph_def.node}
    return [f"{n.name}/Read/ReadVariableOp:0" for n in graph_def.node
            if n.op == "VarHandleOp" and f"{n.name}/Read/ReadVariableOp" in names]


def _build_cnn(batch=4, size=8, classes=5, seed=0):
    """Conv-BN-ReLU, max-pool, Conv-BN-ReLU, global mean, dense; momentum SGD.

    Resource variables, fused batch norm in training mode with moving-average
    updates grouped into the train op.
    """
    tf = _tf()
    v1 = tf.compat.v1
    g = tf.Graph()
    with g.as_default():
        v1.set_random_seed(seed)
        x = v1.placeholder(tf.float32, [batch, size, size, 3], name="images")
        y = v1.placeholder(tf.int32, [batch], name="labels")

        def conv_bn(h, cout, name):
            with v1.variable_scope(name):
                w = v1.get_variable("w", [3, 3, h.shape[-1], cout], use_resource=True,
                                    initializer=v1.glorot_uniform_initializer())
                gamma = v1.get_variable("gamma", [cout], use_resource=True,
                                        initializer=v1.ones_initializer())
                beta = v1.get_variable("beta", [cout], use_resource=True,
                                       initializer=v1.zeros_initializer())
                mean_avg = v1.get_variable("moving_mean", [cout], use_resource=True,
                                           trainable=False, initializer=v1.zeros_initializer())
                var_avg = v1.get_variable("moving_var", [cout], use_resource=True,
                                          trainable=False, initializer=v1.ones_initializer())
                h = tf.nn.conv2d(h, w, 1, "SAME")
                h, mean, var = v1.nn.fused_batch_norm(h, gamma, beta, is_training=True)
                for avg, value in ((mean_avg, mean), (var_avg, var)):
                    v1.add_to_collection(v1.GraphKeys.UPDATE_OPS,
                                         v1.assign_sub(avg, 0.1 * (avg - value)))
                return tf.nn.relu(h)

        h = conv_bn(x, 8, "conv1")
        h = tf.nn.max_pool2d(h, 2, 2, "VALID")
        h = conv_bn(h, 16, "conv2")
        h = tf.reduce_mean(h, [1, 2])
        with v1.variable_scope("fc"):
            w = v1.get_variable("w", [16, classes], use_resource=True)
            b = v1.get_variable("b", [classes], use_resource=True,
                                initializer=v1.zeros_initializer())
        logits = tf.matmul(h, w, name="logits") + b
        xent = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)
        loss = tf.reduce_mean(xent, name="loss")
        with tf.control_dependencies(v1.get_collection(v1.GraphKeys.UPDATE_OPS)):
            v1.train.MomentumOptimizer(0.1, 0.9).minimize(loss, name="train")
        v1.global_variables_initializer()
    rng = np.random.RandomState(seed)
    feed = {"images:0": rng.randn(batch, size, size, 3).astype(np.float32),
            "labels:0": rng.randint(0, classes, batch).astype(np.int32)}
    gd = g.as_graph_def()
    return SimpleNamespace(graph=g, graph_def=gd, feed=feed, loss="loss:0", train="train",
                           init="init", reads=_variable_reads(gd))


def _build_while_rnn(batch=4, hidden=8, steps=3, seed=0):
    """A 3-step tanh RNN in a v1 ``tf.while_loop`` (Enter/Merge/NextIteration), momentum SGD."""
    tf = _tf()
    v1 = tf.compat.v1
    from tensorflow.python.ops import control_flow_util

    old = control_flow_util.ENABLE_CONTROL_FLOW_V2
    control_flow_util.ENABLE_CONTROL_FLOW_V2 = False  # v1 loops: NextIteration back edges
    try:
        g = tf.Graph()
        with g.as_default():
            v1.set_random_seed(seed)
            x = v1.placeholder(tf.float32, [batch, hidden], name="x")
            w = v1.get_variable("w", [hidden, hidden], use_resource=True)
            u = v1.get_variable("u", [hidden, 1], use_resource=True)

            def body(i, h):
                return i + 1, tf.tanh(tf.matmul(h, w) + x)

            _, h = v1.while_loop(lambda i, h: i < steps, body, [tf.constant(0), x])
            loss = tf.reduce_mean(tf.square(tf.matmul(h, u) - 1.0), name="loss")
            v1.train.MomentumOptimizer(0.1, 0.9).minimize(loss, name="train")
            v1.global_variables_initializer()
    finally:
        control_flow_util.ENABLE_CONTROL_FLOW_V2 = old
    rng = np.random.RandomState(seed)
    gd = g.as_graph_def()
    return SimpleNamespace(graph=g, graph_def=gd, feed={"x:0": rng.randn(batch, hidden).astype(np.float32)},
                           loss="loss:0", train="train", init="init", reads=_variable_reads(gd))


@pytest.fixture(scope="session")
def cnn_graph():
    """Small CNN with batch norm (see ``_build_cnn``): graph_def, feed, loss, train, init, reads."""
    return _build_cnn()


@pytest.fixture(scope="session")
def while_graph():
    """v1 while-loop RNN training graph (see ``_build_while_rnn``)."""
    return _build_while_rnn()


def _train_step(graph_def, model, config, target=""):
    """Import ``graph_def``, run init and one step, read the variables.

    Returns a namespace: ``initial`` and ``variables`` (values before and after
    the step), ``loss``, ``metadata`` (the step's RunMetadata, with partition
    graphs) and ``all_metadata`` (of the init, step and read runs).
    """
    tf = _tf()
    v1 = tf.compat.v1
    g = tf.Graph()
    with g.as_default():
        v1.import_graph_def(graph_def, name="")
    options = v1.RunOptions(output_partition_graphs=True)
    metas = [v1.RunMetadata() for _ in range(3)]
    with v1.Session(target, graph=g, config=config) as sess:
        sess.run(model.init, options=options, run_metadata=metas[0])
        initial = sess.run(model.reads)
        loss, _ = sess.run([model.loss, model.train], feed_dict=model.feed, options=options,
                           run_metadata=metas[1])
        after = sess.run(model.reads, options=options, run_metadata=metas[2])
    return SimpleNamespace(initial=initial, loss=loss, variables=after, metadata=metas[1],
                           all_metadata=metas)


@pytest.fixture(scope="session")
def tf_train_step():
    """``tf_train_step(graph_def, model, config, target="")``: init, one step, read variables."""
    return _train_step
