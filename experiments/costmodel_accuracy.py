"""How well the cost model predicts what it was not shown: op times, step times, links.

Three parts, each printing what it measured and how:

A. **Single device (CPU, one core).** For each model (ResNet-50, Inception-V3
   training graphs from ``slim_models``), profile the step at batch ``b1`` and
   at batch ``b2``, in alternating rounds so that the load other processes put
   on the machine hits both alike (:func:`costmodel.merge_profiles`). Then

   - *held-out ops*: 5-fold cross-validation over the ops of the ``b1``
     profile: each op is predicted by a model fitted without it (so from its
     type's regression on FLOPs and bytes, or the calibrated preset);
   - *cross-batch*: the model fitted on ``b1`` predicts every op at ``b2``;
   - *step time*: the model fitted on ``b1`` places the ``b2`` graph on one
     device (``fddps.tf.place(..., algorithm="single")``); its makespan plus the
     step overhead of the ``b1`` profile (median step minus the sum of its op
     times: ``Session.run`` set-up, executor gaps; independent of the batch)
     is compared with the measured median ``b2`` step.

   Errors are relative, ``|predicted - measured| / measured``, over the ops the
   profile timed (not fused or pruned ones); "big ops" are those measured at
   100 us or more. The device is an in-process session held to one thread
   (``intra_op = inter_op = 1``), a device that runs one op at a time, as the
   scheduler assumes; on this shared 2-core machine one thread is also far less
   disturbed by other processes than two.

B. **Links.** Two ``local_cluster`` tasks (one core each): transfers of 4 B to
   24 MB both ways (``fddps.tf.comm_bench``), latency and bandwidth fitted per
   link by linear regression, R² per link.

C. **Placed graphs on the 2-worker cluster.** Per model at batch ``b1``: profile
   the step on task 0 alone, fit a cost model (that profile + part B's links +
   the one-core CPU preset), place the graph on both tasks (FD-DPS, and FD-DPS
   without its single-device guard so that the graph really is spread) and on
   task 0 alone, run the placed graphs step by step in turns (so all see the
   same load from other processes), and compare each predicted step (the FIFO
   replay of the placement under the cost model, plus the step overhead of the
   one-task profile) with the measured median step, and the predicted with the
   measured speed-up. Beside it are printed the prediction with contention-free
   links, and with TensorFlow's depth-first executor order instead of FIFO
   (``fddps.simulate(..., policy="tensorflow")``).

Usage::

    python -m experiments.costmodel_accuracy                 # all parts (~6 min on 2 cores)
    python -m experiments.costmodel_accuracy --parts A --models resnet50 --steps 3
    python -m experiments.costmodel_accuracy --out /tmp/costmodel_accuracy.json
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings

import numpy as np
import pandas as pd

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from .common import interleaved_step_times, one_core_config  # noqa: E402


def _rel(pred, meas):
    pred, meas = np.asarray(pred, float), np.asarray(meas, float)
    return np.abs(pred - meas) / meas


def part_a(models, b1, b2, image_size, steps, rounds):
    """Single-device accuracy: held-out ops, cross-batch ops, step time."""
    import costmodel
    import slim_models
    from fddps.tf import op_table, place
    from fddps.tf.profiling import profile

    cfg = one_core_config()
    base = costmodel.CostModel({"CPU": costmodel.cpu_preset(1)})
    rows = []
    for name in models:
        t0 = time.perf_counter()
        built = {b: slim_models.build_training_graph(name, batch_size=b, image_size=image_size,
                                                     num_classes=10) for b in (b1, b2)}
        tables = {b: op_table(m.graph_def) for b, m in built.items()}
        chunks = {b1: [], b2: []}
        for r in range(rounds):
            for b in (b1, b2):
                chunks[b].append(profile(built[b], steps=steps, warmup=1, session_config=cfg,
                                         progress=True, meta={"model": name, "batch": b}))
        prof = {b: costmodel.merge_profiles(c) for b, c in chunks.items()}
        for b in (b1, b2):
            print(f"\n[{name} batch {b}] " + prof[b].report())
        m1, m2 = prof[b1].join(tables[b1]), prof[b2].join(tables[b2])
        timed1 = (m1["status"] == "timed").to_numpy()

        # Held-out ops: 5 folds over the b1 profile; the held-out ops get new names
        # so that nothing of their own measurement is used.
        rng = np.random.default_rng(0)
        fold = rng.integers(0, 5, len(m1))
        held_pred = np.full(len(m1), np.nan)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", costmodel.ProfileCoverageWarning)
            for k in range(5):
                cm_k = costmodel.fit_cost_model(m1[fold != k], base=base)
                test = m1[fold == k].assign(name=lambda d: "heldout/" + d["name"])
                held_pred[fold == k] = cm_k.op_times(test, "CPU")
            cm1 = costmodel.fit_cost_model(m1, base=base, graph=prof[b1].meta["graph"])
            cross = cm1.op_times(m2, "CPU")
            sources = cm1.last_report.counts
        y1 = m1["seconds"].to_numpy()
        held_rel = _rel(held_pred[timed1], y1[timed1])
        timed2 = (m2["status"] == "timed").to_numpy()
        y2 = m2["seconds"].to_numpy()
        cross_rel = _rel(cross[timed2], y2[timed2])
        big1, big2 = y1[timed1] >= 1e-4, y2[timed2] >= 1e-4

        # Step time at b2 from the b1 model, through the TF adapter's single-device placement.
        fetch = built[b2].train_op.name
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", costmodel.ProfileCoverageWarning)
            placed = place(built[b2].graph_def, ["/device:CPU:0"], cost_model=cm1,
                           algorithm="single", fetches=[fetch])
            same = place(built[b1].graph_def, ["/device:CPU:0"], cost_model=cm1,
                         algorithm="single", fetches=[built[b1].train_op.name])
        executed2 = int((m2["status"] != "pruned").sum())
        executed1 = int((m1["status"] != "pruned").sum())
        gap = prof[b1].dispatch_seconds
        overhead = prof[b1].step_overhead_seconds
        pred_step2 = placed.makespan + overhead
        pred_step1 = same.makespan + overhead
        meas_step2, meas_step1 = prof[b2].step_time(), prof[b1].step_time()
        row = {
            "model": name, "b1": b1, "b2": b2, "image_size": image_size,
            "graph_ops": len(tables[b1]), "step_ops": len(m1),
            "timed": int(timed1.sum()), "fused": int((m1["status"] == "fused").sum()),
            "pruned": int((m1["status"] == "pruned").sum()), "coverage": prof[b1].coverage,
            "unmapped": len(prof[b1].unmapped),
            "heldout_median_rel": float(np.median(held_rel)),
            "heldout_median_rel_big": float(np.median(held_rel[big1])),
            "heldout_time_weighted_rel": float(np.abs(held_pred[timed1] - y1[timed1]).sum() / y1[timed1].sum()),
            "cross_median_rel": float(np.median(cross_rel)),
            "cross_median_rel_big": float(np.median(cross_rel[big2])),
            "cross_sum_rel": float(abs(cross[timed2].sum() - y2[timed2].sum()) / y2[timed2].sum()),
            "cross_sources": sources,
            "pred_step_b1": pred_step1, "meas_step_b1": meas_step1,
            "step_rel_b1": float(_rel(pred_step1, meas_step1)),
            "pred_step_b2": pred_step2, "meas_step_b2": meas_step2,
            "step_rel_b2": float(_rel(pred_step2, meas_step2)),
            "executor_gap_us": gap * 1e6, "step_overhead_ms": overhead * 1e3,
            "makespan_b1": same.makespan, "makespan_b2": placed.makespan,
            "executed_b1": executed1, "executed_b2": executed2,
            "seconds": time.perf_counter() - t0,
        }
        worst = (m2[timed2].assign(pred=cross[timed2], err=cross[timed2] - y2[timed2])
                 .groupby("op_type").agg(ops=("err", "size"), measured_ms=("seconds", "sum"),
                                         predicted_ms=("pred", "sum"))
                 .assign(measured_ms=lambda d: d.measured_ms * 1e3,
                         predicted_ms=lambda d: d.predicted_ms * 1e3)
                 .sort_values("measured_ms", ascending=False).head(8))
        print(f"\n[{name}] batch {b2} predicted from batch {b1}, by op type (largest first):")
        print(worst.round(2).to_string())
        rows.append(row)
    return rows


def part_b(cluster, repeats):
    """Transfer times between the two tasks of a local cluster, fitted per link."""
    import costmodel
    from fddps.tf.comm_bench import measure_transfers, summarize

    df = measure_transfers(cluster.devices, repeats=repeats, target=cluster.target,
                           cpu_pids=cluster.pids if os.path.isdir("/proc/self") else None)
    fit = costmodel.LinkModel().fit(df)
    if "cpu_seconds" in df.columns:
        # What fddps.Cluster.transfer_compute stands for: CPU time both tasks
        # spend per second of transfer (summed: the counters tick every 10 ms).
        sums = df.groupby(["src", "dst"])[["cpu_seconds", "seconds"]].sum()
        share = sums["cpu_seconds"] / sums["seconds"]
        fit.links_["cpu_per_transfer_second"] = share.to_numpy()
        print("\n[links] CPU seconds the two tasks spend per second of transfer: "
              + ", ".join(f"{v:.2f}" for v in share))
    print("\n[links] median transfer time per size (s) and effective bandwidth:")
    print(summarize(df).assign(src=lambda d: d.src.str.extract(r"task:(\d)")[0],
                               dst=lambda d: d.dst.str.extract(r"task:(\d)")[0]).to_string(index=False))
    print("\n[links] fitted seconds = latency + bytes / bandwidth:")
    print(fit.links_.assign(latency_ms=lambda d: d.latency * 1e3,
                            bandwidth_GBps=lambda d: d.bandwidth / 1e9)
          [["src", "dst", "latency_ms", "bandwidth_GBps", "r2", "n"]].round(4).to_string(index=False))
    return df, fit


def part_c(cluster, transfers, models, batch, image_size, steps, rounds,
           algorithms=("fddps", "fddps:single_device_guard=False")):
    """Predicted vs measured step of graphs placed on the 2 tasks.

    Round 0 profiles the step on task 0 alone and places the graph with a model
    fitted to it, once per algorithm. Every round then profiles task 0 again and
    runs the one-task and every two-task placement step by step in turns, so
    that the profile and the measured steps see the same load. The prediction
    is the FIFO replay (``fddps.simulate``, the order TensorFlow's executor
    follows) of each placement under the model fitted to all rounds' profiles,
    plus the profile's step overhead (median step minus the sum of its op
    times). It is made twice: as the model has it, with the two CPU tasks
    spending each transfer's time themselves (``Cluster.transfer_compute = 1``),
    and with contention-free links (``transfer_compute = 0``, how the
    scheduling literature models links), to show what that part of the model is
    worth. The default algorithms are FD-DPS, which may keep everything on one
    task when transfers cost more than they save, and FD-DPS without that
    guard, so that a placement really spread over both tasks is measured.
    """
    import tensorflow as tf

    import costmodel
    import fddps
    import slim_models
    from fddps.algorithms import parse_algorithm
    from fddps.tf import op_table, place, read_graph_def
    from fddps.tf.profiling import profile

    tf1 = tf.compat.v1
    rows = []
    base = costmodel.CostModel({"CPU": costmodel.cpu_preset(1)},
                               {**costmodel.DEFAULT_LINK_RULES, "cross_host:*": "grpc-loopback"})
    for name in models:
        t0 = time.perf_counter()
        m = slim_models.build_training_graph(name, batch_size=batch, image_size=image_size,
                                             num_classes=10)
        fetch = m.train_op.name
        table = op_table(m.graph_def)
        one = place(m.graph_def, [cluster.devices[0]], algorithm="single", fetches=[fetch])
        g = tf.Graph()
        with g.as_default():
            tf1.import_graph_def(one.graph_def, name="")

        def profile_task0():
            return profile(graph=g, fetches=[fetch], init=m.init_op.name, steps=steps, warmup=1,
                           target=cluster.target, meta={"model": name, "batch": batch})

        def fit(profiles):
            merged = costmodel.merge_profiles(profiles)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", costmodel.ProfileCoverageWarning)
                return merged, costmodel.fit_cost_model(merged.join(table), transfers=transfers,
                                                        base=base, graph=merged.meta["graph"])

        profiles = [profile_task0()]
        _, cm0 = fit(profiles)
        placements = {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", costmodel.ProfileCoverageWarning)
            for spec in algorithms:
                algo, options = parse_algorithm(spec)
                placements[spec] = place(m.graph_def, cluster.devices, cost_model=cm0,
                                         algorithm=algo, fetches=[fetch], enforce_order=False,
                                         **options)
        t_single, t_placed = [], {spec: [] for spec in algorithms}
        for r in range(rounds):
            if r:
                profiles.append(profile_task0())
            times = interleaved_step_times([one.graph_def] + [p.graph_def for p in placements.values()],
                                fetch, m.init_op.name, cluster.target, steps)
            t_single += times[0]
            for spec, t in zip(algorithms, times[1:]):
                t_placed[spec] += t
        merged, cm = fit(profiles)
        print(f"\n[{name} on task 0, {rounds} rounds] " + merged.report())
        overhead = merged.step_overhead_seconds
        meas1 = float(np.median(t_single))
        for spec, placed in placements.items():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", costmodel.ProfileCoverageWarning)
                graph, _ = read_graph_def(m.graph_def, cm, placed.cluster, fetches=[fetch])
            # The devices TensorFlow was told to use, read back from the placed GraphDef.
            c = placed.cluster
            names = list(c.names)
            dev_of = np.array([c.device_index(placed.devices[n]) for n in graph.names])
            free = fddps.Cluster(c.devices, bandwidth=c.bandwidth, latency=c.latency)
            replay2 = fddps.simulate(graph, c, [names[k] for k in dev_of])
            replay2_free = fddps.simulate(graph, free, [names[k] for k in dev_of]).makespan
            replay2_tf = fddps.simulate(graph, c, [names[k] for k in dev_of],
                                        policy="tensorflow").makespan
            replay1 = fddps.simulate(graph, c, [names[0]] * graph.num_ops).makespan
            per_dev = np.bincount(dev_of, minlength=len(names))
            pred, pred_free, pred1 = (replay2.makespan + overhead, replay2_free + overhead,
                                      replay1 + overhead)
            meas = float(np.median(t_placed[spec]))
            cross = dev_of[graph.src] != dev_of[graph.dst]
            tensors = int(replay2.transfers["tensors"].sum()) if len(replay2.transfers) else 0
            rows.append({"model": name, "batch": batch, "algorithm": spec,
                         "pred_step": pred, "meas_step": meas, "step_rel": float(_rel(pred, meas)),
                         "pred_step_contention_free": pred_free,
                         "pred_step_tf_policy": replay2_tf + overhead,
                         "step_rel_tf_policy": float(_rel(replay2_tf + overhead, meas)),
                         "step_rel_contention_free": float(_rel(pred_free, meas)),
                         "pred_single": pred1, "meas_single": meas1,
                         "single_rel": float(_rel(pred1, meas1)),
                         "pred_speedup": pred1 / pred, "meas_speedup": meas1 / meas,
                         "schedule_makespan": placed.makespan,
                         "ops_per_device": per_dev.tolist(), "cross_edges": int(cross.sum()),
                         "tensors_sent": tensors, "cross_bytes": float(graph.bytes[cross].sum()),
                         "step_overhead_ms": overhead * 1e3, "replay_two_tasks": replay2.makespan,
                         "replay_one_task": replay1, "measured_placed": t_placed[spec],
                         "measured_single": t_single, "seconds": time.perf_counter() - t0})
            print(f"[{name}] {spec} on 2 tasks ({per_dev.tolist()} ops, {tensors} tensors sent, "
                  f"{graph.bytes[cross].sum() / 1e6:.1f} MB): predicted {pred * 1e3:.1f} ms "
                  f"(contention-free links: {pred_free * 1e3:.1f} ms; TensorFlow's depth-first "
                  f"executor order: {(replay2_tf + overhead) * 1e3:.1f} ms), measured median "
                  f"{meas * 1e3:.1f} ms over {len(t_placed[spec])} steps ({_rel(pred, meas):.1%}); "
                  f"one task: predicted {pred1 * 1e3:.1f} ms, measured {meas1 * 1e3:.1f} ms "
                  f"({_rel(pred1, meas1):.1%}); speed-up predicted {pred1 / pred:.2f}, measured "
                  f"{meas1 / meas:.2f}")
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", default="ABC", help="which parts to run (default ABC)")
    ap.add_argument("--models", nargs="+", default=["resnet50", "inception_v3"])
    ap.add_argument("--b1", type=int, default=8, help="profiled batch size (default 8)")
    ap.add_argument("--b2", type=int, default=16, help="batch size predicted (default 16)")
    ap.add_argument("--image-size", type=int, default=32)
    ap.add_argument("--steps", type=int, default=3, help="traced steps per profiling round")
    ap.add_argument("--rounds", type=int, default=3, help="alternating profiling rounds (part A)")
    ap.add_argument("--repeats", type=int, default=10, help="transfers per size and link (part B)")
    ap.add_argument("--cluster-steps", type=int, default=3,
                    help="profiled and measured steps per round (part C)")
    ap.add_argument("--algorithms", nargs="+",
                    default=["fddps", "fddps:single_device_guard=False"],
                    help="placements measured in part C (name:key=value,...)")
    ap.add_argument("--out", help="write all results as JSON here")
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    print(f"costmodel accuracy: models {args.models}, batch {args.b1} -> {args.b2}, "
          f"images {args.image_size}x{args.image_size}, {args.rounds} rounds x {args.steps} traced "
          f"steps; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    results = {"args": vars(args)}
    if "A" in args.parts:
        results["single_device"] = part_a(args.models, args.b1, args.b2, args.image_size,
                                          args.steps, args.rounds)
    if "B" in args.parts or "C" in args.parts:
        from fddps.tf import local_cluster

        with local_cluster(2, threads_per_worker=1) as cluster:
            transfers, fit = part_b(cluster, args.repeats)
            results["links"] = fit.links_.to_dict(orient="records")
            if "C" in args.parts:
                results["cluster"] = part_c(cluster, transfers, args.models, args.b1,
                                            args.image_size, args.cluster_steps, args.rounds,
                                            args.algorithms)
    print("\n=== summary ===")
    if "single_device" in results:
        df = pd.DataFrame(results["single_device"])
        cols = ["model", "step_ops", "timed", "fused", "pruned", "coverage", "heldout_median_rel",
                "heldout_median_rel_big", "cross_median_rel", "cross_median_rel_big",
                "step_rel_b1", "step_rel_b2"]
        print("A. per-op median relative error (target <= 20%) and single-device step error "
              "(target <= 10%; step_rel_b2 is the held-out batch, step_rel_b1 is in-sample: the "
              "b1 profile calibrates the step overhead):")
        print(df[cols].round(3).to_string(index=False))
        print(df[["model", "pred_step_b2", "meas_step_b2", "pred_step_b1", "meas_step_b1"]]
              .round(4).to_string(index=False))
    if "links" in results:
        print("B. link fits (target R^2 >= 0.95):")
        print(pd.DataFrame(results["links"])[["src", "dst", "latency", "bandwidth", "r2"]]
              .to_string(index=False))
    if "cluster" in results:
        print("C. placed on 2 local_cluster tasks (target within 15%):")
        print(pd.DataFrame(results["cluster"])[["model", "algorithm", "pred_step", "meas_step",
                                                "step_rel", "step_rel_contention_free",
                                                "step_rel_tf_policy",
                                                "pred_single", "meas_single",
                                                "single_rel", "pred_speedup", "meas_speedup"]]
              .round(4).to_string(index=False))
    print(f"total {time.perf_counter() - t_start:.0f} s")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1, default=float)
        print(f"wrote {args.out}")
    return results


if __name__ == "__main__":
    main()
