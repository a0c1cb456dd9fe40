"""The answer of :func:`fddps.tf.place`: :class:`Placement`."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..simulate import executor_policy, peak_memory, simulate
from .split_rewrite import split_node_names


class Placement:
    """The answer of :func:`place`.

    Attributes
    ----------
    graph_def : GraphDef
        The placed graph: every node of the input, same names, inputs and
        attributes, with ``device`` set (plus order control inputs when
        ``enforce_order`` was used). A split op is its combine node; the
        slice, part and constant nodes of the splits follow the input's nodes.
    schedule : Schedule
        Where and when each scheduled op runs (op ``i`` is the ``i``-th scheduled
        node in GraphDef order; with splits, the op graph with the slice and
        part ops appended, named as their GraphDef nodes).
    cluster : Cluster
    ops : pandas.DataFrame
        The op table of the input graph (:func:`fddps.tf.op_table`).
    info : dict
        Facts about reading and scheduling (see :func:`read_graph_def`), plus
        ``place_seconds`` (wall time of :func:`place`) and ``order_edges_added``.
        With ``place(..., verify=...)``, ``verified``: the finalists timed on
        the devices (:func:`fddps.tf.verify.verify_finalists`'s record: each
        finalist's label, predicted and measured step seconds, which was
        returned, rounds, seconds; or ``reason``, why it was not verified).
    finalists : list of (str, Placement)
        While :func:`place` verifies: the placements it times (empty otherwise).
    """

    def __init__(self, graph_def, schedule, cluster, ops, info):
        self.graph_def = graph_def
        self.schedule = schedule
        self.cluster = cluster
        self.ops = ops
        self.info = info
        self.finalists = []

    @property
    def makespan(self) -> float:
        """Predicted step time in seconds (not ms), in the scheduled order."""
        return self.schedule.makespan

    @property
    def executor_makespan(self) -> float:
        """Predicted seconds of one step when TensorFlow orders each device's ops
        itself (:func:`fddps.simulate` with :func:`~fddps.simulate.executor_policy`'s
        executor); with
        order edges (``enforce_order``), the scheduled order run by that executor
        (its workers' sends behind the op after their producer)."""
        return float(self.info.get("executor_makespan", self.schedule.makespan))

    @property
    def splits(self) -> pd.DataFrame:
        """The ops split, one row per op (:func:`fddps.strategy.fddps_splits.decisions_table`,
        like the paper's Table 6); empty when none was."""
        from ..strategy.fddps_splits import decisions_table

        return decisions_table(self.schedule.info.get("splits") or [])

    @property
    def sharded_variables(self) -> dict:
        """Variables written as shards (a strategy split them by their own dimensions):
        name -> :class:`~fddps.tf.variable_shards.ShardedVariable` (each shard's
        name, device and slice); empty when none was. Read their whole values with
        :func:`fddps.tf.variable_shards.gather_variables`."""
        return dict(self.info.get("sharded_variables") or {})

    @property
    def devices(self) -> dict:
        """Node name -> device string, for every node of the GraphDef."""
        return {node.name: node.device for node in self.graph_def.node}

    @property
    def memory(self) -> pd.Series:
        """Sum of persistent + transient bytes of each device's ops, by device: what
        holding every output all step would take (the constraint is
        :attr:`peak_memory`)."""
        return pd.Series(self.schedule.device_memory(), index=list(self.cluster.names),
                         name="memory")

    @property
    def peak_memory(self) -> pd.Series:
        """Predicted highest bytes held at once on each device (outputs freed after use)."""
        s = self.schedule
        peak = peak_memory(s.graph, s.cluster, s.device, s.start, s.finish)
        return pd.Series(peak, index=list(self.cluster.names), name="peak_memory")

    def to_dataframe(self) -> pd.DataFrame:
        """One row per scheduled op: the schedule's columns (``op``, ``device``,
        ``start``, ``finish``, ``duration``, ``op_type``), the op table's
        ``flops``, ``output_bytes``, ``param_bytes``, ``colocation_group``,
        ``requested_device`` (NaN for the slice and part ops of splits) and
        ``split_of`` (the op a slice, part or combine op comes from, else None);
        sorted by start time."""
        df = self.schedule.to_dataframe()
        cols = ["name", "flops", "output_bytes", "param_bytes", "colocation_group",
                "requested_device"]
        extra = self.ops[cols].rename(columns={"name": "op"})
        df = df.merge(extra, on="op", how="left", sort=False)
        origin = {}
        for d in self.schedule.info.get("splits") or []:
            op = d.candidate.op
            origin[op] = op
            origin.update((name, op) for name in split_node_names(d))
        df["split_of"] = [origin.get(op) for op in df["op"]]
        return df

    def summary(self) -> str:
        """A short text report: step time (ms, or s when a second or longer), the devices
        used of those given, per-device load and peak memory (MB), transfers (MB)."""
        s, c, info = self.schedule, self.cluster, self.info
        g = s.graph
        scale, unit = (1e3, "ms") if s.makespan < 1 else (1.0, "s")
        et = g.exec_times(c)
        dur = et[np.arange(g.num_ops), s.device]
        busy = np.bincount(s.device, weights=dur, minlength=c.num_devices)
        counts = np.bincount(s.device, minlength=c.num_devices)
        # A written strategy's graph has parts and slices: one device runs the original step.
        best_single = info.get("single_device_step")
        if best_single is None:
            single = et.sum(axis=0)
            best_single = (float(np.min(single[np.isfinite(single)])) if np.isfinite(single).any()
                           else np.inf)
        cross = s.device[g.src] != s.device[g.dst]
        mem = self.peak_memory.to_numpy()
        written = (f" (the rewrite's {g.num_ops} nodes of the step; the task graph the searches "
                   f"score: {info['expansion_makespan'] * scale:.4g} {unit})"
                   if "expansion_makespan" in info else "")
        used = int((counts > 0).sum())
        verified = info.get("verified") or {}
        why_one = ("measured faster than the finalists spread over several"
                   if verified.get("returned", "") != verified.get("predicted_best", "")
                   else "spreading the step was predicted slower")
        lines = [
            f"fddps placement ({info.get('algorithm', s.algorithm)}): {info['ops']} of "
            f"{info['nodes']} nodes scheduled on {used} of the {c.num_devices} devices given"
            + (f" (all on one device: {why_one})"
               if used == 1 and c.num_devices > 1 else "") + written,
            f"predicted step time {s.makespan * scale:.4g} {unit}"
            + (f"; best single device {best_single * scale:.4g} {unit} "
               f"(speedup {best_single / s.makespan:.2f}x)"
               if s.makespan > 0 and np.isfinite(best_single) else ""),
        ]
        bound = s.info.get("lower_bound")
        if s.info.get("optimal"):
            lines.append("optimal (proven)")
        elif bound and bound > 0:
            lines.append(f"within {s.makespan / bound - 1:.1%} of optimal (lower bound "
                         f"{bound * scale:.4g} {unit})")
        sharing = c.sharing_summary()
        if sharing:
            # The single-device step is the same model's: one device alone gets
            # all of its cores and links; devices sharing them slow each other.
            lines.append("shared hardware (the prediction slows down ops and transfers that "
                         "share it; a device alone runs at full speed):")
            lines += [f"  {line}" for line in sharing]
        executor = self.executor_makespan
        guard = info.get("order_guard", "")
        if guard:
            tf_order, single = info["tf_order_makespan"], info["single_makespan"]
            lines.append(
                f"in the order TensorFlow picks itself ({executor_policy(c)} executor model) "
                f"the step would take "
                f"{tf_order * scale:.4g} {unit}, "
                + ("slower than" if tf_order >= single else "not clearly faster than")
                + f" one device ({single * scale:.4g} {unit}): "
                + ("order control edges make TensorFlow follow the scheduled order "
                   "(enforce_order='auto')" if guard == "enforced order" else
                   f"placed on {c.names[int(s.device[0])] if g.num_ops else '?'} alone "
                   f"(enforce_order='auto'; {info.get('order_guard_reason', '')})"))
        tf_peak = None
        if not guard and abs(executor - s.makespan) > s.makespan * 0.01:
            # The placed file runs in TensorFlow's order: its peaks are that order's
            # (what `fddps simulate` of the file reports).
            tf_peak = simulate(g, c, s.device,
                               policy=executor_policy(c)).peak_memory.to_numpy()
        if guard:
            pass
        elif abs(executor - s.makespan) > s.makespan * 0.01:
            # What the placed file runs (and `fddps simulate` of it predicts).
            lines.append(
                f"in the order TensorFlow picks itself ({executor_policy(c)} executor model; "
                f"what the placed "
                f"graph runs) {executor * scale:.4g} {unit}"
                + (", slower than the best single device" if executor > best_single else "")
                + "; enforce_order=True makes it follow the scheduled order")
        peak_head = f"{'peak MB':>10}" + (f" {'TF order MB':>11}" if tf_peak is not None else "")
        lines += [
            f"{'device':<48} {'ops':>6} {'busy ' + unit:>10} {'util':>6} {peak_head} "
            f"{'capacity MB':>12}",
        ]
        for k, d in enumerate(c.devices):
            util = busy[k] / s.makespan if s.makespan > 0 else 0.0
            peaks = f"{mem[k] / 1e6:>10.4g}" + (f" {tf_peak[k] / 1e6:>11.4g}"
                                                  if tf_peak is not None else "")
            lines.append(f"{d.name:<48} {counts[k]:>6} {busy[k] * scale:>10.4g} {util:>6.0%} "
                         f"{peaks} {d.memory / 1e6:>12.4g}")
        if tf_peak is not None:
            lines.append("peak MB: in the scheduled order; TF order MB: in TensorFlow's own order "
                         "(what the placed graph runs)")
        lines.append(f"transfers: {int(cross.sum())} edges, {g.bytes[cross].sum() / 1e6:.4g} MB "
                     "between devices")
        if "colocation_groups" in info:  # a placement's; a strategy's has no such facts
            lines.append(f"colocation groups {info['colocation_groups']} (largest {info['largest_group']} "
                         f"ops), pinned ops {info['pinned']}, loop frames {len(info['loop_frames'])}, "
                         f"ops with unknown shapes {info['shapes_unknown']}")
        if "search_info" in info:
            from ..search.auto import describe_search

            lines.append(describe_search(info))
        if info.get("kernels_unchecked"):
            lines.append(f"kernels not checked for {info['kernels_unchecked']} (this TensorFlow "
                         "build does not register them)")
        if info.get("splits"):
            table = self.splits
            kinds = ", ".join(f"{n} {t} on {d}" for (t, d), n in
                              table.groupby(["op_type", "dim"]).size().items())
            lines.append(f"intra-op splits: {info['splits']} ops ({kinds}) into "
                         f"{int(table['parts'].sum())} parts; {info['split_nodes_added']} nodes "
                         f"added; predicted step without splits "
                         f"{s.info.get('unsplit_makespan', float('nan')) * scale:.4g} {unit}")
        if info.get("order_edges_added"):
            lines.append(f"order control edges added: {info['order_edges_added']}")
        if info.get("cpu_preset_note"):
            lines.append(info["cpu_preset_note"])
        if info.get("verified"):
            from .verify import describe

            lines += describe(info["verified"], scale, unit)
        lines.append(f"place() took {info['place_seconds']:.3g} s"
                     + (f" (reading {info['read_seconds']:.3g} s)" if "read_seconds" in info else ""))
        return "\n".join(lines)

    def __repr__(self):
        used = len(set(self.schedule.device.tolist()))
        return (f"Placement({self.info['nodes']} nodes on {used} of {self.cluster.num_devices} "
                f"devices, predicted step {self.makespan:.4g} s)")

    def plot(self, path=None, ax=None, critical_path=True, transfers=False, dpi=120):
        """Gantt chart of the schedule (see :func:`fddps.plot.plot_schedule`).

        Parameters
        ----------
        path : str or Path, optional
            Save the chart there (PNG, SVG, PDF: by the suffix).
        ax : matplotlib Axes, optional
            Draw into it (else a new figure).
        critical_path, transfers : bool
            As for :func:`fddps.plot.plot_schedule`.
        dpi : int
            Resolution of a saved raster image.

        Returns
        -------
        matplotlib.figure.Figure
            The chart's figure; in a notebook it shows as the cell's output.
        """
        from ..plot import plot_schedule

        ax = plot_schedule(self.schedule, ax=ax, critical_path=critical_path, transfers=transfers)
        fig = ax.figure
        if path is not None:
            from pathlib import Path

            Path(path).parent.mkdir(parents=True, exist_ok=True)
            fig.savefig(path, dpi=dpi, bbox_inches="tight")
        return fig

    def to_chrome_trace(self, path, transfers=True) -> dict:
        """Write the schedule as a Chrome trace JSON file (see :func:`fddps.trace.to_chrome_trace`)."""
        from ..trace import to_chrome_trace

        return to_chrome_trace(self.schedule, path, transfers=transfers)
