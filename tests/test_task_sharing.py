"""Worker tasks on one machine share its cores (issue 17: "or of processes on one host")."""

import numpy as np
import pytest
import tensorflow as tf

import costmodel
import fddps
from fddps import OpGraph
from fddps.errors import ClusterError
from fddps.tf import devices as tf_devices
from fddps.tf.devices import make_cluster, task_sharing
from fddps.tf.local_cluster import LocalCluster

#: A CPU preset pinned for the tests (never this machine's).
TEST_CPU = costmodel.DevicePreset("test-cpu", "CPU", peak_flops=50e9, memory_bandwidth=20e9,
                                  memory=8 * 2**30, overhead=5e-6)
WORKERS = [f"/job:worker/replica:0/task:{t}/device:CPU:0" for t in range(4)]
LOCAL_SPEC = {"worker": [f"127.0.0.1:{2222 + t}" for t in range(4)]}


@pytest.fixture
def two_cores(monkeypatch):
    """This machine has 2 cores, whatever the one running the test has."""
    monkeypatch.setattr(tf_devices, "usable_cores", lambda: 2)


def test_tasks_on_this_machine_share_its_cores_and_others_do_not(two_cores):
    cm = costmodel.default_cost_model(cpu=TEST_CPU)
    c = make_cluster(WORKERS, cm, cluster_spec=LOCAL_SPEC, threads_per_task=1)
    (grp,) = c.shared_cores
    assert grp.devices == tuple(WORKERS) and grp.cores == 2 and c.threads.tolist() == [1.0] * 4
    assert c.slowdown.tolist() == [2.0] * 4  # 4 one-thread tasks on 2 cores
    # Without the spec nothing says where the tasks run: no group (as before).
    assert not make_cluster(WORKERS, cm).shares_cores
    # Two tasks on another machine, one of them a sparse job; a ClusterSpec works too.
    mixed = tf.train.ClusterSpec({"worker": {0: "localhost:1", 1: "gpu-box:2", 3: "127.0.0.1:3"},
                                  "ps": ["far-away:9"]})
    devs = make_cluster(WORKERS + ["/job:ps/replica:0/task:0/device:CPU:0"], cm).devices
    (grp,) = task_sharing(devs, mixed, threads_per_task={"/job:worker/replica:0/task:3": 2})
    assert grp.devices == (WORKERS[0], WORKERS[3]) and grp.threads == (2.0, 2.0)
    assert task_sharing(devs, {"worker": ["a:1", "b:2"]}) == []
    with pytest.raises(ClusterError, match="cluster_spec must map job names"):
        task_sharing(devs, ["127.0.0.1:1"])


def test_four_workers_on_two_cores_take_twice_as_long(two_cores):
    """Four independent ops, one per worker task: the shared cores run two at a time."""
    cm = costmodel.default_cost_model(cpu=TEST_CPU)
    g = OpGraph([f"op{k}" for k in range(4)], cost=np.ones(4), edges=[])
    free = make_cluster(WORKERS, cm)
    shared = make_cluster(WORKERS, cm, cluster_spec=LOCAL_SPEC, threads_per_task=1)
    placement = {f"op{k}": WORKERS[k] for k in range(4)}
    assert fddps.simulate(g, free, placement).makespan == pytest.approx(1.0)
    assert fddps.simulate(g, shared, placement).makespan == pytest.approx(2.0)
    # Two workers of one thread each fit on the two cores: no slowdown.
    two = make_cluster(WORKERS[:2], cm, cluster_spec=LOCAL_SPEC, threads_per_task=1)
    assert fddps.simulate(OpGraph(["a", "b"], cost=np.ones(2), edges=[]), two,
                          {"a": WORKERS[0], "b": WORKERS[1]}).makespan == pytest.approx(1.0)


def test_local_cluster_builds_its_cluster_with_shared_cores(two_cores):
    lc = LocalCluster("grpc://127.0.0.1:2222", WORKERS[:3], {"worker": LOCAL_SPEC["worker"][:3]},
                      [], threads_per_worker=1)
    c = lc.cluster(costmodel.default_cost_model(cpu=TEST_CPU), memory=2**30)
    assert list(c.names) == WORKERS[:3] and (c.memory == 2**30).all()
    assert c.slowdown.tolist() == [1.5] * 3 and "3 tasks" in c.sharing_summary()[0]
