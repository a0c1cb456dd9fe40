"""The ``fddps`` command: place, simulate, plot, profile, calibrate, and run the experiments.

Run ``fddps --help`` (or ``python -m fddps --help``) for the commands;
``fddps`` with no command runs ``fddps demo``: a built-in model placed on a
built-in cluster of simulated GPUs by every algorithm.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from pathlib import Path

#: ``fddps bench NAME`` -> module in ``experiments/`` (each has ``main(argv)``): every
#: experiment of the docs' results index (docs/results/index.md), and the others with a ``main``. ``NAME`` may
#: also be spelled as the module (``search_time``).
BENCHMARKS = {
    "stg": "experiments.stg_quality",
    "comm-heavy": "experiments.comm_heavy",
    "exact-reach": "experiments.exact_reach",
    "stg-exact": "experiments.stg_exact",
    "search-time": "experiments.search_time",
    "table5": "experiments.table5",
    "table7": "experiments.table7",
    "strategies": "experiments.strategies",
    "fig4": "experiments.fig4",
    "fig5": "experiments.fig5",
    "real-cluster": "experiments.real_cluster",
    "real-cluster-whatif": "experiments.real_cluster_whatif",
    "comm-reference-bias": "experiments.comm_reference_bias",
    "link-fit-noise": "experiments.link_fit_noise",
    "model-table": "experiments.model_table",
    "costmodel-accuracy": "experiments.costmodel_accuracy",
    "cpu-preset": "experiments.cpu_preset",
    "calibrate": "experiments.calibrate",
    "gpu-kernels": "experiments.gpu_kernels",
    "contention": "experiments.contention",
    "strategy-search": "experiments.strategy_search",
    "auto-default": "experiments.auto_default",
    "keras-step": "experiments.keras_step",
    "keras-applications": "experiments.keras_applications",
    "sharded-variables": "experiments.sharded_variables",
    "strategy-equality": "experiments.strategy_equality",
    "tofu": "experiments.tofu",
    "transfer-overlap": "experiments.transfer_overlap",
    "pase": "experiments.pase",
    "flexflow": "experiments.flexflow",
    "place-time": "experiments.place_time",
    "place-hashes": "experiments.place_hashes",
}

#: ``slim_models.ALL_MODELS``, for ``--model``'s help without importing TensorFlow
#: (tests/test_cli.py checks they agree).
MODEL_NAMES = ("vgg16", "inception_v3", "resnet50", "resnet200", "pnasnet_mobile",
               "nasnet_large", "wide_resnet", "rnn_lm", "nmt")

DEMO_ALGORITHMS = ["fddps", "fddps:improve=False", "fastt", "mpdps", "heft", "etf", "single"]


class CommandError(Exception):
    """A user error the command reports in one line (exit status 2)."""


# -- argument types: argparse names the flag in front of their messages ---------------
def _int_at_least(minimum, what):
    """An argparse type: an integer >= ``minimum`` (``what`` says so in the error)."""
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
        return value

    return parse


#: An integer >= 1 (``--cpus``, ``--gpus``, ``--hosts``, sizes, steps).
positive_int = _int_at_least(1, "a positive integer")
#: An integer >= 0 (``--warmup``).
non_negative_int = _int_at_least(0, "an integer >= 0")


def _positive_finite(unit):
    """An argparse type: a positive, finite number of ``unit`` (``16e9`` works)."""
    def parse(text):
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number of {unit}, got {text!r}") from None
        if not value > 0 or value == float("inf"):
            raise argparse.ArgumentTypeError(f"must be a positive, finite number of {unit}, "
                                             f"got {text!r}")
        return value

    return parse


#: A positive number of bytes (``--memory``).
positive_bytes = _positive_finite("bytes")
#: A positive number of seconds (``--seconds``).
positive_seconds = _positive_finite("seconds")


def model_name(text):
    """A built-in model name (:data:`MODEL_NAMES`)."""
    if text not in MODEL_NAMES:
        import difflib

        close = difflib.get_close_matches(text, MODEL_NAMES, n=1)
        raise argparse.ArgumentTypeError(
            f"unknown model {text!r}" + (f" (did you mean {close[0]!r}?)" if close else "")
            + f"; built-in models: {', '.join(MODEL_NAMES)}")
    return text


# -- shared arguments --------------------------------------------------------------------
def _add_graph_arguments(p):
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("graph", nargs="?", help="a GraphDef file (.pb binary or .pbtxt text)")
    src.add_argument("--model", type=model_name, metavar="MODEL",
                     help="a built-in training graph instead: " + ", ".join(MODEL_NAMES))
    p.add_argument("--batch-size", type=positive_int, default=32,
                   help="batch size of --model (default 32)")
    p.add_argument("--image-size", type=positive_int, default=32,
                   help="input size of --model (default 32, CIFAR-10; 224/299/331 for ImageNet)")
    p.add_argument("--num-classes", type=positive_int, default=10,
                   help="classes of --model (default 10)")
    p.add_argument("--model-option", nargs="+", default=[], metavar="KEY=VALUE",
                   help="options of --model (wide_resnet: depth=152 width=10; rnn_lm, nmt: "
                        "num_layers, hidden_size, vocab_size, seq_length)")
    p.add_argument("--fetch", nargs="+", metavar="NAME",
                   help="ops/tensors one training step runs (default for --model: train op and "
                        "loss; for a file: every node)")


def _add_device_arguments(p):
    dev = p.add_mutually_exclusive_group()
    dev.add_argument("--devices", nargs="+", metavar="DEVICE",
                     help="TensorFlow device strings, e.g. /device:GPU:0 /job:worker/task:1/device:GPU:0")
    dev.add_argument("--gpus", type=positive_int, metavar="N",
                     help="N simulated GPUs per host (default 4)")
    dev.add_argument("--cpus", type=positive_int, metavar="N", help="N CPU devices on this host")
    p.add_argument("--hosts", type=positive_int, default=1,
                   help="with --gpus: number of hosts (/job:worker/task:H/...; default 1)")
    p.add_argument("--gpu-preset", default="p100",
                   help="hardware preset for GPUs without a profile: p100 (default), k80, v100, a100, "
                        "h100; NAME:fp32 for TF32 off (e.g. h100:fp32)")
    p.add_argument("--cost-model", metavar="FILE",
                   help="a cost model saved by `fddps profile` (default: analytic presets)")
    p.add_argument("--memory", type=positive_bytes, metavar="BYTES",
                   help="memory capacity of every device (default: the preset's)")


def _devices(args) -> list[str]:
    if args.devices:
        return args.devices
    if args.cpus is not None:
        if getattr(args, "hosts", 1) > 1:
            raise CommandError("--hosts is for --gpus; give several hosts' CPUs with --devices")
        return [f"/device:CPU:{i}" for i in range(args.cpus)]
    gpus = args.gpus or 4
    if args.hosts > 1:
        return [f"/job:worker/replica:0/task:{h}/device:GPU:{i}"
                for h in range(args.hosts) for i in range(gpus)]
    return [f"/device:GPU:{i}" for i in range(gpus)]


def _cost_model(args):
    import costmodel

    if args.cost_model:
        return costmodel.CostModel.load(args.cost_model)
    return costmodel.default_cost_model(gpu=args.gpu_preset)


def _load_graph(args):
    """(graph_def, fetches, description, init op name or None) from a file or a built-in model."""
    if args.model:
        import slim_models

        if args.model not in slim_models.ALL_MODELS:
            raise CommandError(f"unknown model {args.model!r}; built-in models: "
                               f"{', '.join(slim_models.ALL_MODELS)}")
        t0 = time.perf_counter()
        try:
            options = slim_models.parse_model_options(getattr(args, "model_option", None))
            inputs = ", ".join(f"{k} {v}" for k, v in
                               slim_models.resolved_options(args.model, **options).items()
                               if v is not None)
            if slim_models.SPECS[args.model].inputs == "images":  # word ids have no image size
                options.update(image_size=args.image_size, num_classes=args.num_classes)
                inputs = ", ".join(filter(None, [inputs, f"{args.image_size}x{args.image_size} "
                                                         "inputs"]))
            m = slim_models.build_training_graph(args.model, args.batch_size, **options)
        except ValueError as err:
            raise CommandError(f"--model {args.model}: {err}") from None
        fetches = args.fetch or [m.train_op.name, m.loss.name]
        desc = (f"{args.model} training graph, batch {args.batch_size}, {inputs}, "
                f"{len(m.graph_def.node)} nodes (built in {time.perf_counter() - t0:.1f} s)")
        return m.graph_def, fetches, desc, m.init_op.name
    path = Path(args.graph)
    if not path.is_file():
        raise CommandError(f"no GraphDef file at {path}")
    from .tf import load_graph

    from .tf.fetches import recorded_fetches

    graph_def, _ = load_graph(str(path))
    # A graph `fddps place` wrote records the fetches its step runs.
    fetches = args.fetch or recorded_fetches(graph_def)
    return graph_def, fetches, f"{path} ({len(graph_def.node)} nodes)", getattr(args, "init", None)


def _write_graph(graph_def, path):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".pbtxt":
        from google.protobuf import text_format

        path.write_text(text_format.MessageToString(graph_def))
    else:
        path.write_bytes(graph_def.SerializeToString())


def _save_plot(schedule, path, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .plot import plot_overview

    fig = plot_overview(schedule)  # the Gantt chart above each device's utilisation
    fig.axes[0].set_title(f"{title}: " + fig.axes[0].get_title().split(": ", 1)[-1])
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


# -- commands ------------------------------------------------------------------------------
def cmd_demo(args):
    """Place a built-in model on simulated GPUs with every algorithm; print and save the result."""
    import pandas as pd
    from tqdm import tqdm

    from . import schedule as run_algorithm
    from .algorithms import get_algorithm, parse_algorithm
    from .errors import InfeasibleError
    from .tf import make_cluster, place, read_graph_def

    args.graph, args.fetch, args.devices, args.cpus = None, None, None, None
    graph_def, fetches, desc, _ = _load_graph(args)
    devices = _devices(args)
    cost_model = _cost_model(args)
    specs = [parse_algorithm(spec) for spec in args.algorithms]
    for name, options in specs:
        get_algorithm(name, **options)  # unknown names and options fail before any work
    print(f"fddps demo: {desc}")
    print(f"devices: {len(devices)} x {args.gpu_preset.upper()} (analytic preset) on {args.hosts} "
          f"host(s); step times predicted by the fddps simulator\n")
    # Read the graph once; every algorithm schedules the same op graph.
    cluster = make_cluster(devices, cost_model, args.memory)
    graph, _ = read_graph_def(graph_def, cost_model, cluster, fetches=fetches)
    rows, makespans = [], {}
    for spec, (name, options) in tqdm(list(zip(args.algorithms, specs)), desc="scheduling",
                                      unit="algorithm", file=sys.stderr):
        try:
            s = run_algorithm(graph, cluster, algorithm=name, **options)
        except InfeasibleError as err:
            rows.append(dict(algorithm=spec, step_ms=float("nan"), note=f"does not fit: {err}"))
            continue
        makespans[spec] = s.makespan
        rows.append(dict(algorithm=spec, step_ms=s.makespan * 1e3,
                         search_s=s.info["search_seconds"],
                         devices_used=len(set(s.device.tolist())), note=""))
    if not makespans:
        raise CommandError("no algorithm could place the model on these devices")
    table = pd.DataFrame(rows)
    if "single" in makespans:
        table["speedup_vs_single"] = makespans["single"] * 1e3 / table["step_ms"]
    with pd.option_context("display.width", 140, "display.precision", 4):
        print(table.to_string(index=False))
    best = min(makespans, key=makespans.get)
    name, options = parse_algorithm(best)
    p = place(graph_def, devices, cost_model=cost_model, algorithm=name, memory=args.memory,
              fetches=fetches, **options)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    _write_graph(p.graph_def, out / "placed_graph.pb")
    p.to_chrome_trace(str(out / "trace.json"))
    _save_plot(p.schedule, out / "schedule.png", f"{args.model}: {best}")
    table.to_csv(out / "algorithms.csv", index=False)
    print(f"\nbest: {best}\n{p.summary()}")
    print(f"\nwrote {out}/placed_graph.pb (the placed GraphDef), {out}/schedule.png (Gantt chart), "
          f"{out}/trace.json (chrome://tracing), {out}/algorithms.csv")
    return 0


def cmd_place(args):
    """Place a GraphDef on devices and write the placed GraphDef."""
    from .tf import place

    graph_def, fetches, desc, _ = _load_graph(args)
    devices = _devices(args)
    options = {}
    for item in args.option or []:
        from .algorithms import parse_algorithm

        options.update(parse_algorithm("x:" + item)[1])
    p = place(graph_def, devices, cost_model=_cost_model(args), algorithm=args.algorithm,
              memory=args.memory, fetches=fetches, override=args.override,
              enforce_order=True if args.enforce_order else "auto", **options)
    print(f"{desc}\n{p.summary()}")
    from .tf.fetches import record_devices

    record_devices(p.graph_def, p.cluster.names)  # `fddps simulate` rebuilds this cluster
    _write_graph(p.graph_def, args.out)
    print(f"wrote the placed GraphDef to {args.out}")
    if args.trace:
        p.to_chrome_trace(args.trace)
        print(f"wrote a Chrome trace to {args.trace}")
    if args.plot:
        _save_plot(p.schedule, args.plot, f"{desc.split(',')[0]}: {args.algorithm}")
        print(f"wrote a Gantt chart to {args.plot}")
    if args.schedule_csv:
        p.to_dataframe().to_csv(args.schedule_csv, index=False)
        print(f"wrote the schedule to {args.schedule_csv}")
    return 0


def _replay_placed(args):
    """Schedule of a placed GraphDef as TensorFlow would run it (first-in-first-out per device)."""
    import numpy as np

    from .schedule import Schedule
    from .simulate import fifo_order
    from .tf import make_cluster, normalize_device, read_graph_def

    from .tf.fetches import recorded_devices

    graph_def, fetches, desc, _ = _load_graph(args)
    used = sorted({normalize_device(n.device) for n in graph_def.node if n.device})
    if not used:
        raise CommandError(f"{desc}: no node has a device; place it first (`fddps place`)")
    # The cluster it was placed on (idle devices and hosts included), when `fddps place`
    # recorded it: the same hosts give the same transfer times.
    devices = recorded_devices(graph_def) or used
    devices = list(dict.fromkeys(normalize_device(d) for d in devices))
    devices += [d for d in used if d not in devices]
    cost_model = _cost_model(args)
    cluster = make_cluster(devices, cost_model, args.memory)
    graph, _ = read_graph_def(graph_def, cost_model, cluster, fetches=fetches)
    node_device = {n.name: normalize_device(n.device) if n.device else None for n in graph_def.node}
    missing = [name for name in graph.names if node_device.get(name) is None]
    if missing:
        raise CommandError(f"{desc}: node {missing[0]!r} has no device ({len(missing)} such nodes)")
    device = np.array([cluster.device_index(node_device[name]) for name in graph.names])
    order = fifo_order(graph, cluster, device)
    return Schedule.from_order(graph, cluster, device, order, "as placed"), desc


def cmd_simulate(args):
    """Predict the step of an already placed GraphDef."""
    from .simulate import executor_policy, simulate

    schedule, desc = _replay_placed(args)
    g = schedule.graph
    t = simulate(g, schedule.cluster, schedule.placement,
                 policy=executor_policy(schedule.cluster))
    used = len(set(schedule.device.tolist()))
    print(f"{desc}\npredicted step time {t.makespan * 1e3:.4g} ms (TensorFlow's own order per "
          f"device, {executor_policy(schedule.cluster)} executor model) on {used} of {schedule.cluster.num_devices} devices")
    import pandas as pd

    per_device = pd.DataFrame({"busy_ms": t.busy * 1e3, "utilization": t.utilization,
                               "peak_memory_MB": t.peak_memory / 1e6})
    with pd.option_context("display.width", 140, "display.precision", 4):
        print(per_device.to_string())
        if len(t.transfers):
            print("\ntransfers:\n" + t.transfers.to_string(index=False))
    return 0


def cmd_plot(args):
    """Draw the Gantt chart of a placed GraphDef's predicted step."""
    schedule, desc = _replay_placed(args)
    _save_plot(schedule, args.out, desc.split(" (")[0])
    print(f"wrote a Gantt chart of {desc} to {args.out}")
    return 0


def cmd_profile(args):
    """Profile a graph on this machine and save the cost model fitted to it."""
    import costmodel

    from .tf import load_graph, op_table
    from .tf.profiling import profile

    graph_def, fetches, desc, init = _load_graph(args)
    if not fetches:
        raise CommandError("give --fetch: the op(s) one training step runs")
    print(f"profiling {desc}: {args.steps} traced steps after {args.warmup} warm-up steps")
    graph_def, graph = load_graph(graph_def)
    prof = profile(graph=graph, fetches=fetches, init=init, steps=args.steps, warmup=args.warmup)
    print(prof.report())
    model = costmodel.fit_cost_model(prof.join(op_table(graph_def)), graph=prof.meta["graph"])
    model.save(args.out)
    print(f"wrote the fitted cost model to {args.out} (use it with --cost-model {args.out})")
    return 0


def cmd_calibrate(args):
    """Time a fixed set of ops on this CPU and cache the CPU preset fitted to them."""
    import costmodel
    from costmodel.calibrate import cache_path, describe_curves

    if args.no_cache and not args.output:
        raise CommandError("--no-cache without --output would keep nothing; give --output FILE")

    def say(msg):
        print(msg, flush=True)

    analytic = costmodel.presets["cpu"]
    preset = costmodel.calibrate_cpu(seconds=args.seconds, cache=not args.no_cache,
                                     output=args.output, progress=say)
    print(f"\nper-op overhead {preset.overhead * 1e6:.3g} us (analytic preset: "
          f"{analytic.overhead * 1e6:.3g} us); streaming bandwidth "
          f"{preset.memory_bandwidth / 1e9:.3g} GB/s (analytic: "
          f"{analytic.memory_bandwidth / 1e9:.3g} GB/s); peak {preset.peak_flops / 1e9:.4g} GFLOP/s")
    print("efficiency by op size (of the peak FLOP/s for the dense classes, of the streaming "
          "bandwidth for the others):")
    for line in describe_curves(preset):
        print(f"  {line}")
    if not args.no_cache:
        print(f"cached at {cache_path()}: fddps.place() and the fddps commands use it for CPU "
              "devices when given no cost model")
    if args.output:
        print(f"wrote {args.output} (a cost model file: --cost-model {args.output})")
    return 0


def bench_name(text):
    """An experiment name of :data:`BENCHMARKS` (its module's spelling, ``search_time``, too)."""
    name = text.replace("_", "-")
    name = {"stg-quality": "stg"}.get(name, name)
    if name not in BENCHMARKS:
        import difflib

        close = difflib.get_close_matches(name, list(BENCHMARKS), n=1)
        raise argparse.ArgumentTypeError(
            f"unknown experiment {text!r}" + (f" (did you mean {close[0]!r}?)" if close else "")
            + f"; experiments: {', '.join(BENCHMARKS)}")
    return name


def cmd_bench(args):
    """Run one of the experiments in experiments/."""
    module = importlib.import_module(BENCHMARKS[args.name])
    status = module.main(args.args)
    return status if isinstance(status, int) else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fddps",
        description="Place the ops of a TensorFlow training graph on devices, and order them, so "
                    "that one step finishes soonest (FD-DPS and baselines). Without a command: "
                    "`fddps demo`.",
        epilog="Examples:\n"
               "  fddps demo --model vgg16 --gpus 8\n"
               "  fddps place model.pb --devices /device:CPU:0 /device:CPU:1 --out placed.pb\n"
               "  fddps place --model resnet50 --gpus 4 --hosts 2 --plot gantt.png\n"
               "  fddps simulate placed.pb\n"
               "  fddps calibrate --seconds 30\n"
               "  fddps bench stg --sizes 50 --procs 2",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("demo", help="place a built-in model with every algorithm and compare")
    p.add_argument("--model", type=model_name, default="resnet50", metavar="MODEL",
                   help="built-in model (default resnet50): " + ", ".join(MODEL_NAMES))
    p.add_argument("--batch-size", type=positive_int, default=32)
    p.add_argument("--image-size", type=positive_int, default=32)
    p.add_argument("--num-classes", type=positive_int, default=10)
    p.add_argument("--gpus", type=positive_int, default=4,
                   help="simulated GPUs per host (default 4)")
    p.add_argument("--hosts", type=positive_int, default=1)
    p.add_argument("--gpu-preset", default="p100")
    p.add_argument("--cost-model", metavar="FILE")
    p.add_argument("--memory", type=positive_bytes, metavar="BYTES")
    p.add_argument("--algorithms", nargs="+", default=DEMO_ALGORITHMS,
                   help="algorithm names or specs like fddps:improve=False")
    p.add_argument("--out", default="fddps_demo", help="folder for the outputs (default fddps_demo)")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("place", help="place a GraphDef (or a built-in model) and write the result")
    _add_graph_arguments(p)
    _add_device_arguments(p)
    p.add_argument("--algorithm", default="fddps", help="scheduling algorithm (default fddps)")
    p.add_argument("--option", nargs="+", metavar="KEY=VALUE", help="algorithm options, e.g. split=False")
    p.add_argument("--override", action="store_true", help="may move ops the graph already pins")
    p.add_argument("--enforce-order", action="store_true",
                   help="add control edges so TensorFlow follows the scheduled order per device "
                        "(default: only when TensorFlow's own order is predicted slower than one "
                        "device; without fetches the graph then goes on one device)")
    p.add_argument("--out", default="placed.pb", help="placed GraphDef (.pb or .pbtxt; default placed.pb)")
    p.add_argument("--trace", metavar="FILE", help="also write a Chrome trace (JSON)")
    p.add_argument("--plot", metavar="FILE", help="also write a Gantt chart (PNG)")
    p.add_argument("--schedule-csv", metavar="FILE", help="also write the schedule as CSV")
    p.set_defaults(func=cmd_place)

    for name, func, text in (("simulate", cmd_simulate, "predict the step time of a placed GraphDef"),
                             ("plot", cmd_plot, "draw the Gantt chart of a placed GraphDef")):
        p = sub.add_parser(name, help=text)
        _add_graph_arguments(p)
        p.add_argument("--gpu-preset", default="p100")
        p.add_argument("--cost-model", metavar="FILE")
        p.add_argument("--memory", type=positive_bytes, metavar="BYTES")
        if name == "plot":
            p.add_argument("--out", default="schedule.png", help="PNG file (default schedule.png)")
        p.set_defaults(func=func)

    p = sub.add_parser("profile", help="profile a graph here and save a fitted cost model")
    _add_graph_arguments(p)
    p.add_argument("--init", nargs="+", metavar="NAME",
                   help="ops to run once first, e.g. the variable initializer (default for --model: "
                        "its init op)")
    p.add_argument("--steps", type=positive_int, default=10)
    p.add_argument("--warmup", type=non_negative_int, default=3)
    p.add_argument("--out", default="cost_model.json")
    p.set_defaults(func=cmd_profile)

    p = sub.add_parser("calibrate", help="fit the CPU preset to this machine and cache it",
                       description="Time a fixed set of TensorFlow ops (MatMul, convolutions and "
                                   "their gradients, element-wise ops, pooling, reductions) on "
                                   "this machine's CPU, fit per-class efficiencies that depend on "
                                   "the op's size, and cache the calibrated CPU preset under the "
                                   "user's cache folder ($FDDPS_CACHE_DIR, $XDG_CACHE_HOME/fddps "
                                   "or ~/.cache/fddps), where fddps.place() finds it.")
    p.add_argument("--seconds", type=positive_seconds, default=30.0,
                   help="time budget of the measurement (default 30)")
    p.add_argument("--no-cache", action="store_true", help="do not write the cache (use --output)")
    p.add_argument("--output", metavar="FILE",
                   help="also write the calibration as a cost model file (for --cost-model)")
    p.set_defaults(func=cmd_calibrate)

    p = sub.add_parser("bench", help="run an experiment: " + ", ".join(BENCHMARKS),
                       description="Run an experiment; arguments after NAME go to it "
                                   "(`fddps bench NAME --help`).")
    p.add_argument("name", type=bench_name, metavar="NAME",
                   help="one of: " + ", ".join(BENCHMARKS))
    p.add_argument("args", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_bench)
    return parser


#: Experiments that never import TensorFlow (``fddps bench`` skips its quiet import for them).
NO_TENSORFLOW_BENCHMARKS = frozenset({"stg", "search-time"})


def import_tensorflow_quietly():
    """Import TensorFlow with its start-up lines (absl's pre-init warning and the oneDNN
    notice, each printed by two of its libraries) kept off the terminal.

    TF_CPP_MIN_LOG_LEVEL does not reach those lines, so the process's stderr
    (file descriptor 2) goes to a temporary file during the import; if the
    import fails, what TensorFlow wrote there is printed with the error.
    """
    if "tensorflow" in sys.modules:
        return
    import tempfile

    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no real stderr (embedded): import plainly
        import tensorflow  # noqa: F401
        return
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            import tensorflow  # noqa: F401
        except BaseException:
            os.dup2(saved, 2)
            tmp.seek(0)
            sys.stderr.write(tmp.read().decode(errors="replace"))
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def main(argv=None) -> int:
    """Entry point of ``fddps`` and ``python -m fddps``; returns the exit status."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # keep TensorFlow's start-up chatter out
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = next(a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    if argv and not argv[0].startswith("-") and argv[0] not in commands:
        import difflib

        close = difflib.get_close_matches(argv[0], list(commands), n=1, cutoff=0.5)
        print(f"fddps: error: unknown command {argv[0]!r}"
              + (f"; did you mean `fddps {close[0]}`?" if close else "")
              + f" (commands: {', '.join(commands)})", file=sys.stderr)
        return 2
    if not argv or (argv[0] not in commands and argv[0] not in ("-h", "--help")):
        argv = ["demo"] + argv  # no command: the demo, with whatever options were given
    try:
        args = parser.parse_args(argv)
    except SystemExit as done:  # --help (0), or a bad flag argparse named on stderr (2)
        return done.code if isinstance(done.code, int) else 2
    if not (args.command == "bench" and args.name in NO_TENSORFLOW_BENCHMARKS):
        import_tensorflow_quietly()
    from .errors import FddpsError

    try:
        return args.func(args)
    except (CommandError, FddpsError) as err:
        print(f"fddps {args.command}: error: {err}", file=sys.stderr)
        return 2
