"""A per-transfer CPU cost fitted on concurrent transfers (Cluster.transfer_cpu)."""

import numpy as np
import pandas as pd
import pytest

import fddps
from fddps import Cluster, Device, OpGraph
from fddps.cluster import SharedCores
from fddps.errors import ClusterError, FddpsError
from fddps.generators import training_graph
from fddps.simulate import replay
from fddps.tf.comm_bench import fit_transfer_cpu

LAT, BW = 1e-3, 1e9  # one transfer alone: T = 1 ms + bytes / 1 GB/s


def cpu_pair(transfer_cpu=None):
    devs = [Device(f"cpu{k}", "CPU") for k in range(2)]
    return Cluster(devs, bandwidth=BW, latency=LAT, transfer_compute=1.0, transfer_cpu=transfer_cpu)


def test_share_is_the_cpu_cost_over_the_transfer_time_capped_at_the_link_share():
    c = cpu_pair((1e-4, 2e9))
    small, big = 0.0, 1e8  # T = 1 ms and 101 ms; CPU per end 0.1 ms and 50.1 ms
    assert c.transfer_share(0, 1, small) == pytest.approx(0.2)
    assert c.transfer_share(0, 1, big) == pytest.approx(2 * 50.1e-3 / 101e-3)
    assert c.transfer_share(0, 1, np.array([small, big])).shape == (2,)
    assert cpu_pair((1e-3, 1e8)).transfer_share(0, 1, 1e6) == 1.0  # never more than T
    assert cpu_pair().transfer_share(0, 1, 1e6) == 1.0               # without: transfer_compute
    # Links that spend no device time stay so.
    gpu = Cluster.homogeneous(2, bandwidth=BW, latency=LAT)
    assert gpu.with_transfer_cpu(1e-4, 1e9).transfer_share(0, 1, 0.0) == 0.0
    # Kept by with_sharing and make_cluster, dropped by with_transfer_cpu(None, None).
    shared = c.with_sharing([SharedCores(("cpu0", "cpu1"), cores=2)])
    assert shared.transfer_cpu is not None
    assert shared.with_transfer_cpu(None, None).transfer_cpu is None


@pytest.mark.parametrize("bad, match", [(1e-4, "must be a pair"), ((-1.0, 1e9), "cpu_latency >= 0"),
                                        ((1e-4, 0.0), "cpu_bandwidth > 0")])
def test_bad_transfer_cpu_is_named(bad, match):
    with pytest.raises(ClusterError, match=match):
        cpu_pair(bad)


@pytest.mark.parametrize("k", [1, 4, 16])
def test_concurrent_small_transfers_cost_their_cpu_not_their_latency(k):
    """k tensors from cpu0 to cpu1 at once: (k - 1) CPU costs + one T, not k halves of T."""
    names = [f"p{j}" for j in range(k)] + [f"c{j}" for j in range(k)]
    g = OpGraph(names, cost=np.zeros(2 * k), edges=[(f"p{j}", f"c{j}", 0.0) for j in range(k)])
    placement = {**{f"p{j}": "cpu0" for j in range(k)}, **{f"c{j}": "cpu1" for j in range(k)}}
    before = fddps.simulate(g, cpu_pair(), placement).makespan
    after = fddps.simulate(g, cpu_pair((1e-4, np.inf)), placement, amortise_transfers=False).makespan
    assert before == pytest.approx((k + 1) * LAT / 2)
    assert after == pytest.approx((k - 1) * 1e-4 + LAT)
    # Amortised (the default): each pays the marginal cost plus 1 / (transfers in flight
    # with it) of the rest of its one-alone cost, so between the two.
    amortised = fddps.simulate(g, cpu_pair((1e-4, np.inf)), placement).makespan
    assert after - 1e-12 <= amortised <= before + 1e-12
    assert (amortised > after) == (k > 1)


def test_amortised_shares_count_the_transfers_in_flight_on_the_same_link():
    """Three tensors cpu0 -> cpu1 at once and one cpu1 -> cpu0 alone."""
    import importlib

    sim = importlib.import_module("fddps.simulate")
    g = OpGraph(["a", "b", "c", "x", "y", "z", "u", "v"], cost=np.zeros(8),
                edges=[("a", "x", 0.0), ("b", "y", 0.0), ("c", "z", 0.0), ("u", "v", 0.0)])
    device = np.array([0, 0, 0, 1, 1, 1, 1, 0])
    cluster = cpu_pair((1e-4, np.inf))
    et = g.exec_times(cluster)
    order = sim.executor_order(g, cluster, device, et)
    start, finish, flow = sim._replay_flow(g, cluster, device, order, et)
    share = sim.amortised_shares(flow, start, finish, cluster)
    marginal = 2 * 1e-4 / LAT
    by_link = dict(zip(zip(flow.dev[flow.sends].tolist(), flow.dst.tolist(), flow.producer.tolist()),
                       share.tolist()))
    assert by_link[(1, 0, g.index["u"])] == pytest.approx(1.0)     # alone: its whole T
    three = [by_link[(0, 1, g.index[p])] for p in "abc"]
    assert three == pytest.approx([marginal + (1 - marginal) / 3] * 3)
    # Without a fitted cost there is nothing to amortise: the same step either way.
    plain = cpu_pair()
    assert fddps.simulate(g, plain, device).makespan == fddps.simulate(
        g, plain, device, amortise_transfers=False).makespan


def test_schedules_with_a_transfer_cpu_cost_validate_and_are_no_slower():
    g = training_graph(150, seed=3, mean_cost=1e-3, mean_bytes=2e5)
    for algorithm in ("fddps", "heft", "etf"):
        plain = fddps.schedule(g, cpu_pair(), algorithm=algorithm).validate()
        fitted = fddps.schedule(g, cpu_pair((5e-5, 1e9)), algorithm=algorithm).validate()
        # The same placement and order, timed with the cheaper transfers, is no slower.
        again = fddps.Schedule.from_order(g, cpu_pair((5e-5, 1e9)), plain.device, plain.order)
        assert again.makespan <= plain.makespan * (1 + 1e-9)
        assert fitted.makespan > 0


def test_fit_transfer_cpu_recovers_a_line_and_names_what_is_missing():
    rows = [dict(src="a", dst="b", bytes=b, count=k, seconds=2e-3 + k * (8e-5 + b / 2e9))
            for b in (64, 16384, 1 << 20) for k in (1, 8, 32) for _ in range(3)]
    fit = fit_transfer_cpu(pd.DataFrame(rows))
    assert fit.cpu_latency[0] == pytest.approx(8e-5) and fit.cpu_bandwidth[0] == pytest.approx(2e9)
    flat = [dict(r, seconds=1e-3 + r["count"] * 1e-4) for r in rows]
    assert fit_transfer_cpu(pd.DataFrame(flat)).cpu_bandwidth[0] == np.inf
    with pytest.raises(FddpsError, match=r"64 bytes: measured at 1 count"):
        fit_transfer_cpu(pd.DataFrame([r for r in rows if r["count"] == 1]))
    with pytest.raises(FddpsError, match="counts="):
        fit_transfer_cpu(pd.DataFrame(rows).drop(columns="count"))


def test_a_profiled_cost_model_keeps_the_transfer_cpu_of_its_measured_links():
    """fit_cost_model(transfer_cpu=...) keeps each measured pair's CPU cost; its clusters
    (and make_cluster's) charge it, pairs without it T / 2, and it survives save/load."""
    import costmodel
    from fddps.tf import make_cluster

    w0, w1, w2 = (f"/job:worker/replica:0/task:{k}/device:CPU:0" for k in range(3))
    sizes = np.logspace(2, 7, 6)
    transfers = pd.DataFrame({"src": w0, "dst": w1, "bytes": sizes, "seconds": 1e-3 + sizes / 1e9})
    cpu = pd.DataFrame([dict(src=w0, dst=w1, cpu_latency=1e-4, cpu_bandwidth=2e9),
                        dict(src=w1, dst=w0, cpu_latency=1e-4, cpu_bandwidth=np.inf)])
    cm = costmodel.fit_cost_model(transfers=transfers, transfer_cpu=cpu)
    assert cm.transfer_cpu(w0, w1) == cm.transfer_cpu(w1, w0) == (1e-4, 2e9)  # either direction
    assert cm.transfer_cpu(w0, w2) is None and costmodel.default_cost_model().transfer_cpu(w0, w1) is None
    for c in (cm.cluster([w0, w1, w2]), make_cluster([w0, w1, w2], cm)):
        assert c.transfer_share(0, 1, 0.0) == pytest.approx(2 * 1e-4 / c.latency[0, 1])
        assert c.transfer_share(0, 2, 0.0) == 1.0  # not measured: T / 2 per end
    again = costmodel.CostModel.from_dict(cm.to_dict())
    assert again.transfer_cpu(w0, w1) == (1e-4, 2e9)
    with pytest.raises(costmodel.CostModelError, match="was not measured"):
        costmodel.fit_cost_model(transfer_cpu=cpu.assign(dst=w2))
    with pytest.raises(costmodel.CostModelError, match="go together"):
        costmodel.LinkPreset("x", 1e-3, 1e9, cpu_latency=1e-4)


def _threaded_pair(transfer_threads):
    return cpu_pair().with_sharing([SharedCores(("cpu0", "cpu1"), cores=2, threads=1,
                                                transfer_threads=transfer_threads)])


def test_transfer_threads_send_and_receive_beside_the_ops_on_the_shared_cores():
    """a (cpu0) sends 0.2 s worth of tensor to b (cpu1); c follows a on cpu0 and d runs on
    cpu1 throughout. In the device queue the send (0.1 s per end) delays c; on a transfer
    thread it runs beside c and d, three threads on two cores, so all three slow to 2/3."""
    nbytes = 0.2 * BW - LAT * BW  # T = 0.2 s
    g = OpGraph(["a", "b", "c", "d"], cost=[1.0, 1.0, 1.0, 2.0],
                edges=[("a", "b", nbytes), ("a", "c", 0.0)])
    device, order = [0, 1, 0, 1], [[0, 2], [3, 1]]
    _, queued = replay(g, _threaded_pair(False), device, order)
    assert queued[2] == pytest.approx(2.1)             # a, its send, then c
    trace = []
    start, finish = replay(g, _threaded_pair(True), device, order, trace=trace)
    # 1.0-1.15: c, d and the send at 2/3 (0.1 s of work); 1.15-1.3: c, d and the receive;
    # then c and d at full speed: c has 1 - 0.2 left, d 2 - 1 - 0.2.
    assert finish[2] == pytest.approx(2.1) and finish[3] == pytest.approx(2.1)
    assert start[1] == pytest.approx(2.1) and finish[1] == pytest.approx(3.1)
    rates = {}
    for k, (t, task, r) in enumerate(trace):
        rates[task] = r
        if k + 1 == len(trace) or trace[k + 1][0] > t:  # every change at this instant made
            assert sum(rates.values()) <= 2 + 1e-9      # never more than the two cores
    assert any(r == pytest.approx(2 / 3) for _, _, r in trace)
    # With a core to spare the transfer costs cpu0 nothing: c ends 1 s after a.
    spare = cpu_pair().with_sharing([SharedCores(("cpu0", "cpu1"), cores=3, threads=1,
                                                 transfer_threads=True)])
    assert replay(g, spare, device, order)[1][2] == pytest.approx(2.0)


def test_transfer_threads_are_kept_by_make_cluster_and_simulate_counts_them_on_their_device():
    import costmodel
    from fddps.tf import make_cluster
    from fddps.tf.devices import task_sharing

    cm = costmodel.default_cost_model()
    workers = make_cluster([f"/job:worker/replica:0/task:{k}/device:CPU:0" for k in range(2)], cm)
    spec = {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}
    assert not task_sharing(workers.devices, spec, 1)[0].transfer_threads
    threaded = workers.with_sharing(task_sharing(workers.devices, spec, 1, transfer_threads=True))
    assert threaded.transfer_thread.tolist() == [True, True]
    assert make_cluster(threaded, cm).transfer_thread.tolist() == [True, True]  # renamed, kept
    names = list(workers.names)
    assert make_cluster(names, cm, cluster_spec=spec, threads_per_task=1,
                        transfer_threads=True).transfer_thread.all()
    with pytest.raises(ClusterError, match="transfer_threads=True needs cluster_spec"):
        make_cluster(names, cm, transfer_threads=True)
    assert not _threaded_pair(False).transfer_thread.any()
    assert _threaded_pair(True).subset(["cpu1"]).transfer_thread.tolist() == [True]
    g = OpGraph(["a", "b"], cost=[1.0, 1.0], edges=[("a", "b", 1e6)])
    t = fddps.simulate(g, _threaded_pair(True), {"a": "cpu0", "b": "cpu1"})
    # Busy: each device's op, plus its end of the transfer (T / 2 = 1 ms each).
    assert t.busy.tolist() == pytest.approx([1.0 + 1e-3, 1.0 + 1e-3])
    assert t.makespan == pytest.approx(2.0 + 2e-3)
