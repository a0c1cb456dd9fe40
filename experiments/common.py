"""Shared helpers of the paper experiments (``table5``, ``fig4``, ``fig5``, ``real_cluster``).

- :data:`PAPER_TABLE5`: the paper's Table 5 (seconds, 8 x P100 server, TF 1.14).
- :func:`load_model` builds one ``slim_models`` training graph and reads it once
  into an :class:`~fddps.graph.OpGraph` (:func:`fddps.tf.read_graph_def`, only
  the step's ops: the ancestors of ``train_op`` and ``loss``); the experiments
  then schedule that one graph with every algorithm (:func:`run_strategy`).
- :func:`gpu_cluster`: simulated GPUs named by TensorFlow device strings, links
  and capacity from the cost model.
- :func:`run_strategy`: one algorithm on one graph and cluster, as a table row
  that says how long the step takes, how long the search took, and how much
  memory the schedulers reserve against what the simulator says is held at once;
  an :class:`fddps.InfeasibleError` becomes an ``"OOM"`` row.

Everything that imports TensorFlow does it inside the function that needs it, so
importing this module is cheap.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

import fddps
from fddps.algorithms import parse_algorithm
from fddps.simulate import peak_memory

#: Where experiments write their tables and plots (git-ignored).
RESULTS = Path(__file__).resolve().parent / "results"

#: The paper's Table 5: single-round iteration time in seconds of one training
#: step on CIFAR-10 (32 x 32), TF 1.14, Intel CPU + 8 x NVIDIA P100 server.
#: Keys ``(model, GPUs)``; ``None`` where the paper reports out-of-memory.
#: ``single`` is the single-GPU time (the same for every GPU count of a model).
#: The paper's "Speedup 1" column is (MP-DPS - FD-DPS) / MP-DPS and "Speedup 2"
#: (FastT - FD-DPS) / FastT (checked against its numbers); its caption words them otherwise.
PAPER_TABLE5 = {
    ("vgg16", 2): dict(single=0.794, data_parallel=1.272, fastt=1.122, mpdps=1.066, fddps=1.051),
    ("vgg16", 4): dict(single=0.794, data_parallel=1.770, fastt=1.975, mpdps=1.905, fddps=1.812),
    ("inception_v3", 2): dict(single=0.574, data_parallel=0.738, fastt=0.712, mpdps=0.702, fddps=0.685),
    ("inception_v3", 4): dict(single=0.574, data_parallel=0.943, fastt=0.912, mpdps=0.872, fddps=0.823),
    ("resnet50", 4): dict(single=0.394, data_parallel=0.895, fastt=0.834, mpdps=0.719, fddps=0.683),
    ("resnet50", 8): dict(single=0.394, data_parallel=1.983, fastt=1.874, mpdps=1.741, fddps=1.587),
    ("resnet200", 4): dict(single=2.331, data_parallel=0.986, fastt=0.853, mpdps=0.806, fddps=0.743),
    ("resnet200", 8): dict(single=2.331, data_parallel=2.321, fastt=2.046, mpdps=1.955, fddps=1.723),
    ("pnasnet_mobile", 4): dict(single=0.822, data_parallel=1.669, fastt=1.624, mpdps=1.547, fddps=1.384),
    ("pnasnet_mobile", 8): dict(single=0.822, data_parallel=2.643, fastt=2.459, mpdps=2.147, fddps=1.873),
    ("nasnet_large", 4): dict(single=None, data_parallel=None, fastt=4.289, mpdps=3.876, fddps=3.627),
    ("nasnet_large", 8): dict(single=None, data_parallel=None, fastt=7.425, mpdps=6.550, fddps=5.931),
}

#: The paper's batch sizes (its Table 3): 64, and 16 for ResNet-200 and NASNet-A Large.
PAPER_BATCH = {"vgg16": 64, "inception_v3": 64, "resnet50": 64, "resnet200": 16,
               "pnasnet_mobile": 64, "nasnet_large": 16}

MODELS = tuple(PAPER_BATCH)

#: Algorithms every placement experiment compares (FD-DPS with and without our
#: refinement pass, the paper's baselines FastT and MP-DPS, and HEFT and m-ETF).
DEFAULT_ALGORITHMS = ("fddps", "fddps:improve=False", "fastt", "mpdps", "heft", "etf")

#: Short column labels of strategies.
LABELS = {"single": "single", "data_parallel": "DP", "fddps": "FD-DPS",
          "fddps:improve=False": "FD-DPS(paper)", "fddps:split=False": "D-DPS(-F)",
          "fastt": "FastT", "mpdps": "MP-DPS", "heft": "HEFT", "etf": "m-ETF", "topo": "m-TOPO"}

COST_MODEL_NOTE = (
    "Costs: costmodel.default_cost_model(gpu='p100'), an ANALYTIC model of the P100 "
    "(9.3 TFLOPS FP32, 732 GB/s, 16 GiB; 10 us per op): convolutions and MatMuls by the kernel "
    "model fitted to DeepBench's published P100 kernel times, given each kernel's shape (batch, "
    "channels, filter, stride, padding; M, N, K: the op table's kernel_shape), other ops by the "
    "roofline at assumed efficiencies; PCIe 3 between GPUs of a host (12 GB/s, 10 us), 10 GbE "
    "between hosts; data parallelism's all-reduce on one host as DeepBench measured it on P100s (5.8 GB/s); "
    "nothing was measured on a GPU here. "
    "Times are the simulator's replay of each schedule (links inside a host contention-free; "
    "between hosts, one network interface per host that its transfers share).")


def with_split_variant(specs, graph) -> list:
    """``specs`` plus ``"fddps:split=False"`` (D-DPS(-F)) when ``graph`` carries split
    candidates and ``"fddps"`` is among them (without candidates it is FD-DPS itself)."""
    specs = list(specs)
    if graph.split_candidates and "fddps" in specs and "fddps:split=False" not in specs:
        specs.append("fddps:split=False")
    return specs


def label(spec: str) -> str:
    """Column label of a strategy spec (``"fddps:improve=False"`` -> ``"FD-DPS(paper)"``)."""
    return LABELS.get(spec, spec)


def tf_quiet():
    """Silence TensorFlow's C++ and Python logging (call before importing it)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import logging

    logging.getLogger("tensorflow").setLevel(logging.ERROR)


@dataclass
class ModelGraph:
    """One training graph, read once for scheduling.

    Attributes
    ----------
    model : str
        ``slim_models`` name.
    batch, image_size, num_classes : int
    graph : OpGraph
        The step's ops (ancestors of ``train_op`` and ``loss``), costed for the
        device type it was read for.
    nodes : int
        Nodes of the whole GraphDef (initialisers included); ``ops`` of them are the step's.
    edges : int
        Edges of the OpGraph (data and control).
    parameters : int
        Trainable scalars.
    gradient_bytes : float
        Bytes of the trainable variables (= of one full set of gradients).
    build_seconds, read_seconds : float
        Wall time to build the TensorFlow graph and to read it.
    info : dict
        :func:`fddps.tf.read_graph_def`'s facts, without the bulky ``analysis``.
    graph_def : GraphDef or None
        Kept only when :func:`load_model` is asked to (``keep_graph_def=True``).
    """

    model: str
    batch: int
    image_size: int
    num_classes: int
    graph: fddps.OpGraph
    nodes: int
    edges: int
    parameters: int
    gradient_bytes: float
    build_seconds: float
    read_seconds: float
    info: dict = field(default_factory=dict)
    graph_def: object = None
    fetches: tuple = ()
    ops: int = 0

    def __post_init__(self):
        self.ops = self.graph.num_ops if self.graph is not None else self.ops


def build_model(model: str, batch: int, *, dataset: str = "cifar10", image_size: int | None = None,
                model_options: dict | None = None):
    """``slim_models.build_training_graph`` for any model: image models get ``dataset``
    and ``image_size``, the sequence models (``rnn_lm``, ``nmt``) only their options."""
    import slim_models

    options = dict(model_options or {})
    if slim_models.SPECS[model].inputs == "images":
        options.update(image_size=image_size, dataset=dataset)
    return slim_models.build_training_graph(model, int(batch), **options)


def load_model(model: str, batch: int, cost_model, *, dataset: str = "cifar10",
               image_size: int | None = None, devices=("/device:GPU:0",),
               keep_graph_def: bool = False, model_options: dict | None = None) -> ModelGraph:
    """Build ``model``'s training graph at ``batch`` and read it into an OpGraph.

    Parameters
    ----------
    model : str
        One of ``slim_models.ALL_MODELS``.
    batch : int
    cost_model : costmodel.CostModel
        Gives op times for ``device``'s type, and op memory.
    dataset : str
        ``"cifar10"`` (32 x 32, 10 classes: the paper's) or ``"imagenet"``.
    image_size : int, optional
        Overrides the dataset's image size.
    devices : sequence of str
        TensorFlow devices of the type to cost the ops for. The OpGraph keeps
        one cost column per device type, so it serves any cluster of that
        type; give the largest cluster it will be scheduled on (the reader
        sizes split candidates' combine ops by the number of devices).
    keep_graph_def : bool
        Keep the GraphDef (for :func:`fddps.place` or running it).
    model_options : dict, optional
        Options of the model (``wide_resnet``: ``depth``, ``width``; ``rnn_lm``
        and ``nmt``: ``num_layers``, ``hidden_size``, ...). The sequence models
        take no ``dataset`` or ``image_size`` (their ``image_size`` is None).

    Returns
    -------
    ModelGraph

    Raises
    ------
    ValueError
        For an unknown model or dataset, or a batch below 1.
    """
    tf_quiet()
    import slim_models
    from fddps.tf import make_cluster, read_graph_def

    if model not in slim_models.ALL_MODELS:
        raise ValueError(f"unknown model {model!r}; known: {', '.join(slim_models.ALL_MODELS)}")
    if int(batch) < 1:
        raise ValueError(f"batch must be >= 1, got {batch!r}")
    t0 = time.perf_counter()
    m = build_model(model, batch, dataset=dataset, image_size=image_size, model_options=model_options)
    graph_def = m.graph_def
    built = time.perf_counter() - t0
    fetches = (m.train_op.name, m.loss.op.name)
    t0 = time.perf_counter()
    graph, info = read_graph_def(graph_def, cost_model, make_cluster(list(devices), cost_model),
                                 fetches=list(fetches))
    read = time.perf_counter() - t0
    info = {k: v for k, v in info.items() if k not in ("analysis", "step_nodes")}
    grad_bytes = float(sum(int(np.prod(v.shape)) * v.dtype.base_dtype.size
                           for v in m.trainable_variables))
    return ModelGraph(model, int(batch), m.image_size, m.num_classes, graph, int(info["nodes"]),
                      graph.num_edges, slim_models.count_parameters(m), grad_bytes, built, read,
                      info, graph_def if keep_graph_def else None, fetches)


def device_names(devices: int, hosts: int = 1, device_type: str = "GPU") -> list:
    """TensorFlow device strings: ``devices`` per host, on ``hosts`` hosts.

    One host: ``/device:GPU:0 ..``; several: ``/job:worker/replica:0/task:H/device:GPU:i``.
    """
    if hosts == 1:
        return [f"/device:{device_type}:{i}" for i in range(devices)]
    return [f"/job:worker/replica:0/task:{h}/device:{device_type}:{i}"
            for h in range(hosts) for i in range(devices)]


def gpu_cluster(devices: int, cost_model, *, hosts: int = 1, memory=None, topology="auto"):
    """A :class:`fddps.Cluster` of ``hosts x devices`` GPUs (links, capacity from the cost model).

    ``memory`` (bytes per device) overrides the preset's capacity; ``topology``
    is :func:`fddps.tf.make_cluster`'s (default one network interface per host
    that transfers between hosts share; ``None``: contention-free links).
    """
    from fddps.tf import make_cluster

    return make_cluster(device_names(devices, hosts), cost_model, memory, topology=topology)


def unbounded(cluster) -> fddps.Cluster:
    """The same cluster with unlimited memory on every device."""
    devs = [fddps.Device(d.name, d.type, d.speed, math.inf, d.host) for d in cluster.devices]
    return cluster.replace(devices=devs)


def schedule_peak(schedule) -> np.ndarray:
    """Per device, the simulator's highest bytes held at once during the schedule's step."""
    return peak_memory(schedule.graph, schedule.cluster, schedule.device, schedule.start,
                       schedule.finish)


def run_strategy(graph, cluster, spec: str, *, validate: bool = True, probe_oom: bool = True,
                 extra=None) -> dict:
    """Schedule ``graph`` on ``cluster`` with the algorithm ``spec``; one result row.

    Parameters
    ----------
    graph : OpGraph
    cluster : Cluster
    spec : str
        ``name`` or ``name:key=value,...`` (:func:`fddps.algorithms.parse_algorithm`).
    validate : bool
        Check the schedule (:meth:`fddps.Schedule.validate`).
    probe_oom : bool
        When the algorithm finds the graph does not fit, schedule it again with
        unlimited memory and report that schedule's simulated peak: it says
        whether the placement is refused because its peak really does not fit.

    Returns
    -------
    dict
        ``strategy``, ``status`` (``"ok"`` or ``"OOM"``), ``step_seconds``
        (NaN on OOM), ``search_seconds``, ``devices_used``, ``reserved_max``
        (largest per-device ``memory + transient`` sum, bytes), ``peak_max``
        (largest per-device simulated peak, bytes), ``capacity`` (bytes of the
        smallest device), ``message`` (the OOM reason), and on OOM with
        ``probe_oom`` ``unbounded_peak_max``, ``unbounded_reserved_max`` and
        ``unbounded_step_seconds`` of the schedule with unlimited memory.
    """
    name, options = parse_algorithm(spec)
    row = dict(strategy=spec, status="ok", step_seconds=np.nan, search_seconds=np.nan,
               devices_used=0, reserved_max=np.nan, peak_max=np.nan,
               capacity=float(min(d.memory for d in cluster.devices)), message="",
               unbounded_peak_max=np.nan, unbounded_reserved_max=np.nan,
               unbounded_step_seconds=np.nan, splits=0)
    t0 = time.perf_counter()
    try:
        s = fddps.schedule(graph, cluster, algorithm=name, **options)
    except fddps.InfeasibleError as e:
        row.update(status="OOM", search_seconds=time.perf_counter() - t0, message=str(e))
        if probe_oom and math.isfinite(row["capacity"]):
            try:
                free = fddps.schedule(graph, unbounded(cluster), algorithm=name, **options)
            except fddps.InfeasibleError:  # not a memory problem (no kernel, pins)
                return row
            row.update(unbounded_peak_max=float(schedule_peak(free).max()),
                       unbounded_reserved_max=float(free.device_memory().max()),
                       unbounded_step_seconds=free.makespan)
        return row
    row["search_seconds"] = s.info.get("search_seconds", time.perf_counter() - t0)
    if validate:
        s.validate()
    row.update(step_seconds=s.makespan, devices_used=int(len(np.unique(s.device))),
               reserved_max=float(s.device_memory().max()), peak_max=float(schedule_peak(s).max()),
               splits=len(s.info.get("splits", [])))
    if extra is not None:
        row.update(extra(s))
    return row


_replicas = {}


def data_parallel_row(mg: ModelGraph, cluster, cost_model, *, dataset="cifar10",
                      image_size=None) -> dict:
    """Data parallelism over ``cluster`` as a :func:`run_strategy`-style row (``"data_parallel"``).

    Builds ``mg.model`` again at ``mg.batch // p`` (the last replica graph is
    cached) and calls :func:`experiments.data_parallel.estimate`. A batch
    smaller than ``p`` gives status ``"n/a"``; a replica that does not fit, ``"OOM"``.
    """
    from .data_parallel import estimate, measured_allreduce

    p = cluster.num_devices
    replica_batch = mg.batch // p
    row = dict(strategy="data_parallel", status="ok", step_seconds=np.nan, search_seconds=np.nan,
               devices_used=p, reserved_max=np.nan, peak_max=np.nan,
               capacity=float(cluster.devices[0].memory), message="", unbounded_peak_max=np.nan,
               unbounded_reserved_max=np.nan, unbounded_step_seconds=np.nan, splits=0)
    if replica_batch < 1:
        row.update(status="n/a", message=f"batch {mg.batch} < {p} replicas")
        return row
    key = (mg.model, replica_batch, dataset, image_size, id(cost_model))
    if key not in _replicas:
        _replicas.clear()  # keep one replica graph at a time
        _replicas[key] = load_model(mg.model, replica_batch, cost_model, dataset=dataset,
                                    image_size=image_size).graph
    est = estimate(_replicas[key], cluster, mg.gradient_bytes,
                   allreduce=measured_allreduce(cost_model, cluster))
    row.update(status=est.status, step_seconds=est.step_seconds, reserved_max=est.reserved,
               peak_max=est.peak, message=est.message or (
                   f"replica batch {replica_batch}: {est.replica_seconds * 1e3:.4g} ms + "
                   f"all-reduce ({est.allreduce_model}) of {est.gradient_bytes / 1e6:.4g} MB: "
                   f"{est.allreduce_seconds * 1e3:.4g} ms"))
    if est.status == "OOM":
        row.update(unbounded_peak_max=est.peak, unbounded_reserved_max=est.reserved,
                   unbounded_step_seconds=np.nan)
    return row


def speedup(base, new) -> float:
    """The paper's speedup: ``(base - new) / base`` (fraction; NaN if either is missing)."""
    if base is None or new is None or not np.isfinite(base) or not np.isfinite(new) or base <= 0:
        return np.nan
    return (base - new) / base


def one_core_config():
    """A session config of one intra-op and one inter-op thread: one op at a time on one core."""
    import tensorflow as tf

    return tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1, inter_op_parallelism_threads=1)


def interleaved_step_times(graph_defs, fetch, init, target="", steps=10, warmup=2, config=None):
    """Wall times of ``steps`` runs of ``fetch`` in each graph, the graphs taking turns.

    Taking turns step by step puts every graph under the same load from other
    processes. ``config``: the sessions' ConfigProto (default TensorFlow's).
    Returns one list of seconds per graph.
    """
    import tensorflow as tf

    tf1 = tf.compat.v1
    sessions = []
    try:
        for gd in graph_defs:
            g = tf.Graph()
            with g.as_default():
                tf1.import_graph_def(gd, name="")
            sess = tf1.Session(target, graph=g, config=config)
            sessions.append(sess)
            sess.run(init)
        for _ in range(warmup):
            for sess in sessions:
                sess.run(fetch)
        times = [[] for _ in sessions]
        for _ in range(steps):
            for k, sess in enumerate(sessions):
                t0 = time.perf_counter()
                sess.run(fetch)
                times[k].append(time.perf_counter() - t0)
    finally:
        for sess in sessions:
            sess.close()
    return times


def ensure_parent(path) -> Path:
    """``path`` as a Path, its folder created."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def save_csv_and_plot(df, out, plot, *plot_args) -> Path:
    """Write ``df`` to the CSV ``out`` and ``plot(df, png, *plot_args)`` beside it; print both paths.

    Returns the CSV's path.
    """
    out = ensure_parent(out)
    df.to_csv(out, index=False)
    png = out.with_suffix(".png")
    plot(df, png, *plot_args)
    print(f"results: {out}, {png}")
    return out


def matplotlib_agg():
    """``matplotlib.pyplot`` on the non-interactive Agg backend (for writing PNGs)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def fmt_ms(seconds) -> str:
    """Seconds as milliseconds with 4 significant digits; ``OOM``/``-`` for missing."""
    if seconds is None or (isinstance(seconds, float) and np.isnan(seconds)):
        return "-"
    if isinstance(seconds, str):
        return seconds
    return f"{seconds * 1e3:.4g}"


def fmt_pct(x) -> str:
    return "-" if x is None or not np.isfinite(x) else f"{100 * x:+.1f}%"


def graph_table(models) -> pd.DataFrame:
    """Our graph sizes beside the paper's Table 3 (one row per :class:`ModelGraph`)."""
    import slim_models

    rows = []
    for mg in models:
        pb, pops, pedges = slim_models.PAPER_TABLE3[mg.model]
        rows.append(dict(model=mg.model, batch=mg.batch, image=mg.image_size, nodes=mg.nodes,
                         step_ops=mg.ops, step_edges=mg.edges, params=mg.parameters,
                         build_s=round(mg.build_seconds, 1), read_s=round(mg.read_seconds, 1),
                         paper_ops=pops, paper_edges=pedges, paper_batch=pb,
                         shapes_unknown=mg.info.get("shapes_unknown", 0),
                         kernels_unchecked=",".join(mg.info.get("kernels_unchecked", []))))
    return pd.DataFrame(rows)



def markdown_table(df: pd.DataFrame, floats: str = "{:.4g}") -> str:
    """``df`` as a Markdown table (floats with ``floats``, NaN as empty), for generated pages."""
    def cell(v):
        if isinstance(v, float):
            return "" if v != v else floats.format(v)
        return str(v).replace("|", "\\|")

    lines = ["| " + " | ".join(map(str, df.columns)) + " |", "|" + "---|" * len(df.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |"
              for row in df.itertuples(index=False)]
    return "\n".join(lines)


def cpu_model() -> str:
    """This machine's CPU model (``/proc/cpuinfo``'s model name), else the platform's name."""
    import platform

    from costmodel.calibrate import cpu_key

    try:
        return cpu_key()["cpu_model"]
    except (OSError, KeyError, ValueError):
        return platform.processor() or platform.machine()


def write_results_page(csv_path, title: str, what: str, df: pd.DataFrame | None = None,
                       command: str | None = None, seconds: float | None = None,
                       after: str = "", floats: str = "{:.4g}") -> Path:
    """Write the generated page ``<csv_path>.md`` of an experiment from its CSV.

    The page says the command, the date and machine, what was measured
    (``what``), the table (``df``, default: the CSV itself; floats formatted
    with ``floats``) and ``after`` it (a figure, a note). The docs
    include it where a page has ``<!-- generated-results: NAME -->``.
    Returns the page's path.
    """
    import datetime
    import sys

    csv_path = Path(csv_path)
    if df is None:
        df = pd.read_csv(csv_path)
    if command is None:
        module = Path(sys.argv[0]).stem if sys.argv and sys.argv[0] else "?"
        command = " ".join([f"python -m experiments.{module}", *sys.argv[1:]])
    took = f"; {seconds:.0f} s in all" if seconds is not None else ""
    text = "\n".join([
        f"# {title}",
        "",
        f"Command: `{command}`  ",
        f"Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; machine: "
        f"{cpu_model()}, {os.cpu_count()} cores, shared with other jobs{took}. Generated from "
        f"`{csv_path.name}`.",
        "",
        what,
        "",
        markdown_table(df, floats),
        "",
        *([after, ""] if after else []),
    ])
    out = csv_path.with_suffix(".md")
    out.write_text(text)
    return out


def quickstart_cnn(keras, seed=0):
    """README's Keras quick start model (32x32x3 images, 10 classes), seeded."""
    keras.utils.set_random_seed(seed)
    return keras.Sequential([
        keras.Input((32, 32, 3)),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(10)])


def quickstart_linear_step(stddev=0.01):
    """README's ``tf.function`` quick start: a linear softmax classifier on 32x32x3, SGD 0.1.

    Its weights start normal with ``stddev`` (seeded; 0: zeros). Returns the
    ``tf.function`` training step, which updates its variables and returns the loss.
    """
    import tensorflow as tf

    shape = [32 * 32 * 3, 10]
    w = tf.Variable(tf.random.normal(shape, stddev=stddev, seed=0) if stddev else tf.zeros(shape))
    b = tf.Variable(tf.zeros([10]))

    @tf.function
    def train_step(images, labels):
        with tf.GradientTape() as tape:
            logits = tf.reshape(images, [-1, 32 * 32 * 3]) @ w + b
            loss = tf.reduce_mean(
                tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
        for v, g in zip([w, b], tape.gradient(loss, [w, b])):
            v.assign_sub(0.1 * g)
        return loss

    return train_step
