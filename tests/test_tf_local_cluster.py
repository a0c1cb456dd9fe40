"""fddps.tf.local_cluster: a placed graph runs across two real TensorFlow worker processes.

One cluster of 2 workers (one thread each) is started for the whole check
(~20-30 s on a 2-core machine, most of it two TensorFlow imports).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from costmodel import default_cost_model  # noqa: E402
from fddps import Cluster  # noqa: E402
from fddps.errors import ClusterError  # noqa: E402
from fddps.tf import local_cluster, place  # noqa: E402
from fddps.tf.devices import make_cluster, same_device  # noqa: E402


class _LeaveBlock(Exception):
    """Raised inside the cluster's block to check it also stops its workers on an error."""


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); a stopped worker was reaped by wait().
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


@pytest.mark.reads_cpu("avx512-3.5GHz")
def test_placed_graph_runs_across_two_workers(cnn_graph, tf_config, tf_train_step):
    ref = tf_train_step(cnn_graph.graph_def, cnn_graph, tf_config(1))
    pids = []
    with pytest.raises(_LeaveBlock):
        with local_cluster(2, threads_per_worker=1) as cluster:
            pids = list(cluster.pids)
            assert all(cluster.alive()) and len(set(pids)) == 2
            assert cluster.target.startswith("grpc://127.0.0.1:")
            assert cluster.devices == ["/job:worker/replica:0/task:0/device:CPU:0",
                                       "/job:worker/replica:0/task:1/device:CPU:0"]
            # The cost model's cross-host link joins the two tasks, whose CPUs spend
            # each transfer's time themselves.
            tasks = make_cluster(cluster.devices, default_cost_model())
            assert tasks.devices[0].host != tasks.devices[1].host
            assert tasks.transfer_compute[0, 1] == 1
            # Scheduled as if links were contention-free, so that the small graph is
            # spread over both tasks (charged, it would rather stay on one).
            free = Cluster(tasks.devices, bandwidth=tasks.bandwidth, latency=tasks.latency)
            p = place(cnn_graph.graph_def, free, fetches=["train", "loss"])
            got = tf_train_step(p.graph_def, cnn_graph, cluster.session_config(), cluster.target)

            assert got.loss == pytest.approx(ref.loss, rel=1e-5)
            for a, b, name in zip(ref.variables, got.variables, cnn_graph.reads):
                np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6, err_msg=name)
            want = p.devices
            ran = {}
            for part in got.metadata.partition_graphs:
                for node in part.node:
                    if node.name in want:
                        ran[node.name] = node.device
            moved = [f"{n}: placed {want[n]}, ran on {d}" for n, d in ran.items()
                     if not same_device(want[n], d)]
            assert moved == [], "\n".join(moved)
            tasks = {tf.DeviceSpec.from_string(d).task for d in ran.values()}
            assert tasks == {0, 1}, f"ops ran only on tasks {tasks}"
            raise _LeaveBlock
    assert pids and not any(_alive(pid) for pid in pids), "a worker survived its cluster"


@pytest.mark.parametrize("kwargs", [dict(n_workers=0), dict(n_workers=2, threads_per_worker=0),
                                    dict(n_workers="2")])
def test_bad_arguments_start_nothing(kwargs):
    with pytest.raises(ClusterError, match="must be an integer >= 1"):
        with local_cluster(**kwargs):
            pass
