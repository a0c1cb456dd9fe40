"""Place a TF2 training step -- a Keras model's or a ``tf.function``'s -- and run it placed.

:func:`place_step` traces the step to a graph (a ``tf.function``'s concrete
function; for a Keras model, its own ``train_step``, the step ``model.fit``
runs), places that graph with :func:`fddps.tf.place` like any GraphDef, and
returns a :class:`StepPlacement`, whose :meth:`~StepPlacement.train_step` runs
the placed graph in eager mode **on the step's own variables**: the model's
weights and optimizer slots are updated in place, so ``model.get_weights()``,
``model.save_weights()`` and ``model.evaluate()`` see the trained values.

How it runs: the placed GraphDef (every node with its device) is imported into
a ``tf.function`` with its inputs mapped to the call's arguments and its
captured variable handles mapped to the variables' handles; calling it is an
ordinary multi-device TensorFlow function call, and runs the step's outputs
and all its stateful ops (the variable updates).

A variable stays where it was created, so the ops TensorFlow colocates with it
(its reads and the optimizer's update of it) are pinned to the variable's
device; every other op goes where the schedule puts it. Create the model under
``tf.device(...)`` to put its variables elsewhere. The runtime's own choices
are checked on the first call: :attr:`StepPlacement.ran_on` holds the device
each op ran on (from the function's partition graphs) and
:meth:`StepPlacement.moved_ops` lists any op that did not run where it was placed.

Several devices in one process: in TF2 eager, CPU devices are logical devices
configured before TensorFlow starts its runtime (:func:`local_cpu_devices`).
Across processes: ``tf.config.experimental_connect_to_cluster`` and device
strings ``/job:worker/replica:0/task:N/device:CPU:0``.

Example
-------
>>> import keras, numpy as np, fddps                              # doctest: +SKIP
>>> devices = fddps.tf.local_cpu_devices(2)                      # doctest: +SKIP
>>> model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])  # doctest: +SKIP
>>> x, y = np.ones((16, 8), "float32"), np.zeros((16, 4), "float32")   # doctest: +SKIP
>>> p = fddps.place(model, devices, loss="mse", optimizer="sgd", batch=(x, y))  # doctest: +SKIP
>>> p.train_step(x, y)["loss"]                                    # doctest: +SKIP
"""

from __future__ import annotations

import warnings

import numpy as np

from ..cluster import Cluster
from ..errors import ClusterError, FddpsError
from .colocation import colocate_fusions, follow_resources
from .devices import check_devices_exist, device_matches, parse_device, same_device
from .graphdef import _tf
from .place_graph import place_graph
from .placement import Placement
from .verify import check_budget, check_timer, finalist_count

#: Name scope of the placed graph inside the function that runs it.
_SCOPE = "placed"


def local_cpu_devices(n: int) -> list:
    """Split this process's CPU into ``n`` logical devices for TF2 eager; their names.

    TensorFlow fixes its devices when its runtime starts (the first eager op),
    so call this first. If the runtime has started already with ``n`` or more
    CPU devices, their first ``n`` names are returned.

    Parameters
    ----------
    n : int
        Number of CPU devices (>= 1). They share the same cores: a placement
        across them tests what runs where, not speed.

    Returns
    -------
    list of str
        ``["/device:CPU:0", ..., f"/device:CPU:{n-1}"]``

    Raises
    ------
    ClusterError
        If ``n`` is not a positive integer, or the runtime has started with
        fewer CPU devices (the message says how many).

    Examples
    --------
    >>> local_cpu_devices(2)                          # doctest: +SKIP
    ['/device:CPU:0', '/device:CPU:1']
    """
    if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 1:
        raise ClusterError(f"local_cpu_devices(n): n must be an integer >= 1, got {n!r}")
    tf = _tf()
    cpus = tf.config.list_physical_devices("CPU")
    try:
        tf.config.set_logical_device_configuration(
            cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(int(n))])
    except RuntimeError:  # the runtime has started: its devices are fixed
        pass
    have = [d.name for d in tf.config.list_logical_devices("CPU")]
    local = [name for name in have if device_matches("/job:localhost/replica:0/task:0", name)]
    if len(local) < n:
        raise ClusterError(
            f"local_cpu_devices({n}): TensorFlow's runtime has already started with "
            f"{len(local)} CPU device(s) ({local}); call local_cpu_devices before any other "
            "TensorFlow work in this process")
    return [f"/device:CPU:{k}" for k in range(int(n))]


# -- what a step is ----------------------------------------------------------------------------
def is_keras_model(obj) -> bool:
    """Whether ``obj`` is a Keras model (Keras 3, also ``tf.keras`` with TensorFlow >= 2.16)."""
    try:
        import keras
    except ImportError:  # pragma: no cover - keras ships with tensorflow
        return False
    return isinstance(obj, keras.Model)


def _spec_of(value, what):
    """A fully defined ``tf.TensorSpec`` for one example input (array, tensor or spec)."""
    tf = _tf()
    if isinstance(value, tf.TensorSpec):
        spec = value
    else:
        try:
            spec = tf.TensorSpec.from_tensor(tf.convert_to_tensor(value))
        except (TypeError, ValueError) as e:
            raise FddpsError(f"{what} must be arrays, tensors or tf.TensorSpec, got "
                             f"{type(value).__name__}: {e}") from None
    if not spec.shape.is_fully_defined():
        raise FddpsError(f"{what} has shape {spec.shape}: give every dimension (the batch "
                         "size too); fddps places the step for one shape")
    return spec


def _specs(example, what):
    """Example inputs as a structure of ``TensorSpec`` (same nesting)."""
    tf = _tf()
    return tf.nest.map_structure(lambda v: _spec_of(v, what), example)


def _keras_step(model, loss, optimizer, batch):
    """The concrete function of ``model.train_step((x, y))`` for ``batch``'s shapes.

    Compiles the model with ``loss`` and ``optimizer`` when given, builds it and
    its optimizer (variables must exist before tracing), then traces.
    """
    tf = _tf()
    if batch is None:
        raise FddpsError("place(keras_model, devices, ...) needs batch=(x, y): an example "
                         "batch (arrays or tf.TensorSpec) that fixes the step's shapes")
    if not (isinstance(batch, (tuple, list)) and len(batch) == 2):
        raise FddpsError(f"batch must be a pair (x, y) of example inputs and targets, got "
                         f"{type(batch).__name__}" + (f" of length {len(batch)}"
                                                      if isinstance(batch, (tuple, list)) else ""))
    compiled = bool(getattr(model, "compiled", False))
    have_loss = compiled and getattr(model, "loss", None) is not None
    have_opt = compiled and getattr(model, "optimizer", None) is not None
    for name, given, have in (("loss", loss, have_loss), ("optimizer", optimizer, have_opt)):
        if given is None and not have:
            raise FddpsError(f"place(keras_model, ...) needs {name}=...: model "
                             f"{model.name!r} is not compiled with a {name} "
                             "(pass loss= and optimizer=, or model.compile(...) first)")
    specs = _specs(tuple(batch), "batch")
    x, y = (tf.nest.map_structure(lambda s: tf.zeros(s.shape, s.dtype), s) for s in specs)
    # The variables made here (optimizer slots, metric totals) go where the
    # model's weights are, which may be another task's device.
    weights = list(model.weights)
    home = getattr(getattr(weights[0], "value", weights[0]), "device", "") if weights else ""
    with tf.device(home or None):
        if loss is not None or optimizer is not None:
            model.compile(optimizer=optimizer if optimizer is not None else model.optimizer,
                          loss=loss if loss is not None else model.loss)
        # Variables (weights, slots, metric totals) must exist before the trace,
        # as model.fit makes them: the step then captures them, not creates them.
        if hasattr(model, "_symbolic_build"):
            model._symbolic_build(data_batch=(x, y, None))
        else:  # pragma: no cover - other Keras versions
            model(x)
            model.optimizer.build(model.trainable_variables)

    def keras_train_step(x, y):
        return model.train_step((x, y))

    return tf.function(keras_train_step).get_concrete_function(*specs), specs


def _function_step(step, example_inputs):
    """The concrete function of a ``tf.function`` (or plain Python) step for the example inputs."""
    tf = _tf()
    if isinstance(step, tf.types.experimental.ConcreteFunction):
        args = step.structured_input_signature[0]
        return step, args
    if example_inputs is None:
        raise FddpsError("place(step_fn, devices, example_inputs): a tf.function step needs "
                         "its example inputs (a tuple of the step's arguments, arrays or "
                         "tf.TensorSpec) to be traced")
    if not isinstance(example_inputs, (tuple, list)):
        example_inputs = (example_inputs,)
    specs = _specs(tuple(example_inputs), "example_inputs")
    fn = step if isinstance(step, tf.types.experimental.PolymorphicFunction) else tf.function(step)
    return fn.get_concrete_function(*specs), specs


# -- the graph fddps places -----------------------------------------------------------------
def _step_graph(cf):
    """What :func:`place` needs from a concrete function's graph.

    Returns a namespace-like dict: ``graph_def`` (the graph to place: each
    captured variable handle is a ``VarHandleOp`` with the variable's shape and
    dtype, so shapes and weight bytes are known, and every captured resource
    requests its device), ``placeholders`` (node name -> the captured
    ``Placeholder`` NodeDef, to put back), ``captures`` (list of
    (placeholder tensor name, external tensor)), ``variables`` (node name ->
    variable), ``arg_names``, ``output_names``, ``control_names``.
    """
    tf = _tf()
    graph = cf.graph
    captures = list(graph.captures)
    internal = {t.ref() for _, t in captures}
    args = [t for t in graph.inputs if t.ref() not in internal]
    by_handle = {}
    for v in graph.variables:
        handle = getattr(v, "handle", None)
        if handle is not None:
            by_handle[id(handle)] = v
    gd = graph.as_graph_def()
    nodes = {n.name: n for n in gd.node}
    placeholders, variables = {}, {}
    for ext, t in captures:
        if ext.dtype != tf.resource:
            continue
        node = nodes[t.op.name]
        original = tf.compat.v1.NodeDef()
        original.CopyFrom(node)
        placeholders[node.name] = original
        node.device = ext.device
        v = by_handle.get(id(ext))
        if v is not None:
            variables[node.name] = v
            node.op = "VarHandleOp"
            node.ClearField("attr")
            node.attr["dtype"].type = v.dtype.as_datatype_enum
            node.attr["shape"].shape.CopyFrom(v.shape.as_proto())
            node.attr["shared_name"].s = node.name.encode()
            node.attr["container"].s = b""
    return dict(graph_def=gd, placeholders=placeholders, variables=variables,
                captures=[(t.name, ext) for ext, t in captures],
                arg_names=[t.name for t in args], arg_specs=[tf.TensorSpec(t.shape, t.dtype)
                                                             for t in args],
                output_names=[t.name for t in graph.outputs],
                control_names=[op.name for op in graph.control_outputs])


def _check_pins(step_graph, devices):
    """Raise if a captured variable lives on no device of the list (it cannot move)."""
    names = list(devices.names) if isinstance(devices, Cluster) else (
        [devices] if isinstance(devices, str) else list(devices))
    specs = [parse_device(name, "device") for name in names]
    for node, nd in step_graph["placeholders"].items():
        ext = dict(step_graph["captures"])[node + ":0"]
        if not any(device_matches(ext.device, s) for s in specs):
            v = step_graph["variables"].get(node)
            what = f"variable {v.name!r}" if v is not None else f"captured resource {node!r}"
            raise ClusterError(
                f"{what} lives on {ext.device}, which is none of the devices given {names}: "
                "the placed step updates the step's own variables where they are, so their "
                "device must be one of the devices (create them, and a Keras model's optimizer, "
                "under tf.device(...) on one)")


def _drop_unset_attrs(graph_def):
    """Remove attributes that hold no value, in place; returns how many.

    Reading a missing key of a NodeDef's ``attr`` map adds it, empty (TensorFlow's
    FLOPs statistic of ``BatchMatMulV2`` reads ``transpose_a``, which that op does not
    have; :func:`fddps.tf.graphdef.analyse` counts TensorFlow's own op types itself,
    but still calls a statistic registered for another op type), and the function
    runtime then refuses the graph ("Failed to bind all placeholders in <Unknown
    AttrValue type>").
    """
    dropped = 0
    for node in graph_def.node:
        for key in [k for k, v in node.attr.items() if v.WhichOneof("value") is None]:
            del node.attr[key]
            dropped += 1
    return dropped


def _device_types(devices):
    """Device types of a device list or Cluster (CPU when none parses)."""
    if isinstance(devices, Cluster):
        return tuple(dict.fromkeys(d.type for d in devices.devices))
    names = [devices] if isinstance(devices, str) else list(devices)
    return tuple(dict.fromkeys(parse_device(name, "device").device_type for name in names))


def _restore_placeholders(graph_def, placeholders, fed):
    """Turn the ``VarHandleOp`` stand-ins back into the captured placeholders (device kept).

    The running function feeds the tensors of the placeholders (``fed``: the
    step's arguments and captures), not the ops, so a control input ``^P`` (an
    order edge of ``enforce_order``) would make an unfed placeholder run:
    ``^P`` is replaced by P's own control inputs, which keeps the order of the
    ops around it, and P keeps no control input.
    """
    control = {}
    for node in graph_def.node:
        if node.name in fed:
            control[node.name] = [s[1:] for s in node.input if s.startswith("^")]
            data = [s for s in node.input if not s.startswith("^")]
            del node.input[:]
            node.input.extend(data)

    def upstream(name, seen=()):
        out = []
        for c in control[name]:
            if c in control:
                if c not in seen:
                    out += upstream(c, seen + (name,))
            elif c not in out:
                out.append(c)
        return out

    for node in graph_def.node:
        original = placeholders.get(node.name)
        if original is not None:
            device = node.device
            node.CopyFrom(original)
            node.device = device
        if node.name in control:
            continue
        inputs = list(node.input)
        if not any(s.startswith("^") and s[1:] in control for s in inputs):
            continue
        kept = [s for s in inputs if not (s.startswith("^") and s[1:] in control)]
        have = {s.lstrip("^").split(":")[0] for s in kept}
        for s in inputs:
            if s.startswith("^") and s[1:] in control:
                for c in upstream(s[1:]):
                    if c not in have:
                        kept.append("^" + c)
                        have.add(c)
        del node.input[:]
        node.input.extend(kept)


def _layer_of(model, graph_def, op_name, variables):
    """The top-level Keras layer of ``model`` whose call made op ``op_name``, or None.

    Found by the variables the op reads (its inputs that are captured variable
    handles; a ``While`` of a recurrent layer reads the layer's weights), else by
    name scope: in a traced step a layer's ops sit under its name scope
    (gradients under ``gradient_tape/``), which tracing may suffix ``_1``.
    A layer that is itself a model is searched in turn.
    """
    node = next(n for n in graph_def.node if n.name == op_name)
    handles = set()
    for s in node.input:
        v = variables.get(s.lstrip("^").split(":")[0])
        if v is not None:
            handles.add(id(v.handle))

    def owns(layer):
        for w in getattr(layer, "weights", []):
            tv = getattr(w, "value", w)
            if id(getattr(tv, "handle", None)) in handles:
                return True
        return False

    parts = op_name.split("/")
    if parts and parts[0] == "gradient_tape":
        parts = parts[1:]
    found, layer = None, model
    while True:
        children = list(getattr(layer, "layers", []))
        hit = next((c for c in children if handles and owns(c)), None)
        if hit is None:
            by_name = {c.name: c for c in children}
            for part in parts[:-1]:
                base, _, suffix = part.rpartition("_")
                hit = by_name.get(part) or (by_name.get(base) if suffix.isdigit() else None)
                if hit is not None:
                    break
        if hit is None or hit is layer:
            return found
        found, layer = hit, hit


def _unreadable_op(graph_def):
    """First op fddps cannot see into: a control-flow-v2 op or function call with a body.

    Such an op (``While``, ``If``, ``PartitionedCall``, ...) runs a whole
    function on one device, and the cost models time it as one op, so its
    body's work would be invisible to the schedule. Returns (name, op type) or None.
    """
    functions = {f.signature.name for f in graph_def.library.function}
    for node in graph_def.node:
        calls = node.op in functions or any(
            a.HasField("func") or (a.HasField("list") and len(a.list.func))
            for a in node.attr.values())
        if calls:
            return node.name, node.op
    return None


# -- place and run --------------------------------------------------------------------------------
def place_step(step, devices, example_inputs=None, *, loss=None, optimizer=None, batch=None,
               cost_model=None, algorithm="fddps", memory=None, override=False, fetches=None,
               enforce_order="auto", unknown_dim=1, strategy=None, verify=None,
               verify_budget=None, verify_timer=None, **options):
    """Place a Keras model's training step, or a ``tf.function`` step, and run it placed.

    Parameters
    ----------
    step : keras.Model, tf.function, ConcreteFunction or Python function
        A Keras model: its ``train_step`` (what ``model.fit`` runs per batch)
        is placed. A ``tf.function`` (or a Python function, wrapped in one)
        taking tensors: the step itself; the variables it uses are its own
        (captured), as with any ``tf.function``.
    devices : list of str, or Cluster
        TensorFlow device strings (see :func:`fddps.tf.place`). Every variable
        the step uses must live on one of them (it stays there).
    example_inputs : tuple, optional
        For a function step: its positional arguments (arrays, tensors or
        ``tf.TensorSpec``, any nesting), which fix its shapes and dtypes. For a
        Keras model, the same as ``batch``.
    loss, optimizer : optional
        For a Keras model: what ``model.compile`` takes. When given, the model
        is compiled with them (replacing an earlier ``compile``); when omitted,
        the model must be compiled with them already.
    batch : (x, y)
        For a Keras model: an example batch of inputs and targets (arrays or
        ``tf.TensorSpec``); the step is placed for its shapes.
    cost_model, algorithm, memory, enforce_order, unknown_dim, **options
        As for :func:`fddps.tf.place`.
    verify, verify_budget, verify_timer
        As for :func:`fddps.tf.place`; on by default here: the finalists' placed
        steps run on the example batch (a ``tf.TensorSpec`` as random values),
        interleaved (:mod:`fddps.tf.verify`), and the fastest measured is
        returned. Every variable the step captures (weights, optimizer slots
        and iteration counter, metric totals, seed states) is read before and
        assigned back after, bit for bit: verifying does not train the model.
        A step capturing another kind of resource (a table, an iterator) is
        not run; ``info["verified"]["reason"]`` says so.
    override : bool
        Let fddps move ops the step's code pinned with ``tf.device`` (the
        variables and the ops on them still stay with the variables).
    fetches : None
        Not used: a step runs its outputs and all its stateful ops.
    strategy : Strategy, callable or "data_parallel", optional
        Run a parallelization strategy instead of searching a placement (see
        :func:`fddps.tf.place`). The step's graph exists only after tracing, so
        besides a :class:`~fddps.strategy.Strategy` this takes a function
        ``(graph_def, devices, fetches) -> Strategy`` called on the traced step,
        or ``"data_parallel"`` for :func:`fddps.tf.strategy_rewrite.data_parallel`.

    Returns
    -------
    StepPlacement
        A :class:`~fddps.tf.placement.Placement` whose :meth:`~StepPlacement.train_step`
        (also the placement itself, called) runs the placed step.

    Raises
    ------
    FddpsError
        A missing ``loss``, ``optimizer``, ``batch`` or ``example_inputs`` (named);
        a Keras layer fddps cannot read (named, with its op); an example input
        without a full shape.
    ClusterError
        An empty device list; a device string naming no device of this
        process or its cluster (named, with the devices that exist); a
        variable on no device of ``devices`` (named); bad device strings.
    GraphError, InfeasibleError
        As for :func:`fddps.tf.place`.
    """
    if fetches is not None:
        raise FddpsError("fetches= is not used for a Keras model or tf.function step: the "
                         "placed step runs the step's outputs and all its stateful ops")
    for name in ("feed_dict", "init", "target"):
        if options.get(name) not in (None, ""):
            raise FddpsError(f"{name}= is for verifying a GraphDef; a Keras model or "
                             "tf.function step is verified on its example inputs")
        options.pop(name, None)
    count = finalist_count(verify, default_on=True)
    budget, timer = check_budget(verify_budget), check_timer(verify_timer)
    # The placed step runs in this process: its devices must exist here.
    check_devices_exist(devices)
    keras_model = step if is_keras_model(step) else None
    if keras_model is not None:
        if batch is None:
            batch = example_inputs
        cf, specs = _keras_step(keras_model, loss, optimizer, batch)
    else:
        for name, value in (("loss", loss), ("optimizer", optimizer), ("batch", batch)):
            if value is not None:
                raise FddpsError(f"{name}= is for a Keras model; the step given is a "
                                 f"{type(step).__name__} (pass its inputs as example_inputs)")
        cf, specs = _function_step(step, example_inputs)
    sg = _step_graph(cf)
    found = _unreadable_op(sg["graph_def"])
    if found is not None:
        name, op_type = found
        layer = (_layer_of(keras_model, sg["graph_def"], name, sg["variables"])
                 if keras_model is not None else None)
        where = (f"layer {layer.name!r} ({type(layer).__name__}) of model {keras_model.name!r}"
                 if layer is not None else "the step (outside any layer: the loss or optimizer)"
                 if keras_model is not None else "the step")
        raise FddpsError(
            f"{where} runs op {name!r} ({op_type}), a call of a function body (control flow "
            "or a nested tf.function) that fddps cannot read: it would be placed and timed as "
            "one op, its work unseen. Unroll it (e.g. keras.layers.LSTM(..., unroll=True)) or "
            "write the step without it")
    _check_pins(sg, devices)
    gd = sg["graph_def"]
    if override:  # the step's own tf.device pins go; captured resources keep theirs
        for node in gd.node:
            if node.name not in sg["placeholders"]:
                node.device = ""
    # TensorFlow fuses some producer-consumer pairs into one kernel on the
    # producer's device whatever devices they carry: place them together.
    colocate_fusions(gd, sg["output_names"] + sg["control_names"], _device_types(devices))
    step_fetches = sg["output_names"] + sg["control_names"]
    if isinstance(strategy, str):
        if strategy != "data_parallel":
            raise FddpsError(f"strategy={strategy!r}: the strategy a name may give is "
                             "'data_parallel' (else pass a Strategy or a function of the "
                             "traced graph_def, devices and fetches)")
        from .strategy_rewrite import data_parallel

        strategy = data_parallel
    if callable(strategy):
        names = list(devices.names) if isinstance(devices, Cluster) else list(devices)
        strategy = strategy(gd, names, step_fetches)
    if strategy is not None:
        options["strategy"] = strategy
    p = place_graph(gd, devices, cost_model, algorithm, memory,
                    fetches=step_fetches, enforce_order=enforce_order,
                    unknown_dim=unknown_dim, finalists=count, **options)
    step_kind = "keras" if keras_model is not None else "tf.function"
    if not count:
        return _as_step(p, cf, sg, specs, keras_model, step_kind)
    finalists = [(label, _as_step(q, cf, sg, specs, keras_model, step_kind, warn=False))
                 for label, q in (p.finalists or [("chosen", p)])]
    p.finalists = []
    example = batch if keras_model is not None else example_inputs
    if keras_model is None and isinstance(example, (tuple, list)):
        example = tuple(example)
    elif keras_model is None:
        example = (example,) if example is not None else tuple(specs)
    chosen = _verify_step(finalists, sg, example, budget, timer)
    _warn_followed(chosen.info["ops_with_their_variables"])
    return chosen


def _as_step(p, cf, sg, specs, keras_model, step_kind, warn=True):
    """The :class:`StepPlacement` of a placement of the traced step: its captured handles
    turned back into the step's placeholders, ops on a variable put with it."""
    _drop_unset_attrs(p.graph_def)
    fed = {name.split(":")[0] for name in sg["arg_names"]}
    fed.update(name.split(":")[0] for name, _ in sg["captures"])
    _restore_placeholders(p.graph_def, sg["placeholders"], fed)
    # Ops reading a variable run where the variable is (TensorFlow's rule); a
    # strategy's rewrite may have put a replica's reads elsewhere.
    captured = dict(sg["captures"])

    def written(device):  # the cluster's own spelling of a variable's device
        return next((d for d in p.cluster.names if same_device(d, device)), device)

    followed = follow_resources(p.graph_def, {name: written(captured[name + ":0"].device)
                                              for name in sg["placeholders"]})
    p.info["ops_with_their_variables"] = followed
    if warn:
        _warn_followed(followed, stacklevel=5)
    p.info["step"] = step_kind
    return StepPlacement(p, cf, sg, specs, keras_model)


def _warn_followed(followed, stacklevel=4):
    if followed:
        warnings.warn(
            f"{len(followed)} ops read or update a variable on another device than they were "
            f"placed on (e.g. {followed[0][0]!r} placed on {followed[0][1]}, variable on "
            f"{followed[0][2]}); TensorFlow runs them with the variable, so the placed step "
            "puts them there (the predicted step time is the plan's)", stacklevel=stacklevel)


def _example_values(example, seed=0):
    """The example inputs as tensors: arrays and tensors as given, a ``tf.TensorSpec`` as a
    random tensor of its shape and dtype (floats standard normal, the rest zeros)."""
    tf = _tf()
    rng = np.random.default_rng(seed)

    def value(v):
        if isinstance(v, tf.TensorSpec):
            dtype = v.dtype.base_dtype
            shape = v.shape.as_list()
            if dtype.is_floating:
                return tf.constant(rng.standard_normal(shape).astype(dtype.as_numpy_dtype))
            return tf.zeros(shape, dtype)
        return v

    return tf.nest.map_structure(value, example)


def _verify_step(finalists, sg, example, budget, timer):
    """Time the placed steps of ``finalists`` (label, :class:`StepPlacement`) on the example
    batch; the fastest measured, with ``info["verified"]``.

    The step's variables (weights, optimizer slots and iteration counter,
    metric totals, random seed states) are read before the first timed step
    and assigned back afterwards, bit for bit, so verifying does not train
    the model. A step that captures a resource other than a variable (a
    lookup table, an iterator) is not run: its state could not be put back.
    """
    import time as _time

    from tensorflow.python.eager import context

    from .verify import adopt, not_verified, verify_finalists

    t0 = _time.perf_counter()
    predicted = [(label, q.makespan) for label, q in finalists]
    others = [name for name in sg["placeholders"] if name not in sg["variables"]]
    if len(finalists) < 2:
        record = not_verified(predicted, "one distinct finalist: nothing to choose between",
                              budget=budget)
    elif others:
        record = not_verified(predicted, f"the step captures resource {others[0]!r}, not a "
                              "variable: its state could not be restored after timing",
                              budget=budget)
    else:
        args = _example_values(example)
        variables = list(sg["variables"].values())
        saved = [v.numpy() for v in variables]

        def prepare(k):
            q = finalists[k][1]
            runner, flat = q._build(), q._flat_args(args)

            def run():
                runner(*flat)
                context.async_wait()

            run()
            return run

        try:
            record = verify_finalists(predicted, prepare, budget=budget, timer=timer)
        finally:
            for v, value in zip(variables, saved):
                v.assign(value)
            context.async_wait()
    chosen = finalists[record["returned_index"]][1]
    return adopt(chosen, finalists[0][1], record, _time.perf_counter() - t0)


class StepPlacement(Placement):
    """A :class:`~fddps.tf.placement.Placement` of a TF2 step that runs it (:func:`place_step`).

    Attributes
    ----------
    graph_def : GraphDef
        The placed step: the traced graph, every node with its device; the
        captured variable handles are its ``Placeholder`` inputs.
    concrete_function : ConcreteFunction
        The traced (unplaced) step.
    model : keras.Model or None
        The Keras model whose step this is.
    ran_on : dict or None
        After the first call: node name -> device it ran on, read from the
        partition graphs TensorFlow built (nodes the runtime folded away or
        pruned are missing).
    """

    def __init__(self, placement, concrete_function, step_graph, specs, model=None):
        super().__init__(placement.graph_def, placement.schedule, placement.cluster,
                         placement.ops, placement.info)
        self.concrete_function = concrete_function
        self.model = model
        self.ran_on = None
        self._step_graph = step_graph
        self._specs = specs
        self._runner = None

    def _build(self):
        tf = _tf()
        sg = self._step_graph
        graph_def = self.graph_def

        # Imported inside a tf.function, whose automatic control dependencies
        # make every stateful op of the step run (a pruned wrap_function ran
        # the same graph ~2x slower).
        @tf.function(input_signature=sg["arg_specs"], autograph=False)
        def placed_step(*flat_args):
            g = tf.compat.v1.get_default_graph()
            input_map = dict(zip(sg["arg_names"], flat_args))
            for name, ext in sg["captures"]:
                input_map[name] = g.capture(ext)
            return tf.graph_util.import_graph_def(graph_def, input_map=input_map,
                                                  return_elements=sg["output_names"],
                                                  name=_SCOPE)

        return placed_step.get_concrete_function()

    def _flat_args(self, args):
        tf = _tf()
        sg = self._step_graph
        flat = tf.nest.flatten(args, expand_composites=True)
        want = sg["arg_specs"]
        if len(flat) != len(want):
            raise FddpsError(f"the placed step takes {len(want)} input tensors (as traced for "
                             f"{self._specs}), got {len(flat)}")
        out = []
        labels = self._input_labels(len(want))
        for k, (a, spec) in enumerate(zip(flat, want)):
            try:
                t = tf.convert_to_tensor(a, dtype=spec.dtype)
            except (TypeError, ValueError) as err:
                raise FddpsError(f"{labels[k]} of the placed step must be a {spec.dtype.name} "
                                 f"tensor of shape {spec.shape.as_list()}: {err}") from None
            if not spec.shape.is_compatible_with(t.shape):
                raise FddpsError(f"{labels[k]} of the placed step has shape {t.shape.as_list()}, "
                                 f"but the step was placed for shape {spec.shape.as_list()}; "
                                 "place it again for this shape (a Keras model: batch=(x, y) "
                                 "of the new shape)")
            out.append(t)
        return out

    def _input_labels(self, n):
        """What to call each flat input: ``x``/``y`` (with an index when nested) for a Keras
        step, ``argument k`` for a function step."""
        tf = _tf()
        names = ("x", "y") if self.model is not None else tuple(
            f"argument {k}" for k in range(len(self._specs)))
        labels = []
        for name, spec in zip(names, self._specs):
            leaves = len(tf.nest.flatten(spec, expand_composites=True))
            labels += [name] if leaves == 1 else [f"{name}[{j}]" for j in range(leaves)]
        return labels if len(labels) == n else [f"input {k}" for k in range(n)]

    def train_step(self, *args):
        """Run one placed step on the step's own variables; return its outputs.

        For a Keras model, ``train_step(x, y)``: like
        ``model.train_on_batch(x, y, return_dict=True)``, the metrics are reset
        first, so the logs (a dict of scalar tensors, ``"loss"`` among them)
        are this batch's. For a function step, its arguments, and its outputs
        in the function's structure.

        Raises
        ------
        FddpsError
            If the inputs do not match the shapes the step was placed for.
        """
        tf = _tf()
        from tensorflow.python.eager import context

        flat = self._flat_args(args)
        first = self._runner is None
        if first:
            self._runner = self._build()
        if self.model is not None:
            self.model.reset_metrics()
        # Eager ops on another task (the metric resets above, a user's
        # assignments, variable initialisers) are streamed to it, while the
        # placed function's parts run there by a separate request that can
        # overtake them (TF orders the two only through data inputs): a
        # metric count not yet reset halved a step's reported loss. So every
        # pending eager op finishes first.
        context.async_wait()
        ctx = context.context()
        if first:  # the partition graphs are built, and reported, once: on the first call
            # Once run metadata was on, TensorFlow keeps collecting the partition graphs
            # of functions instantiated later (other placed steps, verify's finalists):
            # drop them, so that ran_on is this step's own.
            ctx.export_run_metadata()
            ctx.enable_run_metadata()
        try:
            outs = self._runner(*flat)
        finally:
            if first:
                metadata = ctx.export_run_metadata()
                ctx.disable_run_metadata()
                names = {node.name for node in self.graph_def.node}
                self.ran_on = {n: d for n, d in _devices_ran(metadata).items() if n in names}
        outs = list(outs or [])[:len(self._step_graph["output_names"])]
        return _pack(self.concrete_function.structured_outputs, outs, tf)

    __call__ = train_step

    def summary(self) -> str:
        """:meth:`Placement.summary`, after a line on the step and where its variables stay."""
        sg = self._step_graph
        where = sorted({ext.device for name, ext in sg["captures"]
                        if name.split(":")[0] in sg["placeholders"]})
        what = (f"Keras model {self.model.name!r}: its train_step (as model.fit runs it)"
                if self.model is not None else
                f"tf.function step {self.concrete_function.name!r}")
        head = (f"{what}; its {len(sg['variables'])} variables stay where they are "
                f"({', '.join(where) or 'none'}), with the ops TensorFlow colocates with them")
        return head + "\n" + super().summary()

    def moved_ops(self) -> list:
        """``(node, placed device, device it ran on)`` for each op the runtime moved
        (empty when everything ran where placed); None before the first call."""
        from .devices import same_device

        if self.ran_on is None:
            return None
        want = self.devices
        return [(name, want[name], dev) for name, dev in sorted(self.ran_on.items())
                if name in want and want[name] and not same_device(want[name], dev)]


def _devices_ran(metadata):
    """Node name (of the placed graph) -> device, from a RunMetadata's function graphs."""
    prefix = _SCOPE + "/"
    ran = {}
    for fg in metadata.function_graphs:
        for part in fg.partition_graphs:
            for node in part.node:
                if node.name.startswith(prefix):
                    ran[node.name[len(prefix):]] = node.device
    return ran


def _pack(structure, flat, tf):
    """Put the flat output tensors back into the function's output structure."""
    leaves = tf.nest.flatten(structure, expand_composites=True)
    it = iter(flat)
    filled = [next(it) if isinstance(leaf, tf.Tensor) else leaf for leaf in leaves]
    return tf.nest.pack_sequence_as(structure, filled, expand_composites=True)

