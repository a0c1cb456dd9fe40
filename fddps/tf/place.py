"""Place a TensorFlow training step on devices: :func:`place`, the adapter's entry point.

One straight path, a module per stage:

- **read** the step once: a Keras model or ``tf.function`` is traced
  (:mod:`fddps.tf.functions`); a GraphDef or ``tf.Graph`` is analysed
  (:func:`fddps.tf.graphdef.analyse`: op table, shapes, colocation groups,
  loop frames, kernels per device type) into one object every later stage
  receives. Given ``fetches``, only the step's nodes are imported into
  TensorFlow and costed; the others (initializers, savers) are read from the
  NodeDefs and the op registry (:mod:`fddps.tf.op_defs`), enough to place them
  with their variables. :mod:`fddps.tf.read` makes the op graph a scheduler places;
- **decide**: an algorithm's schedule (:mod:`fddps.tf.schedule_place`), a
  search's strategy (:mod:`fddps.tf.search_place`, Tofu included) or the
  user's strategy (:mod:`fddps.tf.strategy_rewrite`);
- **write** the placed GraphDef (:mod:`fddps.tf.write`) or the rewritten one
  (:mod:`fddps.tf.strategy_rewrite`), and the :class:`~fddps.tf.placement.Placement`
  (for a TF2 step, the runnable :class:`~fddps.tf.functions.StepPlacement`).

:func:`fddps.tf.place_graph.place_graph` is the path of a graph;
:func:`place` adds the traced steps in front of it.

``place(graph_def, devices)`` schedules the graph with an fddps algorithm on a
cluster of the given TensorFlow devices, and writes a new GraphDef whose every
node carries the device chosen for it. Names, inputs and attributes are
unchanged, so the placed graph computes exactly what the original does, and
is fetched by the same names.

Example
-------
>>> import tensorflow as tf
>>> g = tf.Graph()
>>> with g.as_default():
...     a = tf.random.normal([64, 64], seed=1, name="a")
...     b = tf.matmul(a, a, name="b")
...     c = tf.matmul(a, tf.transpose(a), name="c")
...     d = tf.add(b, c, name="d")
>>> p = place(g, ["/cpu:0", "/cpu:1"])
>>> [n.name for n in p.graph_def.node] == [n.name for n in g.as_graph_def().node]
True
>>> {n.device for n in p.graph_def.node} <= {"/device:CPU:0", "/device:CPU:1"}
True
>>> p.makespan > 0
True
"""

from __future__ import annotations

from ..errors import FddpsError
from .place_graph import place_graph


def place(graph_def, devices, cost_model=None, algorithm="fddps", memory=None, *,
          override=False, fetches=None, enforce_order="auto", unknown_dim=1, session_config=None,
          topology="auto", strategy=None, verify=None, verify_budget=None, verify_timer=None,
          feed_dict=None, init=None, target="", **options):
    """Place and order a TensorFlow graph on devices so one step finishes soonest.

    Parameters
    ----------
    graph_def : GraphDef, tf.Graph, bytes or path; or keras.Model or tf.function
        The training graph (never modified). A Keras model or a ``tf.function``
        training step is traced, placed and returned runnable
        (:func:`fddps.tf.functions.place_step`): ``place(model, devices,
        loss=..., optimizer=..., batch=(x, y))`` or ``place(step_fn, devices,
        example_inputs)``.
    devices : list of str, or Cluster
        TensorFlow device strings (``"/device:CPU:0"``,
        ``"/job:worker/replica:0/task:1/device:GPU:0"``, ``"/cpu:1"``), or a
        :class:`~fddps.cluster.Cluster` whose device names are such strings.
    cost_model : CostModel, optional
        Default ``costmodel.default_cost_model()`` (analytic roofline presets).
    algorithm : str
        A name from :func:`fddps.available_algorithms` (default ``"fddps"``), or a
        strategy search from :func:`fddps.search.available_searches`: ``"auto"``
        (the fastest predicted of one device, data parallelism, whole-op
        placement, the DP and FlexFlow's MCMC that fits, within ``time_budget``
        seconds), ``"flexflow"``, ``"pase"`` or ``"fddps_space"`` (FD-DPS whose split
        step chooses among every configuration of the critical ops and whose
        scheduler places the parts); ``options`` then go to the search
        (:mod:`fddps.search`) and ``override``/``enforce_order`` are not used.
        ``"tofu"`` runs Tofu's recursive partitioning of every op
        (:class:`fddps.search.tofu.Tofu`, ``options`` passed to it), written as a
        strategy (:func:`fddps.tf.strategy_rewrite.place_strategy`); it raises
        :class:`InfeasibleError` when its plan's simulated peak exceeds a
        device's capacity.
    memory : float or mapping, optional
        Device capacity in bytes, for all devices or by device string or type;
        see :mod:`fddps.tf.devices` for the defaults.
    override : bool
        Let fddps move ops whose device the graph already requests (default:
        they stay where requested).
    fetches : list of str, optional
        The op or tensor names a training step runs (``["train_op", "loss"]``).
        Then only what they need is scheduled (and timed in ``makespan``); the
        other nodes (initializers, savers) are still kept, and put with their
        colocation group, their requested device or their first input. Default:
        every node is scheduled as if the step ran them all.
    enforce_order : bool or "auto"
        ``True``: make TensorFlow follow the scheduled order on each device, as FastT does:
        add a control input from each op to the op scheduled next on its device.
        Needs ``fetches`` (order edges between step and non-step ops would
        make every step re-run an initializer); step ops that other nodes also
        need (an initializer's input) get no order edge into them, so running
        the initializers never runs the step. Ops in ``tf.while_loop`` frames
        and ``tf.cond`` branches are left out (an edge there could cross a
        frame or spread a branch's deadness). Running the placed graph with a
        subset of ``fetches`` also runs the ops scheduled before them.
        ``"auto"`` (default): leave the order to TensorFlow unless the step,
        predicted in the order TensorFlow picks itself (:attr:`Placement.executor_makespan`),
        would be slower than the best single device; then enforce the
        scheduled order if ``fetches`` are given (and the scheduled step beats
        one device), else place everything on the best single device.
        :meth:`Placement.summary` says which was done (``info["order_guard"]``).
        ``False``: never add order edges nor fall back.
    unknown_dim : int
        Size assumed for dimensions TensorFlow cannot infer (see :func:`op_table`).
    session_config : tf.compat.v1.ConfigProto, optional
        The config the placed graph will run with: its intra-op threads are what
        one op of a local CPU device uses. Several CPU devices of this process
        share its cores (:func:`fddps.tf.devices.local_cpu_sharing`); the
        prediction slows their concurrent ops down accordingly.
    topology : ``"auto"``, None or a topology preset
        Link resources transfers share (:func:`fddps.tf.make_cluster`;
        default one network interface per host).
    strategy : fddps.strategy.Strategy, optional
        Run this parallelization strategy instead of searching a placement
        (:func:`fddps.tf.strategy_rewrite.place_strategy`; e.g.
        ``fddps.data_parallel(graph_def, devices, fetches)``); ``algorithm``,
        ``override``, ``enforce_order`` and ``options`` are then not used.
    verify : None, bool or int
        Measure before committing (:mod:`fddps.tf.verify`): time the
        finalists on the devices and return the fastest measured, never one
        slower than the best one-device graph. The finalists: the placement
        the algorithm chose, the best one-device graph, and the runners-up
        the decision already has (a scheduler's: its schedule with and
        without order edges, with and without its splits; ``auto``'s: the
        other candidates it wrote; a strategy's or Tofu's: none), at most
        ``verify`` of them. ``None`` (default): on for Keras models and
        ``tf.function`` steps (timed on their example batch, the step's
        variables restored afterwards bit for bit), off for graphs;
        ``True``: at most :data:`~fddps.tf.verify.DEFAULT_FINALISTS`
        finalists; an int >= 2: at most that many; ``False``: off.
        ``info["verified"]`` and :meth:`Placement.summary` report each
        finalist's predicted and measured step and which was returned, or
        why the graph could not be run (then the predicted best is returned).
    verify_budget : float, optional
        Seconds verification may take, building the finalists included
        (default :data:`~fddps.tf.verify.DEFAULT_BUDGET`, 3 s); at least
        :data:`~fddps.tf.verify.MIN_ROUNDS` timed steps per finalist are
        always run, and the rounds stop early when one finalist is clearly best.
    verify_timer : callable, optional
        ``timer(label, run) -> seconds`` of one timed step of the finalist
        ``label`` (default: the wall time of ``run()``); for tests and other clocks.
    feed_dict : mapping, optional
        A graph's verification: tensor (or placeholder) name -> value fed to
        every step; placeholders not given get random values of their shape
        and dtype (floats standard normal, integers zero).
    init : str or list of str, optional
        A graph's verification: the op(s) that initialise its variables
        (default: the graph's ``init`` op, else each variable's ``/Assign``).
    target : str
        A graph's verification: the session target that reaches the devices
        (``""``: this process; ``cluster.target`` of :func:`local_cluster`).
        Each finalist runs in its own session with isolated state, so
        variables on the servers are not touched.
    **options
        Passed to the algorithm (e.g. ``insertion=False`` for FD-DPS). FD-DPS
        and FastT split ops where the cost model says it pays (intra-op
        parallelism; see :attr:`Placement.splits` and :mod:`fddps.tf.split_rewrite`);
        ``split=False`` keeps every op whole (the paper's D-DPS(-F)).

    Returns
    -------
    Placement

    Raises
    ------
    GraphError
        For input that is not a GraphDef (bytes, wrong type, unknown op), or an unknown fetch.
    ClusterError
        For an empty device list, a malformed or unknown device string, or an op
        requesting a device not in the list (each named).
    InfeasibleError
        If the graph cannot fit in the devices' memory, or an op has no kernel on
        any given device (named).
    UnknownAlgorithmError
        For an unknown ``algorithm``.
    FddpsError
        For a bad ``verify``, ``verify_budget`` or ``verify_timer`` (named);
        ``feed_dict``, ``init`` or ``target`` given with a Keras model or step.
        A graph that cannot be run while verifying raises nothing: its
        placement says why in ``info["verified"]["reason"]``.
    """
    if callable(graph_def):  # a Keras model or a tf.function step: fddps.tf.functions
        from .functions import place_step

        if cost_model is not None and not hasattr(cost_model, "op_times"):
            # place(step_fn, devices, example_inputs): a step's third argument is its inputs
            if "example_inputs" in options:
                raise FddpsError("example_inputs given twice (third argument and keyword)")
            options["example_inputs"], cost_model = cost_model, None
        for name, value in (("feed_dict", feed_dict), ("init", init), ("target", target)):
            if value not in (None, ""):
                options[name] = value  # place_step names them as not for a step
        return place_step(graph_def, devices, cost_model=cost_model, algorithm=algorithm,
                          memory=memory, override=override, fetches=fetches,
                          enforce_order=enforce_order, unknown_dim=unknown_dim,
                          strategy=strategy, verify=verify, verify_budget=verify_budget,
                          verify_timer=verify_timer, **options)
    return place_graph(graph_def, devices, cost_model, algorithm, memory, override=override,
                       fetches=fetches, enforce_order=enforce_order, unknown_dim=unknown_dim,
                       session_config=session_config, topology=topology, strategy=strategy,
                       verify=verify, verify_budget=verify_budget, verify_timer=verify_timer,
                       feed_dict=feed_dict, init=init, target=target, **options)
