"""Measure transfer times between TensorFlow devices, to fit each link's latency and bandwidth.

For each ordered pair of devices ``(src, dst)`` and each size ``b``, a
resource variable of ``b`` bytes lives on ``src``; one step slices its first
element **on ``dst``** (so the whole tensor crosses the link, and the slice
itself costs next to nothing); the reference step slices, on ``dst``, a
variable of the same size that lives on ``dst`` (no transfer, and the result
reaches the client by the same way). Both steps are run alternately ``repeats`` times; the transfer time
of a repeat is the difference of the two steps' wall times, which cancels the
``Session.run`` overhead both share. :class:`costmodel.LinkModel` then fits
``seconds = latency + bytes / bandwidth`` per link (paper Definition 4) and
reports R².

Between the tasks of a cluster the reference step runs on ``dst``'s task
alone. For a transfer into the session's own task (task 0 of a
``local_cluster``), the difference therefore also holds the RunGraph call
to ``src``'s task, which a step using both tasks pays once: measured here,
a 4-byte transfer from task 1 to task 0 took 685 us this way and 123 us
with both steps using both tasks (``python -m
experiments.comm_reference_bias``). The simulator's predictions of split
steps are scored with the latency measured this way; see the docs'
real-cluster results ("What limits the agreement").

Works for the devices of one process (``ConfigProto(device_count={"CPU": 2})``,
GPUs) and for the tasks of a ``local_cluster`` (pass its ``target``).

Example
-------
>>> from fddps.tf import local_cluster                          # doctest: +SKIP
>>> with local_cluster(2) as c:                                 # doctest: +SKIP
...     df = measure_transfers(c.devices, target=c.target)
>>> costmodel.LinkModel().fit(df).links_                        # doctest: +SKIP
"""

from __future__ import annotations

import itertools
import os
import time

import numpy as np
import pandas as pd

from ..errors import FddpsError
from .graphdef import _tf

#: Default transfer sizes in bytes: 4 B to 24 MB. Above 32 MB, transfers between
#: two local_cluster tasks get slower per byte (glibc serves allocations of 32 MB
#: and more with fresh mmap'ed pages, so every step pays page faults on both ends),
#: a second regime one straight line cannot fit; ResNet-50's and Inception-V3's
#: largest tensors at the batch sizes profiled here stay below it.
DEFAULT_SIZES = (4, 64, 1024, 16384, 262144, 1 << 20, 4 << 20, 8 << 20, 16 << 20, 24 << 20)
#: Sizes and counts of the concurrent measurement :func:`fit_transfer_cpu` fits: the
#: sizes of most tensors a split step sends, 8 to 128 at once (a split step has
#: hundreds in flight). Measured three times each between the local_cluster tasks,
#: counts (1, 8, 32) fitted 82-134 us per transfer, (8, 32, 128) 72-90 us.
CONCURRENT_SIZES = (64, 16384, 262144, 1 << 20)
CONCURRENT_COUNTS = (8, 32, 128)


def _cpu_seconds(pids) -> float:
    """User + system CPU seconds the processes ``pids`` have used (Linux ``/proc``)."""
    total = 0.0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def measure_transfers(devices, sizes=DEFAULT_SIZES, *, repeats: int = 10, warmup: int = 2,
                      pairs=None, target: str = "", session_config=None,
                      progress: bool = True, cpu_pids=None, counts=(1,)) -> pd.DataFrame:
    """Time transfers of each size between each ordered pair of ``devices``.

    Parameters
    ----------
    devices : sequence of str
        TensorFlow device names (at least 2).
    sizes : sequence of int
        Bytes per transfer (rounded down to whole float32 elements, at least one).
    repeats : int
        Measured transfers per pair and size (after ``warmup`` unmeasured ones).
    pairs : sequence of (src, dst), optional
        Pairs to measure; default every ordered pair of distinct devices.
    target : str
        Session target (``local_cluster(...).target`` for gRPC links).
    session_config : tf.compat.v1.ConfigProto, optional
        E.g. ``ConfigProto(device_count={"CPU": 2})`` for two local CPU devices.
    progress : bool
        Show a tqdm progress bar.
    cpu_pids : sequence of int, optional
        Processes whose CPU time to count (the ``local_cluster`` workers'
        ``pids``; Linux only): adds ``cpu_seconds``, the CPU time they spent
        in the transfer step minus the reference step. It comes in clock ticks
        (10 ms), so only sums over many transfers mean something:
        ``sum(cpu_seconds) / sum(seconds)`` is the share of a transfer's time
        the devices spend on it (``fddps.Cluster.transfer_compute``).
    counts : sequence of int
        Transfers of each size moved at once in one step (default one): with
        several counts, :func:`fit_transfer_cpu` fits what one more concurrent
        transfer costs. :func:`fit_links` fits the ``count == 1`` rows.

    Returns
    -------
    pandas.DataFrame
        One row per measured step: ``src``, ``dst``, ``bytes``, ``count``, ``repeat``,
        ``seconds`` (transfer step minus reference step; may be slightly
        negative for tiny sizes, from noise), ``step_seconds``, ``reference_seconds``
        (and ``cpu_seconds`` with ``cpu_pids``).

    Raises
    ------
    FddpsError
        For fewer than two devices, bad sizes or repeats, or a device the
        session does not have (TensorFlow's message is kept).
    """
    from tqdm.auto import tqdm

    tf = _tf()
    tf1 = tf.compat.v1
    devices = list(devices)
    if pairs is None:
        if len(devices) < 2:
            raise FddpsError(f"measuring transfers needs at least 2 devices, got {devices}")
        pairs = list(itertools.permutations(devices, 2))
    pairs = [(str(a), str(b)) for a, b in pairs]
    sizes = [int(s) for s in sizes]
    counts = [int(k) for k in counts]
    if not sizes or min(sizes) < 1 or repeats < 1 or warmup < 0 or not counts or min(counts) < 1:
        raise FddpsError(f"need sizes >= 1 byte, counts >= 1, repeats >= 1 and warmup >= 0 "
                         f"(got sizes={sizes}, counts={counts}, repeats={repeats}, warmup={warmup})")
    graph = tf.Graph()
    steps = []  # (src, dst, bytes, count, transfer fetch, reference fetch)
    with graph.as_default():
        for p, (src, dst) in enumerate(pairs):
            for s, nbytes in enumerate(sizes):
                n = max(1, nbytes // 4)
                for count in counts:
                    moved, reference = [], []
                    for j in range(count):
                        tag = f"{p}_{s}_{count}_{j}"
                        with tf1.device(src):
                            var = tf1.get_variable(f"buf_{tag}", [n], tf.float32, use_resource=True,
                                                   initializer=tf1.zeros_initializer())
                            value = var.read_value()
                        with tf1.device(dst):
                            moved.append(tf.slice(value, [0], [1], name=f"transfer_{tag}"))
                            # The same step with the data already on dst: the result
                            # travels to the client from the same task in both steps.
                            local = tf1.get_variable(f"ref_{tag}", [n], tf.float32,
                                                     use_resource=True,
                                                     initializer=tf1.zeros_initializer())
                            reference.append(tf.slice(local.read_value(), [0], [1],
                                                      name=f"reference_{tag}"))
                    with tf1.device(dst):  # one small result either way
                        moved = moved[0] if count == 1 else tf.add_n(moved)
                        reference = reference[0] if count == 1 else tf.add_n(reference)
                    steps.append((src, dst, 4 * n, count, moved, reference))
        init = tf1.global_variables_initializer()
    rows = []
    bar = tqdm(total=len(steps) * (warmup + repeats), desc="transfers", unit="pair-size",
               disable=not progress, leave=False)
    try:
        with tf1.Session(target, graph=graph, config=session_config) as sess:
            sess.run(init)
            rng = np.random.default_rng(0)
            for r in range(-warmup, repeats):
                # A fresh random order every round: a burst of load from another
                # process then hits all sizes alike instead of biasing a few.
                for k in rng.permutation(len(steps)):
                    src, dst, nbytes, count, moved, reference = steps[k]
                    c0 = _cpu_seconds(cpu_pids) if cpu_pids else 0.0
                    t0 = time.perf_counter()
                    sess.run(moved)
                    t1 = time.perf_counter()
                    c1 = _cpu_seconds(cpu_pids) if cpu_pids else 0.0
                    sess.run(reference)
                    t2 = time.perf_counter()
                    c2 = _cpu_seconds(cpu_pids) if cpu_pids else 0.0
                    bar.update()
                    if r >= 0:
                        rows.append((src, dst, nbytes, count, r, (t1 - t0) - (t2 - t1), t1 - t0,
                                     t2 - t1, (c1 - c0) - (c2 - c1)))
    except (tf.errors.OpError, ValueError) as e:
        msg = getattr(e, "message", str(e)).splitlines()[0]
        raise FddpsError(f"measuring transfers between {pairs[0][0]!r} and {pairs[0][1]!r}... "
                         f"failed: {msg}") from None
    finally:
        bar.close()
    df = pd.DataFrame(rows, columns=["src", "dst", "bytes", "count", "repeat", "seconds",
                                     "step_seconds", "reference_seconds", "cpu_seconds"])
    return df if cpu_pids else df.drop(columns="cpu_seconds")


def fit_links(transfers: pd.DataFrame):
    """Fit each measured link (a :class:`costmodel.LinkModel`) on the one-at-a-time
    transfers (``count == 1``); its ``links_`` has R² per link."""
    import costmodel

    if "count" in transfers.columns:
        transfers = transfers[transfers["count"] == 1]
    return costmodel.LinkModel().fit(transfers)


def fit_transfer_cpu(transfers: pd.DataFrame) -> pd.DataFrame:
    """What one more concurrent transfer costs the end devices, per link: ``cpu_latency + bytes / cpu_bandwidth``.

    gRPC overlaps the waiting of transfers in flight together, so the step
    grows by less per extra transfer than one transfer takes alone; what it
    does grow by is the tasks' own work (serialising, copying, parsing, the
    RPC's bookkeeping) at the busier end. For each link and size, the slope of
    the median step over the counts is that marginal cost; a straight line
    through them over the sizes (least squares, intercept and slope floored
    at 0) gives ``cpu_latency`` and ``cpu_bandwidth``
    (:meth:`fddps.Cluster.with_transfer_cpu`).

    Parameters
    ----------
    transfers : pandas.DataFrame
        :func:`measure_transfers` rows with at least two counts per link and size.

    Returns
    -------
    pandas.DataFrame
        ``src, dst, cpu_latency, cpu_bandwidth`` (inf when the cost does not
        grow with the bytes) and ``marginal`` (``{bytes: seconds}``) per link.

    Raises
    ------
    FddpsError
        If a link or size was measured at fewer than two counts, or no link at all.

    Examples
    --------
    >>> rows = [dict(src="a", dst="b", bytes=b, count=k, seconds=1e-3 + k * (5e-5 + b / 1e9))
    ...         for b in (64, 1 << 20) for k in (1, 8, 32)]
    >>> fit = fit_transfer_cpu(pd.DataFrame(rows))
    >>> round(float(fit.cpu_latency[0]) * 1e6, 1), round(float(fit.cpu_bandwidth[0]) / 1e9, 3)
    (50.0, 1.0)
    """
    if transfers.empty or "count" not in transfers.columns:
        raise FddpsError("fitting the per-transfer CPU cost needs measure_transfers(..., counts=...) rows")
    out = []
    for (src, dst), link in transfers.groupby(["src", "dst"], sort=False):
        marginal = {}
        for nbytes, rows in link.groupby("bytes"):
            med = rows.groupby("count")["seconds"].median()
            if len(med) < 2:
                raise FddpsError(f"link {src} -> {dst}, {nbytes} bytes: measured at "
                                 f"{len(med)} count(s); the marginal cost needs two or more")
            marginal[int(nbytes)] = max(0.0, float(np.polyfit(med.index.to_numpy(float),
                                                              med.to_numpy(float), 1)[0]))
        b = np.array(list(marginal), dtype=np.float64)
        m = np.array(list(marginal.values()))
        per_byte, fixed = np.polyfit(b, m, 1) if len(b) > 1 else (0.0, m[0])
        if fixed < 0:  # through the origin instead
            fixed, per_byte = 0.0, float(np.dot(b, m) / np.dot(b, b))
        # A slope that adds nothing measurable at the largest size is none (rounding).
        per_byte = float(per_byte) if per_byte * b.max() > 1e-9 * max(m.max(), 1e-12) else 0.0
        out.append(dict(src=src, dst=dst, cpu_latency=float(fixed),
                        cpu_bandwidth=1.0 / per_byte if per_byte > 0 else np.inf,
                        marginal=marginal))
    if not out:
        raise FddpsError("no link measured")
    return pd.DataFrame(out)


def summarize(transfers: pd.DataFrame) -> pd.DataFrame:
    """Median transfer seconds and effective bandwidth per link and size (for reports)."""
    g = transfers.groupby(["src", "dst", "bytes"])["seconds"].median().reset_index()
    g["bandwidth_GBps"] = np.where(g["seconds"] > 0, g["bytes"] / g["seconds"] / 1e9, np.nan)
    return g
