"""Time single TensorFlow ops of given shapes on this machine's CPU, as a step runs them.

:func:`time_ops` is what ``costmodel.calibrate_cpu`` (``fddps calibrate``)
measures: for each op spec (an op type and its shapes, see
``costmodel.calibrate.CPU_CALIBRATION_OPS``) it builds, in a graph of its own,
a chain of ``K`` copies of the op, each reading the same inputs (variables read
once) and each ordered after the previous one by a control edge, so that the
copies run one after the other, each alone on the device with every intra-op
thread, as the scheduler's device model runs a step's ops. Two times per op:

- **warm**: running the chain's first ``K`` copies and its first copy alone
  (prefixes of one chain: ``Session.run`` runs only the targets' ancestors),
  the difference over ``K - 1``: one op whose inputs the copy before it has
  just read, the executor's dispatch included;
- **cold**: the first copy alone minus an empty run of the same session: one op
  whose inputs were last touched a round earlier, all the other specs' data
  streamed through the caches since.

A training step's ops read some inputs just written (warm) and some written
long before (a backward op reads the forward pass's activations): timed in
turns with the README quick start's CNN step (a v1 session, 15 traced steps,
machine load ~2.5), its 4 MB element-wise ops (MaxPool, MaxPoolGrad, ReluGrad)
took 2-5x their warm time and about half their cold time in the step, and its
convolutions about their warm time (1.0-1.3x). Each op's time (``seconds``)
is the geometric mean of the two (the cold time floored at the warm one).

Grappler is off in the timing sessions (it would merge the identical copies);
TensorFlow's oneDNN kernels are picked by its graph rewrite passes as in a
step. The specs are timed in rounds, one of each per round in a rotating
order, until the time budget is spent (at least ``min_rounds``), so that a burst
of load on a shared machine hits every spec alike; each time is the median
over rounds.

FLOPs and bytes come from :func:`fddps.tf.op_table` on the same graph, as
``place()`` counts them, so an efficiency fitted from them predicts the ops of
a placed graph consistently.
"""

from __future__ import annotations

import time

import numpy as np
import pandas as pd

from ..errors import FddpsError
from .tfimport import _tf


def _shapes(op_type: str, p: dict) -> tuple[list, dict]:
    """``(input_specs, consts)`` of one op spec: input specs are ``(name, shape, dtype)``."""
    f32 = "float32"
    if op_type == "MatMul":
        return [("a", [p["m"], p["k"]], f32), ("b", [p["k"], p["n"]], f32)], {}
    if op_type in ("Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter"):
        n, h, w, ci, co, k = p["n"], p["h"], p["w"], p["cin"], p["cout"], p.get("k", 3)
        x, f, dy = ("x", [n, h, w, ci], f32), ("f", [k, k, ci, co], f32), ("dy", [n, h, w, co], f32)
        if op_type == "Conv2D":
            return [x, f], {}
        if op_type == "Conv2DBackpropInput":
            return [f, dy], {"sizes": [n, h, w, ci]}
        return [x, dy], {"sizes": [k, k, ci, co]}
    shape = list(p["shape"])
    if op_type in ("Relu", "Tanh", "Sigmoid", "Sqrt", "Square", "Exp", "Neg", "Identity",
                   "Softmax", "LogSoftmax"):
        return [("x", shape, f32)], {}
    if op_type in ("AddV2", "Mul", "Sub", "RealDiv", "Maximum", "ReluGrad"):
        return [("x", shape, f32), ("y", shape, f32)], {}
    if op_type == "BiasAdd":
        return [("x", shape, f32), ("b", [shape[-1]], f32)], {}
    if op_type == "BiasAddGrad":
        return [("x", shape, f32)], {}
    if op_type in ("Sum", "Mean", "Max"):
        return [("x", shape, f32)], {"axes": list(p["axes"])}
    if op_type in ("MaxPool", "AvgPool"):
        return [("x", shape, f32)], {}
    if op_type == "MaxPoolGrad":  # its forward output is computed once (_derived)
        n, h, w, c = shape
        return [("x", shape, f32), ("dy", [n, h // 2, w // 2, c], f32)], {}
    if op_type == "SparseSoftmaxCrossEntropyWithLogits":
        return [("logits", shape, f32), ("labels", [shape[0]], "int32")], {"classes": shape[1]}
    if op_type == "AddN":
        return [("x", shape, f32), ("y", shape, f32)], {}
    if op_type in ("FusedBatchNormV3", "FusedBatchNormGradV3"):
        c = [shape[-1]]
        ins = [("x", shape, f32), ("scale", c, f32), ("offset", c, f32)]
        return ins + ([("dy", shape, f32)] if op_type == "FusedBatchNormGradV3" else []), {}
    raise FddpsError(f"op_timing has no builder for op type {op_type!r}")


_POOL = dict(ksize=[1, 2, 2, 1], strides=[1, 2, 2, 1], padding="VALID")


def _derived(tf, op_type: str, ins: dict) -> None:
    """Inputs computed once from others, as a step computes them: MaxPoolGrad's forward
    output comes from a MaxPool (oneDNN's gradient kernel needs the pool it follows;
    without one TensorFlow runs a kernel many times slower than a step's)."""
    if op_type == "MaxPoolGrad":
        ins["y"] = tf.raw_ops.MaxPool(input=ins["x"], **_POOL)
    if op_type in ("FusedBatchNormV3", "FusedBatchNormGradV3"):
        empty = tf.constant([], tf.float32)  # training: no running mean or variance read
        ins["mean"], ins["variance"] = empty, empty
    if op_type == "FusedBatchNormGradV3":  # the batch statistics its forward op saved
        fwd = tf.raw_ops.FusedBatchNormV3(x=ins["x"], scale=ins["scale"], offset=ins["offset"],
                                          mean=empty, variance=empty, is_training=True)
        ins["r1"], ins["r2"], ins["r3"] = fwd.reserve_space_1, fwd.reserve_space_2, fwd.reserve_space_3


def _build(tf, op_type: str, ins: dict, consts: dict):
    """One copy of the op from its input tensors and shared constants; returns its tf.Operation."""
    raw = tf.raw_ops
    pool = _POOL
    conv = dict(strides=[1, 1, 1, 1], padding="SAME")
    if op_type == "MatMul":
        return raw.MatMul(a=ins["a"], b=ins["b"]).op
    if op_type == "Conv2D":
        return raw.Conv2D(input=ins["x"], filter=ins["f"], **conv).op
    if op_type == "Conv2DBackpropInput":
        return raw.Conv2DBackpropInput(input_sizes=consts["sizes"], filter=ins["f"],
                                       out_backprop=ins["dy"], **conv).op
    if op_type == "Conv2DBackpropFilter":
        return raw.Conv2DBackpropFilter(input=ins["x"], filter_sizes=consts["sizes"],
                                        out_backprop=ins["dy"], **conv).op
    if op_type in ("AddV2", "Mul", "Sub", "RealDiv", "Maximum"):
        return getattr(raw, op_type)(x=ins["x"], y=ins["y"]).op
    if op_type == "ReluGrad":
        return raw.ReluGrad(gradients=ins["y"], features=ins["x"]).op
    if op_type == "BiasAdd":
        return raw.BiasAdd(value=ins["x"], bias=ins["b"]).op
    if op_type == "BiasAddGrad":
        return raw.BiasAddGrad(out_backprop=ins["x"]).op
    if op_type in ("Sum", "Mean", "Max"):
        return getattr(raw, op_type)(input=ins["x"], axis=consts["axes"]).op
    if op_type in ("Softmax", "LogSoftmax"):
        return getattr(raw, op_type)(logits=ins["x"]).op
    if op_type in ("MaxPool", "AvgPool"):
        arg = "input" if op_type == "MaxPool" else "value"
        return getattr(raw, op_type)(**{arg: ins["x"]}, **pool).op
    if op_type == "MaxPoolGrad":
        return raw.MaxPoolGrad(orig_input=ins["x"], orig_output=ins["y"], grad=ins["dy"], **pool).op
    if op_type == "SparseSoftmaxCrossEntropyWithLogits":
        return raw.SparseSoftmaxCrossEntropyWithLogits(features=ins["logits"],
                                                       labels=ins["labels"]).loss.op
    if op_type == "AddN":
        return raw.AddN(inputs=[ins["x"], ins["y"]]).op
    if op_type == "FusedBatchNormV3":
        return raw.FusedBatchNormV3(x=ins["x"], scale=ins["scale"], offset=ins["offset"],
                                    mean=ins["mean"], variance=ins["variance"],
                                    is_training=True).y.op
    if op_type == "FusedBatchNormGradV3":
        return raw.FusedBatchNormGradV3(y_backprop=ins["dy"], x=ins["x"], scale=ins["scale"],
                                        reserve_space_1=ins["r1"], reserve_space_2=ins["r2"],
                                        reserve_space_3=ins["r3"], is_training=True).x_backprop.op
    arg = {"Relu": "features", "Identity": "input"}.get(op_type, "x")
    return getattr(raw, op_type)(**{arg: ins["x"]}).op  # unary element-wise (Relu, Sqrt, ...)


def timing_config(*, grappler: bool = False):
    """The ``ConfigProto`` ops are timed in: TensorFlow's default threads (every core for
    intra-op and inter-op work), Grappler off unless asked."""
    tf = _tf()
    config = tf.compat.v1.ConfigProto()
    if not grappler:
        config.graph_options.rewrite_options.disable_meta_optimizer = True
    return config


class _Chain:
    """One spec's graph, session and chain of copies: ``run(k)`` runs the first ``k``."""

    def __init__(self, tf, op_type, params, config, rng):
        tf1 = tf.compat.v1
        self.tf, self.op_type = tf, op_type
        self.graph = tf.Graph()
        inputs, consts = _shapes(op_type, params)
        classes = int(consts.pop("classes", 2))
        with self.graph.as_default():
            ins = {}
            for name, shape, dtype in inputs:
                if dtype == "int32":
                    value = rng.randint(0, max(classes, 1), size=shape).astype(np.int32)
                else:
                    value = rng.uniform(-1.0, 1.0, size=shape).astype(np.float32)
                var = tf1.Variable(value, name=name, trainable=False, use_resource=True)
                ins[name] = var.read_value()
            _derived(tf, op_type, ins)
            self.consts = {k: tf.constant(v, dtype=tf.int32, name=k) for k, v in consts.items()}
            self.ins = ins
            self.copies = [_build(tf, op_type, ins, self.consts)]
            init = tf1.global_variables_initializer()
            self.empty = tf1.no_op(name="empty")
        self.sess = tf1.Session(graph=self.graph, config=config)
        self.sess.run(init)
        self._callables = {}

    def extend(self, k: int) -> None:
        """Make the chain ``k`` copies long, each after the previous one."""
        with self.graph.as_default():
            while len(self.copies) < k:
                nxt = _build(self.tf, self.op_type, self.ins, self.consts)
                nxt._add_control_input(self.copies[-1])  # runs after it, alone
                self.copies.append(nxt)

    def run(self, k: int) -> float:
        """Seconds to run the first ``k`` copies (``k = 0``: an empty run)."""
        fn = self._callables.get(k)
        if fn is None:
            target = self.empty if k == 0 else self.copies[k - 1]
            fn = self._callables[k] = self.sess.make_callable(target)
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t

    def close(self):
        self.sess.close()


def time_ops(specs, *, seconds: float = 30.0, chain_seconds: float = 0.003, max_chain: int = 64,
             min_rounds: int = 3, session_config=None, progress=None, seed: int = 0) -> pd.DataFrame:
    """Measure one op of each spec on this process's CPU device.

    Parameters
    ----------
    specs : sequence of (str, str, dict)
        ``(label, op_type, params)``: ``MatMul`` takes ``m, k, n``; ``Conv2D``,
        ``Conv2DBackpropInput``, ``Conv2DBackpropFilter`` take ``n, h, w, cin,
        cout`` (and ``k``, default 3; stride 1, SAME); ``Sum``/``Mean``/``Max``
        take ``shape`` and ``axes``; the rest take ``shape`` (NHWC for the pools,
        ``[batch, classes]`` for softmax and its cross-entropy).
    seconds : float
        Time budget for everything (building, warming up, timing). At least
        ``min_rounds`` rounds run however small it is.
    chain_seconds : float
        Aimed-for time of one run of a chain; sets ``K`` per spec (2 to ``max_chain``).
    session_config : tf.compat.v1.ConfigProto, optional
        Default :func:`timing_config`.
    progress : callable, optional
        Called with a one-line message at each stage.
    seed : int
        Seed of the random inputs.

    Returns
    -------
    pandas.DataFrame
        One row per spec: ``label``, ``op_type``, ``flops``, ``input_bytes``,
        ``output_bytes`` (of one copy, from :func:`fddps.tf.op_table`),
        ``warm_seconds`` and ``cold_seconds`` (see the module notes; medians
        over rounds, at least 1 ns), ``seconds`` (their geometric mean, the cold
        time floored at the warm one), ``chain`` (K), ``rounds``, ``spread``
        (interquartile range of the per-round warm estimates over their median).

    Raises
    ------
    FddpsError
        For an op type this module cannot build, repeated labels, or ``seconds <= 0``.
    """
    from .graphdef import op_table

    if not seconds > 0:
        raise FddpsError(f"time_ops needs seconds > 0, got {seconds!r}")
    say = progress or (lambda msg: None)
    tf = _tf()
    t_start = time.perf_counter()
    rng = np.random.RandomState(seed)
    specs = [(str(label), str(op_type), dict(params)) for label, op_type, params in specs]
    if len({s[0] for s in specs}) != len(specs):
        raise FddpsError("time_ops: spec labels must be unique")
    config = session_config if session_config is not None else timing_config()
    chains, rows = [], []
    try:
        for label, op_type, params in specs:
            c = _Chain(tf, op_type, params, config, rng)
            chains.append(c)
            # One copy's FLOPs and bytes, as place() counts them.
            r = op_table(c.graph.as_graph_def()).set_index("name").loc[c.copies[0].name]
            rows.append(dict(label=label, op_type=op_type, flops=float(r["flops"]),
                             input_bytes=float(r["input_bytes"]),
                             output_bytes=float(r["output_bytes"])))
            # Warm up (oneDNN primitives, the allocator), then size the chain from a pilot.
            for _ in range(2):
                c.run(1)
            one = min(c.run(1) for _ in range(3)) - min(c.run(0) for _ in range(3))
            c.extend(int(np.clip(round(chain_seconds / max(one, 1e-6)), 2, max_chain)))
            c.run(len(c.copies))
        say(f"built and warmed up {len(specs)} ops in {time.perf_counter() - t_start:.1f} s; "
            "timing them in rounds")
        warm = [[] for _ in specs]
        cold = [[] for _ in specs]
        rounds = 0
        while rounds < min_rounds or time.perf_counter() - t_start < seconds:
            for i in np.roll(np.arange(len(specs)), -rounds).tolist():
                c = chains[i]
                k = len(c.copies)
                empty = c.run(0)
                one = c.run(1)  # first: its inputs are as cold as a round leaves them
                warm[i].append((c.run(k) - c.run(1)) / (k - 1))
                cold[i].append(one - empty)
            rounds += 1
    finally:
        for c in chains:
            c.close()
    for row, c, w, cd in zip(rows, chains, warm, cold):
        w = np.asarray(w)
        med = max(float(np.median(w)), 1e-9)
        q1, q3 = np.quantile(w, [0.25, 0.75])
        cold_med = max(float(np.median(cd)), med)
        row.update(seconds=float(np.sqrt(med * cold_med)), warm_seconds=med,
                   cold_seconds=cold_med, chain=len(c.copies), rounds=len(w),
                   spread=float((q3 - q1) / med))
    say(f"timed {len(specs)} ops in {rounds} rounds, {time.perf_counter() - t_start:.1f} s in all")
    return pd.DataFrame(rows)

