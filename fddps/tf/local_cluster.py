"""A real TensorFlow cluster on this machine: ``tf.distribute.Server`` worker processes.

Two workers on 127.0.0.1 are two real devices with a real (gRPC) link between
them, the one place on a small machine where a placement's speed can be
measured end to end, and where a placed graph can be run across tasks.

Example
-------
>>> with local_cluster(2) as cluster:                           # doctest: +SKIP
...     placement = place(graph_def, cluster.devices)
...     with tf.compat.v1.Session(cluster.target, graph=g) as sess:
...         ...
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from ..errors import ClusterError, FddpsError

#: The worker process: start one server task, say so, and serve until killed.
_WORKER = r"""
import json, os, sys
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf
spec, task, threads = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=threads,
                                  inter_op_parallelism_threads=threads)
server = tf.distribute.Server(tf.train.ClusterSpec(spec), job_name="worker",
                              task_index=task, config=config, start=True)
print("fddps-worker-ready", task, server.target, flush=True)
server.join()
"""


@dataclass
class LocalCluster:
    """A running local cluster (what :func:`local_cluster` yields).

    Attributes
    ----------
    target : str
        Session target of task 0 (``"grpc://127.0.0.1:PORT"``).
    devices : list of str
        One CPU device string per worker,
        ``/job:worker/replica:0/task:i/device:CPU:0``.
    cluster_spec : dict
        ``{"worker": ["127.0.0.1:PORT", ...]}``.
    pids : list of int
        Process ids of the workers this cluster started.
    threads_per_worker : int
    """

    target: str
    devices: list
    cluster_spec: dict
    pids: list
    threads_per_worker: int
    _procs: list = field(default_factory=list, repr=False)
    _logs: list = field(default_factory=list, repr=False)

    def session_config(self, **kwargs):
        """A ``tf.compat.v1.ConfigProto`` for sessions on this cluster (kwargs passed on)."""
        import tensorflow as tf

        return tf.compat.v1.ConfigProto(**kwargs)

    def cluster(self, cost_model=None, memory=None, **options):
        """The :class:`~fddps.Cluster` of the workers, for :func:`fddps.place` and the simulator.

        Like ``make_cluster(self.devices, cost_model, memory)``, and the
        workers' CPU devices share this machine's cores (each op of a worker
        wants its ``threads_per_worker`` threads; :func:`fddps.tf.devices.task_sharing`):
        more workers than cores do not run faster than the cores. ``cost_model``
        defaults to ``costmodel.default_cost_model()``; ``options`` go to
        :func:`~fddps.tf.devices.make_cluster` (``topology``, ...).
        """
        import costmodel

        from .devices import make_cluster

        cm = cost_model if cost_model is not None else costmodel.default_cost_model()
        return make_cluster(self.devices, cm, memory, cluster_spec=self.cluster_spec,
                            threads_per_task=self.threads_per_worker, **options)

    def alive(self) -> list:
        """Whether each worker process is still running."""
        return [p.poll() is None for p in self._procs]


def _free_ports(n):
    """``n`` distinct TCP ports free on 127.0.0.1 right now."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _log_tail(path, lines=8):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:]).strip()
    except OSError:
        return ""


def _stop(procs, logs, grace=5.0):
    """Terminate exactly ``procs`` (SIGTERM, then SIGKILL after ``grace`` s); close their logs."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    for f in logs:
        f.close()
        with contextlib.suppress(OSError):
            os.unlink(f.name)


@contextlib.contextmanager
def local_cluster(n_workers: int, threads_per_worker: int = 1, startup_timeout: float = 120.0):
    """Start ``n_workers`` ``tf.distribute.Server`` processes on 127.0.0.1; stop them on exit.

    Each worker is one task of job ``worker`` with one CPU device, limited to
    ``threads_per_worker`` intra-op and inter-op threads, listening on a free
    port. The context yields once every worker accepts connections, and stops
    exactly the processes it started when the block ends, also on an error.

    Parameters
    ----------
    n_workers : int
        Number of worker tasks (>= 1).
    threads_per_worker : int
        Threads of each worker (>= 1).
    startup_timeout : float
        Seconds to wait for the workers to listen.

    Yields
    ------
    LocalCluster
        ``target`` (session target, task 0), ``devices`` (one device string per
        worker), ``cluster_spec``, ``pids``.

    Raises
    ------
    ClusterError
        For ``n_workers`` or ``threads_per_worker`` below 1.
    FddpsError
        If a worker exits or does not listen within ``startup_timeout`` (its
        log's last lines are in the message).
    """
    for what, v in (("n_workers", n_workers), ("threads_per_worker", threads_per_worker)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ClusterError(f"{what} must be an integer >= 1, got {v!r}")
    ports = _free_ports(n_workers)
    spec = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"))
    procs, logs = [], []
    try:
        for task in range(n_workers):
            log = tempfile.NamedTemporaryFile("w+", prefix=f"fddps-worker{task}-", suffix=".log",
                                              delete=False)
            logs.append(log)
            procs.append(subprocess.Popen(
                [sys.executable, "-c", _WORKER, json.dumps(spec), str(task), str(threads_per_worker)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env))
        deadline = time.monotonic() + startup_timeout
        for task, (p, port) in enumerate(zip(procs, ports)):
            while True:
                if p.poll() is not None:
                    raise FddpsError(f"local_cluster worker task {task} (pid {p.pid}) exited with "
                                     f"code {p.returncode} while starting: {_log_tail(logs[task].name)}")
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                    s.settimeout(0.5)
                    if s.connect_ex(("127.0.0.1", port)) == 0:
                        break
                if time.monotonic() > deadline:
                    raise FddpsError(f"local_cluster worker task {task} (pid {p.pid}) did not listen "
                                     f"on port {port} within {startup_timeout} s: "
                                     f"{_log_tail(logs[task].name)}")
                time.sleep(0.1)
        cluster = LocalCluster(
            target=f"grpc://127.0.0.1:{ports[0]}",
            devices=[f"/job:worker/replica:0/task:{t}/device:CPU:0" for t in range(n_workers)],
            cluster_spec=spec, pids=[p.pid for p in procs], threads_per_worker=threads_per_worker,
            _procs=procs, _logs=logs)
        yield cluster
    finally:
        _stop(procs, logs)
