"""What limits the real-cluster agreement: measured runs replayed with one input of the prediction changed.

``python -m experiments.real_cluster --save-schedules`` keeps every placement
it measured with what it was predicted from (the op graph with its profiled
op times, the devices, the order, the cluster with its fitted link). This
replays them (:func:`experiments.real_cluster.replay`, the simulator that
``place()`` uses) with one input changed at a time, and scores each variant
as ``real_cluster`` does (:func:`experiments.real_cluster.agreement`): rows
and spreads whose predicted speed-up over one worker is within 15% of the
measured one, and the cells with Kendall's tau of at least 0.8. Nothing is
measured again, so each variant answers "what if this input had been
different" against the very steps measured. The variants
(:data:`VARIANTS`):

- ``as_fitted``: the predictions as the run made them (the replay's check);
- ``run_median_latency``: each cell's link latencies replaced by the median
  over the run's cells, per direction: a link fit without the noise of
  fitting it once per cell;
- ``run_median_link``: the same for the whole link fit, per direction:
  latency, bandwidth and the per-transfer CPU cost of concurrent transfers;
- ``cell_link`` (runs made with ``real_cluster --link-history``, which fits
  each cell's link on the measurements of every cell so far): each cell's
  link fitted on its own measurements alone;
- ``profile_matched``: each cell's op times scaled so that the one-worker
  prediction equals the one-worker measurement: a profile taken in the same
  minutes as the measured steps (an oracle no run can have);
- ``symmetric_latency``: the task 1 -> task 0 latency set to the task 0 -> 1
  one. ``comm_bench``'s reference step for a transfer into task 0 (the
  session's master) runs on task 0 alone, so that direction's latency also
  holds a RunGraph call to task 1 that a step using both tasks pays once.

With two or more runs of the same cells, ``remeasured`` scores the measured
speed-ups of the run before (for the first run, the one after) as the
prediction, over the placements both runs made alike: a prediction as good
as measuring again scores this. With two or more runs, each variant also
says how far the same spreads' predicted and measured speed-ups move from
run to run (:func:`spread_over_runs`).

Run::

    python -m experiments.real_cluster_whatif --runs 'RUN1/*.pkl.gz' 'RUN2/*.pkl.gz'
"""

from __future__ import annotations

import argparse
import copy
import glob
import gzip
import pickle
import shlex
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from experiments import common
from experiments import real_cluster as rc


def _clusters(entry):
    return [k for k in ("cluster", "cpu_cluster") if entry.get(k) is not None]


def _set_link(entry, **link):
    """Every cluster of ``entry`` with the given link fields replaced (``Cluster`` copies them)."""
    for k in _clusters(entry):
        entry[k] = entry[k].replace(**link)


def _run_median(cells, fields):
    """Each cell's link ``fields`` (of ``latency``, ``bandwidth``, ``transfer_cpu``), per
    direction, set to the median over the cells."""
    # Every placement of a cell was predicted on that cell's one fitted link.
    fitted = [cell[0]["cluster"] for cell in cells if cell and cell[0].get("cluster") is not None]
    if not fitted:
        return

    def median(arrays):
        return np.median(np.asarray(arrays, dtype=np.float64), axis=0)

    link = {}
    for name in fields:
        values = [getattr(c, name) for c in fitted]
        if name != "transfer_cpu":
            link[name] = median(values)
        elif all(v is not None for v in values):
            link[name] = (median([v[0] for v in values]), median([v[1] for v in values]))
    for cell in cells:
        for e in cell:
            _set_link(e, **link)


def run_median_latency(cells):
    """Each cell's link latencies, per direction, set to the median over the cells."""
    _run_median(cells, ("latency",))


def run_median_link(cells):
    """Each cell's whole link fit, per direction, set to the median over the cells: latency,
    bandwidth and the per-transfer CPU cost of concurrent transfers."""
    _run_median(cells, ("latency", "bandwidth", "transfer_cpu"))


def cell_link(cells, folder):
    """Each cell's link fitted on that cell's own measurements alone, for runs made with
    ``real_cluster --link-history FOLDER`` (which placed them with the link fitted on every
    cell's so far): cell ``k`` of the folder is the one whose rows say ``link_cells = k + 1``."""
    from fddps.tf.comm_bench import fit_links, fit_transfer_cpu

    one = pd.read_csv(Path(folder) / "transfers.csv")
    many = pd.read_csv(Path(folder) / "concurrent.csv")
    for cell in cells:
        k = int(cell[0]["row"]["link_cells"]) - 1
        links = fit_links(one[one.cell == k]).links_
        cpu = fit_transfer_cpu(many[many.cell == k])
        n = len(cell[0]["cluster"].devices)
        latency, bandwidth = np.zeros((n, n)), np.full((n, n), np.inf)
        cpu_latency, cpu_bandwidth = np.zeros((n, n)), np.full((n, n), np.inf)
        for r in links.itertuples():
            latency[r.src, r.dst], bandwidth[r.src, r.dst] = r.latency, r.bandwidth
        for r in cpu.itertuples():
            cpu_latency[r.src, r.dst], cpu_bandwidth[r.src, r.dst] = r.cpu_latency, r.cpu_bandwidth
        for e in cell:
            _set_link(e, latency=latency, bandwidth=bandwidth,
                      transfer_cpu=(cpu_latency, cpu_bandwidth))


def profile_matched(cells):
    """Each cell's op times scaled by its one-worker step, measured over predicted."""
    for cell in cells:
        single = next((e["row"] for e in cell if e["row"]["algorithm"] == "single"), None)
        if single is None:
            continue
        scale = single["measured"] / single["predicted_executor"]
        for e in cell:
            g = copy.copy(e["graph"])
            g.cost = np.asarray(g.cost, dtype=np.float64) * scale
            e["graph"] = g


def symmetric_latency(cells):
    """The latency from task 1 to task 0 set to the one from task 0 to task 1."""
    for cell in cells:
        for e in cell:
            for k in _clusters(e):
                latency = np.array(e[k].latency, dtype=np.float64)
                latency[1, 0] = latency[0, 1]
                e[k] = e[k].replace(latency=latency)


#: Variant name -> what it changes in a run's cells (each a list of saved entries): it
#: replaces entries' values (a copied graph, ``Cluster.replace``), never mutates them.
VARIANTS = {"as_fitted": lambda cells: None,
            "run_median_latency": run_median_latency,
            "run_median_link": run_median_link,
            "profile_matched": profile_matched,
            "symmetric_latency": symmetric_latency}


def load_run(pattern: str) -> list:
    """The cells of one run: one list of saved entries per ``--save-schedules`` file."""
    paths = sorted(glob.glob(pattern))
    if not paths:
        raise SystemExit(f"no saved schedules match {pattern!r}")
    return [pickle.load(gzip.open(p)) for p in paths]


def score(df: pd.DataFrame) -> dict:
    """``real_cluster``'s scores of ``predicted_executor``: rows and spreads within 15%,
    the spreads' median predicted over measured speed-up, cells with tau >= 0.8."""
    a = rc.agreement(df)
    s = rc.measured_speedups(df)
    spreads = s[s.transfers > 0]
    q = spreads.predicted / spreads.measured
    return dict(rows_within_15=int(round((a["predicted_executor:within_15"] * a.rows).sum())),
                rows=int(a.rows.sum()),
                spreads_within_15=int(((q - 1).abs() <= 0.15).sum()), spreads=len(spreads),
                spreads_predicted_over_measured=float(q.median()),
                cells_tau_08=int((a["predicted_executor:tau"] >= 0.8).sum()), cells=len(a))


def remeasured(df: pd.DataFrame, other: pd.DataFrame) -> dict:
    """The other run's measured speed-ups scored as the prediction of this run's, over the
    placements both made alike (same transfers; the one-worker rows and ``single`` too)."""
    both = rc.measured_speedups(df).merge(rc.measured_speedups(other), on=rc.SAME_PLACEMENT,
                                          suffixes=("", "_other"))
    close = (both.measured_other / both.measured - 1).abs() <= 0.15
    spreads = both.transfers > 0
    taus = []
    for _, g in both.groupby(["model", "batch"]):
        x = pd.concat([g.measured, pd.Series([1.0])], ignore_index=True)  # with `single`
        y = pd.concat([g.measured_other, pd.Series([1.0])], ignore_index=True)
        taus.append(x.corr(y, method="kendall"))
    return dict(rows_within_15=int(close.sum()), rows=len(both),
                spreads_within_15=int(close[spreads].sum()), spreads=int(spreads.sum()),
                spreads_predicted_over_measured=float(
                    (both.measured_other / both.measured)[spreads].median()),
                cells_tau_08=int((np.asarray(taus) >= 0.8).sum()), cells=len(taus))


def spread_over_runs(dfs: dict) -> dict:
    """How far the same spreads' speed-ups move from run to run: over the spreads that every
    run made alike, the median standard deviation (over the runs) of the log of the predicted
    speed-up (``predicted_sd_over_runs``) and of the measured one (``measured_sd_over_runs``).

    Parameters
    ----------
    dfs : dict
        Run label -> that run's rows (:func:`experiments.real_cluster.replay`), two or more.

    Returns
    -------
    dict
        The two figures, and ``spreads_in_every_run``.
    """
    both = None
    for k, df in enumerate(dfs.values()):
        s = rc.measured_speedups(df)
        s = s[s.transfers > 0][rc.SAME_PLACEMENT + ["predicted", "measured"]].rename(
            columns={"predicted": f"predicted_{k}", "measured": f"measured_{k}"})
        both = s if both is None else both.merge(s, on=rc.SAME_PLACEMENT)
    out = dict(spreads_in_every_run=len(both))
    for what in ("predicted", "measured"):
        logs = np.log(both[[f"{what}_{k}" for k in range(len(dfs))]].to_numpy(dtype=np.float64))
        out[f"{what}_sd_over_runs"] = (float(np.median(logs.std(axis=1, ddof=1)))
                                       if len(both) else np.nan)
    return out


def whatif(runs: dict, variants=tuple(VARIANTS), link_history=None) -> pd.DataFrame:
    """Score every variant on every run.

    Parameters
    ----------
    runs : dict
        Run label -> its cells (:func:`load_run`).
    variants : sequence of str
        Names in :data:`VARIANTS`, or ``cell_link`` (:func:`cell_link`; needs ``link_history``).
    link_history : str or Path, optional
        The runs' ``real_cluster --link-history`` folder.

    Returns
    -------
    pandas.DataFrame
        One row per run and variant (``remeasured`` too, with two or more runs,
        against the run before it):
        ``run``, ``variant`` and :func:`score`'s columns; with two or more runs,
        :func:`spread_over_runs`'s columns per variant.
    """
    known = dict(VARIANTS)
    if link_history is not None:
        known["cell_link"] = lambda cells: cell_link(cells, link_history)
    unknown = [name for name in variants if name not in known]
    if unknown:
        raise SystemExit(f"unknown variant(s) {unknown}; choose from {sorted(known)}"
                         + ("" if link_history else " (cell_link needs --link-history)"))
    rows, by_variant = [], {name: {} for name in variants}
    for label, cells in runs.items():
        for name in variants:
            # A variant replaces an entry's graph or clusters, never changes them in place:
            # copies of the entries keep the run as loaded for the next variant.
            changed = [[dict(entry) for entry in cell] for cell in cells]
            known[name](changed)
            df = pd.concat([rc.replay(cell) for cell in changed], ignore_index=True)
            by_variant[name][label] = df
            rows.append(dict(run=label, variant=name, **score(df)))
            print(rows[-1], flush=True)
    if len(runs) > 1:
        moved = {name: spread_over_runs(dfs) for name, dfs in by_variant.items()}
        for row in rows:
            row.update(moved[row["variant"]])
    replayed = by_variant.get("as_fitted", {})
    labels = list(replayed)
    for k, label in enumerate(labels if len(labels) > 1 else []):
        # The run before it (the first run: the one after), as two runs in a row compare.
        other = replayed[labels[k - 1] if k else labels[1]]
        rows.append(dict(run=label, variant="remeasured", **remeasured(replayed[label], other)))
        print(rows[-1], flush=True)
    return pd.DataFrame(rows)


def plot(df: pd.DataFrame, path):
    """Spreads within 15% and cells with tau >= 0.8, per variant, one bar per run; with two
    or more runs, how far each variant's predictions move between runs."""
    plt = common.matplotlib_agg()
    variants = list(dict.fromkeys(df.variant))
    runs = list(dict.fromkeys(df.run))
    moved = (df.dropna(subset=["predicted_sd_over_runs"]) if "predicted_sd_over_runs" in df
             else df.iloc[:0])
    fig, axes = plt.subplots(1, 3 if len(moved) else 2, figsize=(16 if len(moved) else 11, 3.8))
    width = 0.8 / max(len(runs), 1)
    for ax, (col, of, title) in zip(axes, [("spreads_within_15", "spreads", "spreads within 15%"),
                                           ("cells_tau_08", "cells", "cells with tau >= 0.8")]):
        for k, run in enumerate(runs):
            d = df[df.run == run].set_index("variant").reindex(variants)
            ax.bar(np.arange(len(variants)) + k * width, d[col] / d[of], width, label=run)
        ax.set_xticks(np.arange(len(variants)) + width * (len(runs) - 1) / 2)
        ax.set_xticklabels(variants, rotation=20, ha="right")
        ax.set_ylim(0, 1)
        ax.axhline(0.8, color="grey", lw=0.8, ls="--")
        ax.set_title(title)
    axes[0].legend(fontsize=8)
    if len(axes) == 3:
        per_variant = moved.groupby("variant", sort=False).first()
        axes[2].bar(np.arange(len(per_variant)), per_variant.predicted_sd_over_runs, 0.6,
                    color="tab:grey", label="predicted")
        axes[2].axhline(per_variant.measured_sd_over_runs.iloc[0], color="tab:red", lw=1.2,
                        label="measured")
        axes[2].set_xticks(np.arange(len(per_variant)))
        axes[2].set_xticklabels(per_variant.index, rotation=20, ha="right")
        axes[2].set_ylim(0, 1.25 * max(per_variant.predicted_sd_over_runs.max(),
                                       per_variant.measured_sd_over_runs.iloc[0]))
        axes[2].set_title("a spread's speed-up, run to run (sd of log)")
        axes[2].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


WHAT = ("Each run's saved placements replayed by `place()`'s simulator with one input changed "
        "(`variant`), scored as `experiments.real_cluster` scores a run: `rows_within_15` of "
        "`rows` and `spreads_within_15` of `spreads` (placements that use both workers) with "
        "a predicted speed-up over one worker within 15% of the measured one; "
        "`spreads_predicted_over_measured`, their median ratio; `cells_tau_08` of `cells` with "
        "Kendall's tau of at least 0.8. `remeasured`: the measured speed-ups of the run before "
        "(for the first run, the one after) as the prediction, over the placements both runs "
        "made alike. With two or more runs, `predicted_sd_over_runs` and `measured_sd_over_runs`: "
        "over the `spreads_in_every_run` that every run made alike, the median standard "
        "deviation over the runs of the log of the predicted and of the measured speed-up.")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", nargs="+", required=True, metavar="GLOB",
                        help="one glob per run, of its --save-schedules files (quote it)")
    parser.add_argument("--labels", nargs="+", default=None,
                        help="a label per run (default: the glob's folder)")
    parser.add_argument("--variants", nargs="+", default=None,
                        choices=list(VARIANTS) + ["cell_link"],
                        help="default: all; with --link-history, cell_link too")
    parser.add_argument("--link-history", default=None, metavar="FOLDER",
                        help="the runs' real_cluster --link-history folder: adds cell_link "
                             "(each cell's link fitted on its own measurements)")
    parser.add_argument("--out", default=str(common.RESULTS / "real_cluster_whatif.csv"))
    args = parser.parse_args(argv)
    labels = args.labels or [Path(p).parent.name or p for p in args.runs]
    if len(labels) != len(args.runs) or len(set(labels)) != len(labels):
        parser.error("--labels needs one distinct label per run")
    common.tf_quiet()
    variants = args.variants or list(VARIANTS) + (["cell_link"] if args.link_history else [])
    df = whatif({label: load_run(p) for label, p in zip(labels, args.runs)}, variants,
                link_history=args.link_history)
    out = common.save_csv_and_plot(df, args.out, plot)
    command = "python -m experiments.real_cluster_whatif " + shlex.join(
        sys.argv[1:] if argv is None else argv)
    common.write_results_page(out, "What limits the real-cluster agreement", WHAT, df,
                              command=command, after=f"![]({out.with_suffix('.png').name})")
    print(df.to_string(index=False))
    return df


if __name__ == "__main__":
    main()
