"""Lower bounds on the makespan."""

import numpy as np

from .paths import allowed_devices, bottom_levels


def _once(graph, cluster, bound):
    """``bound(graph, cluster)``, computed once per graph and cluster object and kept
    on the graph (both are read-only): placing a graph asks for the same bound
    several times (the refinement's stop, each schedule's ``info["lower_bound"]``,
    the order guard's one-device schedule)."""
    cache = graph.__dict__.setdefault("_bounds", {})
    kept = cache.get(bound.__name__)
    if kept is None or kept[0] is not cluster:
        kept = cache[bound.__name__] = (cluster, bound(graph, cluster))
    return kept[1]


def lower_bound(graph, cluster) -> float:
    """``max(critical path, total work / total speed)``, transfers ignored.

    The critical path takes every op at its fastest device; the work bound
    spreads every op's cheapest cost over the summed speed of all devices.
    No schedule can beat either.

    Examples
    --------
    >>> from fddps import OpGraph, Cluster
    >>> g = OpGraph(["a", "b", "c"], [2.0, 1.0, 1.0], [("a", "b"), ("a", "c")])
    >>> lower_bound(g, Cluster.homogeneous(2))
    3.0
    """
    return _once(graph, cluster, _lower_bound)


def _lower_bound(graph, cluster) -> float:
    if graph.num_ops == 0:
        return 0.0
    et = graph.exec_times(cluster)
    fastest = np.min(et, axis=1)
    critical_path = float(bottom_levels(graph, fastest, np.zeros(graph.num_edges)).max())
    work = float(np.sum(np.min(et * cluster.speed, axis=1)) / sustained_speed(cluster))
    return max(critical_path, work)


def sustained_speed(cluster, devices=None) -> float:
    """The summed speed ``devices`` (default all) can sustain together.

    A group of devices sharing ``C`` cores (:class:`~fddps.cluster.SharedCores`),
    whose ops want at least ``c`` threads, counts as at most ``C / c`` of its
    fastest device: ops running concurrently get ``sum c_k r_k <= C`` (``r_k``
    each op's rate, at most 1), so the group completes work no faster than
    ``max speed * C / c``. Other devices count their own speed.

    Examples
    --------
    >>> from fddps import Cluster
    >>> from fddps.cluster import SharedCores
    >>> c = Cluster.homogeneous(4, names=["a", "b", "c", "d"])
    >>> sustained_speed(c)
    4.0
    >>> sustained_speed(c.with_sharing([SharedCores(("a", "b", "c", "d"), cores=2, threads=2)]))
    1.0
    """
    devices = range(cluster.num_devices) if devices is None else devices
    total, groups = 0.0, {}
    for k in devices:
        g = int(cluster.core_group[k])
        if g < 0:
            total += float(cluster.speed[k])
        else:
            groups.setdefault(g, []).append(k)
    for g, ks in groups.items():
        speeds = cluster.speed[ks]
        wanted = float(np.min(cluster.threads[ks]))
        alone = float(speeds.sum())
        total += min(alone, cluster.group_cores[g] / wanted * float(speeds.max())) if wanted > 0 \
            else alone
    return total


def communication_lower_bound(graph, cluster) -> float:
    """A makespan bound that counts transfers: at least :func:`lower_bound`.

    Three bounds, each valid for every schedule (any placement and order on
    ``cluster``, with the graph's kernels, pins and colocation as
    :class:`~fddps.algorithms.base.PlacementState` reads them); the largest
    is returned:

    1. :func:`lower_bound` (critical path at fastest speed; total work).
    2. Work per device type: ops that can run only on devices of one type
       ``T`` must share them, so the makespan is at least their summed
       cheapest work ``sum_i min_k ET(i, k) * speed_k`` over the summed speed
       of the ``T`` devices.
    3. A path bound with transfers. ``F(o)``, a lower bound on the finish of
       ``o``, is ``min over devices k allowed for o of S(o, k) + ET(o, k)``
       where ``S(o, k)`` bounds its start if it runs on ``k``. Each parent
       ``p`` either runs on ``k`` or not. Not on ``k``, its output arrives no
       sooner than ``F(p) + w(p, k)``, ``w`` the cheapest transfer of the
       edge's bytes from a device ``p`` may use other than ``k`` to ``k``.
       On ``k`` (only if allowed there), it finishes no sooner than ``F(p)``,
       and the parents on ``k`` run one after another, so the last of them
       ends no sooner than their summed ``ET(., k)``. For the set ``P`` of
       parents on ``k`` the start is thus at least ``max(max_{p not in P}
       (F(p) + w(p, k)), max_{p in P} F(p), sum_{p in P} ET(p, k))``. Sorting
       parents by ``F(p) + w(p, k)`` decreasingly, every parent before the
       first one left off ``k`` must be on ``k`` for the first term to drop
       below that one's value, and putting more on ``k`` only raises the
       other two terms; so the minimum over all sets is the minimum over the
       prefixes of that order (a parent that cannot run on ``k`` ends the
       prefixes), and ``S(o, k)`` is that minimum. The makespan is at least
       ``max_o F(o)``. With every parent allowed on ``k`` and free transfers
       this is the plain critical path; it grows where transfers cannot be
       avoided without serialising parents.

    Returns
    -------
    float
        Seconds; 0 for an empty graph.

    Raises
    ------
    InfeasibleError, ClusterError
        As :func:`fddps.paths.allowed_devices` (an op no device can run, a
        pin to an unknown device).

    Examples
    --------
    A join whose inputs are costly to move: run both parents where the join
    runs (one after the other) or pay a transfer.

    >>> from fddps import OpGraph, Cluster
    >>> g = OpGraph(list("abc"), [2.0, 2.0, 1.0], [("a", "c", 4.0), ("b", "c", 4.0)])
    >>> c = Cluster.homogeneous(2, bandwidth=1.0)
    >>> lower_bound(g, c), communication_lower_bound(g, c)
    (3.0, 5.0)
    """
    return _once(graph, cluster, _communication_lower_bound)


def _communication_lower_bound(graph, cluster) -> float:
    if graph.num_ops == 0:
        return 0.0
    n, m = graph.num_ops, cluster.num_devices
    et = graph.exec_times(cluster)
    allowed = allowed_devices(graph, cluster, et)
    best = lower_bound(graph, cluster)
    # 2. Work per device type.
    types = [d.type for d in cluster.devices]
    for t in set(types):
        devs = [k for k in range(m) if types[k] == t]
        if len(devs) == m:  # one type: bound 1's work bound already
            continue
        only = [i for i in range(n) if set(allowed[i]) <= set(devs)]
        if only:
            work = sum(min(et[i, k] * cluster.speed[k] for k in allowed[i]) for i in only)
            best = max(best, work / sustained_speed(cluster, devs))
    # 3. The path bound with transfers; interchangeable devices give equal
    # S(o, k), so one device of each class is enough.
    reps = {cls[0] for cls in identical_device_classes(graph, cluster, et, allowed,
                                                       keep_singletons=True)}
    lat, inv = cluster.latency, cluster.inv_bandwidth
    # One latency and bandwidth on every link (as PlacementState.uniform_links):
    # a transfer costs the same whichever devices it joins.
    off = ~np.eye(m, dtype=bool)
    uniform = bool(m > 1 and not cluster.transfer_compute.any() and not cluster.shares_links
                   and np.ptp(lat[off]) == 0 and np.ptp(inv[off]) == 0)
    lat0, inv0 = (float(lat[off][0]), float(inv[off][0])) if uniform else (0.0, 0.0)
    # Python lists and floats in the loop (numpy's per-element access costs more
    # than the arithmetic; the values are the same).
    finish = [0.0] * n
    et_rows, inputs = et.tolist(), graph.input_pairs()
    for o in graph.topo.tolist():
        f_best = np.inf
        for k in allowed[o]:
            if k not in reps:
                continue
            arrive = []
            for p, b in inputs[o]:
                if uniform:
                    w = lat0 + b * inv0 if allowed[p] != [k] else np.inf
                else:
                    w = min((lat[a, k] + b * inv[a, k] for a in allowed[p] if a != k),
                            default=np.inf)
                on_k = k in allowed[p]
                arrive.append((finish[p] + w, finish[p], et_rows[p][k] if on_k else np.inf, on_k))
            arrive.sort(key=lambda t: -t[0])
            start, serial, latest = np.inf, 0.0, 0.0
            for j in range(len(arrive) + 1):
                # Parents 0..j-1 on k, parent j (if any) and the rest off it.
                first_off = arrive[j][0] if j < len(arrive) else 0.0
                start = min(start, max(first_off, serial, latest))
                if j == len(arrive) or not arrive[j][3]:
                    break
                serial += arrive[j][2]
                latest = max(latest, arrive[j][1])
            f_best = min(f_best, start + et_rows[o][k])
        finish[o] = f_best
    return float(max(best, max(finish)))


def identical_device_classes(graph, cluster, et, allowed, capacity=None, keep_singletons=False):
    """Classes of interchangeable devices, each sorted by index.

    Devices ``k`` and ``l`` are interchangeable when swapping them changes
    nothing about the problem: the same type, execution-time column
    (``et``, shape ``(n, m)``) and capacity (``capacity``, default the
    cluster's memory), link matrices unchanged by the swap, and every op
    allowed (``allowed``: per op, its devices) on both or on neither.

    Returns
    -------
    list of lists of int
        Classes of two or more devices (every class with ``keep_singletons``).
    """
    m = cluster.num_devices
    lat, bw = cluster.latency, cluster.bandwidth
    capacity = cluster.memory if capacity is None else np.asarray(capacity)
    allowed_sets = [set(a) for a in allowed]

    def swap_invariant(k, l):
        if (cluster.devices[k].type != cluster.devices[l].type or capacity[k] != capacity[l]
                or not np.array_equal(et[:, k], et[:, l])):
            return False
        perm = np.arange(m)
        perm[[k, l]] = [l, k]
        if not (np.array_equal(lat[np.ix_(perm, perm)], lat)
                and np.array_equal(bw[np.ix_(perm, perm)], bw)):
            return False
        return all((k in a) == (l in a) for a in allowed_sets)

    classes: list[list[int]] = []
    for k in range(m):
        for cls in classes:
            if swap_invariant(cls[0], k):
                cls.append(k)
                break
        else:
            classes.append([k])
    return classes if keep_singletons else [c for c in classes if len(c) > 1]
