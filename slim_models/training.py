"""Training graphs of the six networks: data, forward, loss, gradients and one
momentum-SGD step, in a fresh `tf.Graph` built with `tf.compat.v1` ops.

The graph is what TF-Slim's ``train_image_classifier.py`` builds for these
networks, minus the input pipeline:

* **Data**: ``images`` (``[N, H, W, 3]`` float32 in [-1, 1], NHWC) and
  ``labels`` (``[N]`` int32) are in-graph ``StatelessRandomUniformV2`` ops with
  constant seeds derived from ``seed``: every step and every run sees the same
  batch, no placeholder needs feeding (``feed_dict()`` returns ``{}``).
* **Loss**: mean softmax cross-entropy on one-hot labels, plus 0.4 x the
  auxiliary head's cross-entropy (Inception-V3, NASNet, PNASNet, when the aux
  head is built), plus L2 weight decay ``wd * sum(l2_loss(w))`` on the conv
  and fully-connected weights (the models' TF-Slim arg-scope values).
* **Step**: ``tf.compat.v1.train.MomentumOptimizer`` (momentum 0.9) applies
  the gradients and increments ``global_step``; the batch-norm moving-average
  updates are grouped with it into ``train_op``.

Variables are resource variables; nothing touches the default graph or any
global TensorFlow state.

Models that do not fit on one device (`LARGE_MODELS`, Tofu's and FlexFlow's
workloads): ``wide_resnet`` (options ``depth`` 50/101/152 and ``width``,
default WResNet-50-4) takes images like the six; the sequence models
``rnn_lm`` and ``nmt`` (options ``num_layers``, ``hidden_size``,
``vocab_size``, ``seq_length``, ``embedding_size``; defaults: FlexFlow's
configurations, see `rnn`) take ``[N, T]`` int32 word ids instead, drawn like
the images from constant seeds (``inputs``; ``images`` is None), predict the
next word at every step (``logits`` ``[N, T, vocab]``, ``labels`` ``[N, T]``)
and are trained on the mean sparse softmax cross-entropy over all steps, with
no weight decay.

Caveat for multi-step runs: at CIFAR size with batch 2, the last stage of the
batch-norm networks runs on 1x1 maps, so each batch norm normalises 2 values
per channel; its gradient is then ~1/sqrt(epsilon) large and these nets
diverge after a step or two (the loss reaches 1e9 or more; step 0 is fine).
Batch 8 trains normally. VGG-16 has no batch norm and trains at batch 2.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any, Callable, Dict, List, NamedTuple, Optional

import tensorflow as tf

from . import alexnet, inception, nasnet, resnet, rnn, rnntc, vgg
from .layers import Layers

v1 = tf.compat.v1

AUX_LOSS_WEIGHT = 0.4  # train_image_classifier.py


class _Spec(NamedTuple):
    default_image_size: int
    weight_decay: float
    make_layers: Callable[..., Layers]
    forward: Callable[..., Any]
    reference_params: int
    reference_source: str
    #: "images" ([N, H, W, 3] floats), "tokens" (a language model's [N, T]
    #: word ids) or "translation" (source and target word ids).
    inputs: str = "images"
    #: Model options and their defaults, for the models that check them.
    defaults: Optional[Dict[str, Any]] = None


def _nasnet_forward(variant):
    def forward(L, images, num_classes, **options):
        return nasnet.nasnet(L, images, num_classes, variant=variant,
                             **options)
    return forward


def _resnet_forward(depth, version):
    def forward(L, images, num_classes):
        return resnet.resnet(L, images, num_classes, depth, version)
    return forward


def _wide_resnet_forward(L, images, num_classes, depth, width):
    return resnet.resnet(L, images, num_classes, depth, 1, width)


def _rnn_lm_forward(L, inputs, num_layers, hidden_size, vocab_size,
                    seq_length, embedding_size=None):
    del seq_length  # the inputs' shape
    return rnn.rnn_lm(L, inputs["tokens"], num_layers, hidden_size,
                      vocab_size, embedding_size), None


def _rnntc_forward(L, inputs, seq_length, **options):
    del seq_length
    return rnntc.rnntc(L, inputs["tokens"], **options), None


def _nmt_forward(L, inputs, num_layers, hidden_size, vocab_size, seq_length,
                 embedding_size=None, attention_size=None):
    del seq_length
    return rnn.nmt(L, inputs["source"], inputs["target"], num_layers,
                   hidden_size, vocab_size, embedding_size,
                   attention_size), None


_SEQUENCE_DEFAULTS = dict(embedding_size=None)


SPECS: Dict[str, _Spec] = {
    "alexnet": _Spec(alexnet.DEFAULT_IMAGE_SIZE, alexnet.WEIGHT_DECAY,
                     alexnet.make_layers, alexnet.alexnet,
                     alexnet.REFERENCE_PARAMS,
                     "torchvision alexnet = one-weird-trick single tower "
                     "(Krizhevsky 2014), 61.1M"),
    "vgg16": _Spec(224, vgg.WEIGHT_DECAY, vgg.make_layers, vgg.vgg16,
                   vgg.REFERENCE_PARAMS,
                   "Keras VGG16 / VGG paper (138M)"),
    "inception_v3": _Spec(
        299, inception.WEIGHT_DECAY, inception.make_layers,
        inception.inception_v3, inception.REFERENCE_PARAMS,
        "Keras InceptionV3, no aux head, incl. 34,432 BN moving stats"),
    "resnet50": _Spec(224, resnet.WEIGHT_DECAY, resnet.make_layers,
                      _resnet_forward(50, 1),
                      resnet.REFERENCE_PARAMS["resnet50"],
                      "torchvision resnet50 = TF-Slim resnet_v1_50"),
    "resnet200": _Spec(224, resnet.WEIGHT_DECAY, resnet.make_layers,
                       _resnet_forward(200, 2),
                       resnet.REFERENCE_PARAMS["resnet200"],
                       "64.7M: timm resnet200 = torchvision layout, 3-24-36-3"),
    "pnasnet_mobile": _Spec(224, 4e-5, nasnet.make_layers,
                            _nasnet_forward("pnasnet_mobile"),
                            nasnet.REFERENCE_PARAMS_PNASNET_MOBILE,
                            "PNASNet paper Table 5 (5.1M), no aux head"),
    "nasnet_large": _Spec(331, 5e-5, nasnet.make_layers,
                          _nasnet_forward("nasnet_large"),
                          nasnet.REFERENCE_PARAMS_NASNET_LARGE,
                          "Keras NASNetLarge (88.9M, paper Table 2), "
                          "no aux head"),
    "wide_resnet": _Spec(
        224, resnet.WEIGHT_DECAY, resnet.make_layers, _wide_resnet_forward,
        round(resnet.TOFU_TABLE2_GIB[50, 4] * 2**30
              / resnet.TOFU_BYTES_PER_PARAMETER),
        "Tofu Table 2: WResNet-50-4 4.2 GB at 12 bytes/parameter",
        defaults=dict(depth=50, width=4)),
    "rnn_lm": _Spec(
        None, 0.0, rnn.make_layers, _rnn_lm_forward,
        rnn.rnn_lm_parameter_count(**rnn.FLEXFLOW_RNNLM)["total"],
        "FlexFlow RNNLM config (2x2048 LSTM, 10k words), analytic; "
        "no figure in the paper", inputs="tokens",
        defaults=dict(rnn.FLEXFLOW_RNNLM, **_SEQUENCE_DEFAULTS)),
    "rnntc": _Spec(
        None, 0.0, rnn.make_layers, _rnntc_forward,
        rnntc.rnntc_parameter_count(**rnntc.FLEXFLOW_RNNTC)["total"],
        "FlexFlow RNNTC config (4x1024 LSTM, Movie Reviews: 18,765 words, "
        "2 classes), analytic", inputs="classification",
        defaults=dict(rnntc.FLEXFLOW_RNNTC, **_SEQUENCE_DEFAULTS)),
    "nmt": _Spec(
        None, 0.0, rnn.make_layers, _nmt_forward,
        rnn.nmt_parameter_count(**rnn.FLEXFLOW_NMT)["total"],
        "FlexFlow NMT config (2+2x1024 LSTM, attention, 20k words), "
        "analytic; no figure in the paper", inputs="translation",
        defaults=dict(rnn.FLEXFLOW_NMT, attention_size=None,
                      **_SEQUENCE_DEFAULTS)),
}

#: The FD-DPS paper's six networks.
MODELS = ("vgg16", "inception_v3", "resnet50", "resnet200", "pnasnet_mobile",
          "nasnet_large")
#: Tofu's and FlexFlow's models that do not fit on one device at full size.
LARGE_MODELS = ("wide_resnet", "rnn_lm", "nmt")
#: Every model `build_training_graph` builds.
ALL_MODELS = MODELS + LARGE_MODELS
#: The strategy-search papers' benchmarks outside the FD-DPS paper's six
#: (built like them, by name; not in `ALL_MODELS`, whose experiments sweep
#: the FD-DPS and large-model sets): AlexNet (FlexFlow, the vertex-elimination
#: DP), per-GPU batch `alexnet.PER_GPU_BATCH`.
BENCHMARK_MODELS = ("alexnet", "rnntc")

#: The paper's Table 3 (TF 1.14 TF-Slim graphs): batch, operators, edges.
PAPER_TABLE3 = {
    "vgg16": (64, 3932, 5461),
    "inception_v3": (64, 12745, 21928),
    "resnet50": (64, 12692, 24345),
    "resnet200": (16, 45472, 82347),
    "pnasnet_mobile": (64, 62192, 91957),
    "nasnet_large": (16, 83206, 148548),
}


class DatasetPreset(NamedTuple):
    """Image size (None: the model's ImageNet default) and class count."""
    image_size: Optional[int]
    num_classes: int


_PRESETS = {"cifar10": DatasetPreset(32, 10),
            "imagenet": DatasetPreset(None, 1000)}


def dataset_preset(dataset: str, model: Optional[str] = None) -> DatasetPreset:
    """``(image_size, num_classes)`` of ``"cifar10"`` (32, 10) or
    ``"imagenet"`` (None, 1000). With ``model``, ImageNet's ``None`` becomes
    that model's default size (224, 299 or 331)."""
    try:
        preset = _PRESETS[dataset.lower()]
    except KeyError:
        raise ValueError(f"unknown dataset {dataset!r}; "
                         f"known: {sorted(_PRESETS)}") from None
    if model is not None and _spec(model).inputs != "images":
        raise ValueError(f"model {model!r} reads word ids, not images: it "
                         f"takes no dataset {dataset!r}")
    if preset.image_size is None and model is not None:
        preset = preset._replace(image_size=_spec(model).default_image_size)
    return preset


def _spec(name: str) -> _Spec:
    try:
        return SPECS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known: "
                         f"{ALL_MODELS + BENCHMARK_MODELS}") from None


def parse_model_options(items) -> Dict[str, Any]:
    """Model options from the command line: ``["depth=152", "width=10"]`` ->
    ``{"depth": 152, "width": 10}`` (values read as Python literals where
    they parse, else kept as strings).

    Raises:
      ValueError: naming an item that is not ``KEY=VALUE``.
    """
    import ast

    options = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"model option {item!r} is not KEY=VALUE")
        try:
            options[key.strip()] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            options[key.strip()] = value.strip()
    return options


def resolved_options(name: str, **options) -> Dict[str, Any]:
    """The options a model is built with: ``options`` over its defaults.

    Only the models that declare defaults (`LARGE_MODELS`) are checked; the
    six take their options as keyword arguments of their builders.

    Raises:
      ValueError: naming an option the model does not take.
    """
    spec = _spec(name)
    if spec.defaults is None:
        return dict(options)
    unknown = sorted(set(options) - set(spec.defaults))
    if unknown:
        raise ValueError(f"model {name!r} takes no option {unknown[0]!r}; "
                         f"its options: {sorted(spec.defaults)}")
    return {**spec.defaults, **options}


@dataclasses.dataclass
class TrainingGraph:
    """A built training graph and handles into it.

    Attributes
    ----------
    name, batch_size, image_size, num_classes, seed
        The build arguments (sequence models: ``image_size`` None,
        ``num_classes`` the vocabulary).
    graph : tf.Graph
        The graph (not finalized).
    images : tf.Tensor or None
        ``[N, H, W, 3]`` float32, in-graph constant-seeded stateless random
        batch (same values on every step and every run); None for the
        sequence models.
    labels : tf.Tensor
        ``[N]`` int32, likewise (``[N, T]`` next words for the sequence
        models).
    logits, aux_logits : tf.Tensor
        ``[N, num_classes]`` (``[N, T, vocab]``); the auxiliary head's, or None.
    cross_entropy : tf.Tensor
        Mean softmax cross-entropy of the main head.
    loss : tf.Tensor
        Total loss (cross-entropy + 0.4 aux + weight decay), scalar.
    train_op : tf.Operation
        One momentum-SGD step plus the batch-norm updates.
    init_op : tf.Operation
        Initialises all variables (including optimizer slots).
    global_step : tf.Variable
        int64 resource variable incremented by ``train_op``.
    trainable_variables : list
        The model's trainable variables.
    options : dict
        The model options used (e.g. ``aux_head``; every option with its
        default for `LARGE_MODELS`).
    inputs : dict
        The input tensors by name: ``{"images"}``, ``{"tokens"}``
        (``rnn_lm``, ``[N, T]`` int32) or ``{"source", "target"}`` (``nmt``).
    """
    name: str
    batch_size: int
    image_size: int
    num_classes: int
    seed: int
    graph: tf.Graph
    images: tf.Tensor
    labels: tf.Tensor
    logits: tf.Tensor
    aux_logits: Optional[tf.Tensor]
    cross_entropy: tf.Tensor
    loss: tf.Tensor
    train_op: tf.Operation
    init_op: tf.Operation
    global_step: Any
    trainable_variables: List[Any]
    options: Dict[str, Any]
    inputs: Dict[str, Any] = dataclasses.field(default_factory=dict)
    _graph_def: Any = dataclasses.field(default=None, repr=False)
    _graph_def_version: int = dataclasses.field(default=-1, repr=False)

    @property
    def graph_def(self):
        """``graph.as_graph_def()``, cached until the graph changes."""
        if self._graph_def is None or self._graph_def_version != self.graph.version:
            self._graph_def = self.graph.as_graph_def()
            self._graph_def_version = self.graph.version
        return self._graph_def

    def feed_dict(self) -> Dict[Any, Any]:
        """Nothing to feed: the data is generated in the graph."""
        return {}

    def fetches(self) -> List[Any]:
        """``[train_op, loss]``: what one training step runs."""
        return [self.train_op, self.loss]


def _build_sequence_forward(spec: _Spec, batch_size: int, seed: int,
                            options: Dict[str, Any]):
    """Word-id data (next-word targets) and a sequence model's forward
    pass, in the current (fresh) graph."""
    vocab, steps = int(options["vocab_size"]), int(options["seq_length"])
    with v1.name_scope("data"):
        # T + 1 words: the model reads the first T and predicts the last T.
        words = tf.random.stateless_uniform(
            [batch_size, steps + 1], seed=[seed, 1], minval=0, maxval=vocab,
            dtype=tf.int32, name="words")
        inputs = {"tokens": words[:, :-1]}
        labels = words[:, 1:]
        if spec.inputs == "classification":  # one label per sentence (rnntc)
            labels = tf.random.stateless_uniform(
                [batch_size], seed=[seed, 2], minval=0,
                maxval=int(options["num_classes"]), dtype=tf.int32, name="labels")
        if spec.inputs == "translation":
            inputs = {"source": tf.random.stateless_uniform(
                [batch_size, steps], seed=[seed, 3], minval=0, maxval=vocab,
                dtype=tf.int32, name="source"), "target": words[:, :-1]}
    L = spec.make_layers(seed)
    logits, aux_logits = spec.forward(L, inputs, **options)
    return inputs, labels, logits, aux_logits, L


def _build_forward(spec: _Spec, batch_size: int, image_size: int,
                   num_classes: int, seed: int, dropout: bool,
                   model_options: Dict[str, Any]):
    """Data and forward pass, in the current (fresh) graph; returns
    ``(inputs, labels, logits, aux_logits, layers)``."""
    # Graph-level seed: variable initialisers get deterministic op seeds.
    v1.set_random_seed(seed)
    if spec.inputs != "images":
        return _build_sequence_forward(spec, batch_size, seed, model_options)
    with v1.name_scope("data"):
        images = tf.random.stateless_uniform(
            [batch_size, image_size, image_size, 3], seed=[seed, 1],
            minval=-1.0, maxval=1.0, name="images")
        labels = tf.random.stateless_uniform(
            [batch_size], seed=[seed, 2], minval=0, maxval=num_classes,
            dtype=tf.int32, name="labels")
    L = spec.make_layers(seed)
    L.use_dropout = dropout
    logits, aux_logits = spec.forward(L, images, num_classes, **model_options)
    return {"images": images}, labels, logits, aux_logits, L


def _check_sequence_arguments(name: str, image_size, num_classes) -> None:
    if image_size is not None or num_classes is not None:
        raise ValueError(f"model {name!r} reads word ids: give vocab_size "
                         f"and seq_length, not image_size or num_classes")


def model_parameter_count(name: str, image_size: Optional[int] = None,
                          num_classes: Optional[int] = None,
                          **model_options) -> int:
    """Trainable parameters of a model, building only its forward pass
    (batch 1, no gradients or optimizer: a few times faster than
    `build_training_graph` and nothing is run).

    Parameters
    ----------
    name : str
        One of `ALL_MODELS`.
    image_size : int, optional
        None: the model's ImageNet size.
    num_classes : int, optional
        Classes; None: 1000.
    **model_options
        As for `build_training_graph` (e.g. ``aux_head``, ``depth``,
        ``hidden_size``).

    Returns
    -------
    int
        The number of trainable scalars.
    """
    spec = _spec(name)
    options = resolved_options(name, **model_options)
    if spec.inputs != "images":
        _check_sequence_arguments(name, image_size, num_classes)
    size = spec.default_image_size if image_size is None else int(image_size)
    classes = 1000 if num_classes is None else int(num_classes)
    with tf.Graph().as_default():
        _build_forward(spec, 1, size, classes, 0, True, options)
        return sum(int(tf.TensorShape(v.shape).num_elements())
                   for v in v1.trainable_variables())


def _positive_int(value, what: str) -> int:
    """``value`` as an int >= 1, else a ValueError naming ``what`` and the value."""
    whole = isinstance(value, numbers.Integral) or (
        isinstance(value, float) and value.is_integer())
    if isinstance(value, bool) or not whole or value < 1:
        raise ValueError(f"{what} must be a positive integer, got {value!r}")
    return int(value)


def build_training_graph(name: str, batch_size: int,
                         image_size: Optional[int] = None,
                         num_classes: Optional[int] = None, seed: int = 0, *,
                         dataset: Optional[str] = None,
                         learning_rate: float = 0.01, momentum: float = 0.9,
                         weight_decay: Optional[float] = None,
                         dropout: bool = True,
                         **model_options) -> TrainingGraph:
    """Build one training step of a model in a fresh `tf.Graph`.

    Parameters
    ----------
    name : str
        One of `ALL_MODELS`.
    batch_size : int
        Examples per step.
    image_size : int, optional
        Square input size; None: the model's ImageNet size (or the
        ``dataset``'s).
    num_classes : int, optional
        Classes; None: 1000 (or the ``dataset``'s).
    seed : int
        Seeds the graph-level RNG (variable initial values) and the constant
        seeds of the stateless data, dropout and drop-path ops.
    dataset : str, optional
        ``"cifar10"`` or ``"imagenet"`` to fill in ``image_size`` and
        ``num_classes`` left as None.
    learning_rate, momentum : float
        Of the MomentumOptimizer.
    weight_decay : float, optional
        L2 coefficient; None: the model's TF-Slim value; 0: none.
    dropout : bool
        Build dropout and drop-path (fixed stateless masks).
    **model_options
        Per-model options: ``aux_head`` (Inception-V3, NASNet, PNASNet;
        default True as in TF-Slim training), and for the NASNets any TF-Slim
        hparam of `nasnet.NASNET_LARGE_CONFIG` (e.g. ``num_cells``,
        ``num_conv_filters``); ``wide_resnet``: ``depth`` (50, 101, 152) and
        ``width`` (default 50 and 4, WResNet-50-4); ``rnn_lm`` and ``nmt``:
        ``num_layers``, ``hidden_size``, ``vocab_size``, ``seq_length``,
        ``embedding_size`` (``nmt`` also ``attention_size``), defaults
        FlexFlow's (`rnn.FLEXFLOW_RNNLM`, `rnn.FLEXFLOW_NMT`).

    Returns
    -------
    TrainingGraph
        Same arguments give the same GraphDef.

    Raises
    ------
    ValueError
        An unknown model or option, a batch size, image size or class count
        that is not a positive integer (named), or image arguments for a
        sequence model.

    Examples
    --------
    Tofu's RNN-6-4K, unrolled for 20 steps::

        m = build_training_graph("rnn_lm", 32, num_layers=6,
                                 hidden_size=4096, seq_length=20)
    """
    spec = _spec(name)
    batch_size = _positive_int(batch_size, "batch_size")
    if image_size is not None:
        image_size = _positive_int(image_size, "image_size")
    if num_classes is not None:
        num_classes = _positive_int(num_classes, "num_classes")
    options = resolved_options(name, **model_options)
    sequence = spec.inputs != "images"
    if sequence:
        if dataset is not None:
            dataset_preset(dataset, name)  # raises: no image dataset
        _check_sequence_arguments(name, image_size, num_classes)
        num_classes = int(options.get("num_classes", options["vocab_size"]))
    else:
        if dataset is not None:
            preset = dataset_preset(dataset, name)
            image_size = preset.image_size if image_size is None else image_size
            num_classes = preset.num_classes if num_classes is None else num_classes
        image_size = spec.default_image_size if image_size is None else int(image_size)
        num_classes = 1000 if num_classes is None else int(num_classes)
    batch_size = int(batch_size)
    wd = spec.weight_decay if weight_decay is None else weight_decay

    graph = tf.Graph()
    with graph.as_default():
        inputs, labels, logits, aux_logits, L = _build_forward(
            spec, batch_size, image_size, num_classes, seed, dropout,
            options)
        trainable = v1.trainable_variables()

        with v1.name_scope("loss"):
            if sequence:
                # Sparse labels: a one-hot [N, T, vocab] would be as big as
                # the logits.
                xent = tf.reduce_mean(
                    tf.nn.sparse_softmax_cross_entropy_with_logits(
                        labels=labels, logits=logits), name="cross_entropy")
            else:
                onehot = tf.one_hot(labels, num_classes)
                xent = tf.reduce_mean(tf.nn.softmax_cross_entropy_with_logits(
                    labels=onehot, logits=logits), name="cross_entropy")
            terms = [xent]
            if aux_logits is not None:
                aux = tf.reduce_mean(tf.nn.softmax_cross_entropy_with_logits(
                    labels=onehot, logits=aux_logits))
                terms.append(tf.multiply(AUX_LOSS_WEIGHT, aux,
                                         name="aux_loss"))
            if wd and L.regularized:
                with v1.name_scope("weight_decay"):
                    terms.append(tf.multiply(
                        wd, tf.add_n([tf.nn.l2_loss(w) for w in L.regularized]),
                        name="regularization"))
            loss = tf.add_n(terms, name="total_loss") if len(terms) > 1 \
                else tf.identity(xent, name="total_loss")

        global_step = v1.get_variable(
            "global_step", [], tf.int64, v1.zeros_initializer(),
            trainable=False, use_resource=True,
            collections=[v1.GraphKeys.GLOBAL_VARIABLES,
                         v1.GraphKeys.GLOBAL_STEP])
        opt = v1.train.MomentumOptimizer(learning_rate, momentum)
        grads = opt.compute_gradients(loss, var_list=trainable)
        apply_op = opt.apply_gradients(grads, global_step=global_step)
        if L.bn_updates:
            # One NoOp gathers the moving-average updates, so train_op has
            # two control inputs instead of hundreds.
            bn_group = tf.group(*L.bn_updates, name="bn_updates")
            train_op = tf.group(apply_op, bn_group, name="train_op")
        else:
            train_op = tf.group(apply_op, name="train_op")
        init_op = v1.global_variables_initializer()

    return TrainingGraph(
        name=name, batch_size=batch_size,
        image_size=None if sequence else image_size,
        num_classes=num_classes, seed=seed, graph=graph,
        images=inputs.get("images"),
        labels=labels, logits=logits, aux_logits=aux_logits,
        cross_entropy=xent, loss=loss, train_op=train_op, init_op=init_op,
        global_step=global_step, trainable_variables=list(trainable),
        options=options, inputs=inputs)


def count_parameters(model: TrainingGraph) -> int:
    """Number of trainable parameters (scalars) of a built model."""
    total = 0
    for var in model.trainable_variables:
        total += int(tf.TensorShape(var.shape).num_elements())
    return total


def step_graph_def(model: TrainingGraph):
    """The GraphDef restricted to what one training step runs: the ancestors
    (through data and control inputs) of ``train_op`` and ``loss``, in the
    GraphDef's order. Variables are included; initialisers are not."""
    graph_def = model.graph_def
    by_name = {node.name: node for node in graph_def.node}
    keep = set()
    stack = [model.train_op.name, model.loss.op.name]
    while stack:
        name = stack.pop()
        if name in keep:
            continue
        keep.add(name)
        for inp in by_name[name].input:
            stack.append(inp.lstrip("^").split(":")[0])
    out = v1.GraphDef()
    out.versions.CopyFrom(graph_def.versions)
    out.library.CopyFrom(graph_def.library)
    out.node.extend(node for node in graph_def.node if node.name in keep)
    return out


def graph_size(graph_def) -> Dict[str, int]:
    """``{"nodes", "edges", "data_edges", "control_edges"}`` of a GraphDef;
    an edge is one entry of a node's ``input`` list."""
    data = control = 0
    for node in graph_def.node:
        for inp in node.input:
            if inp.startswith("^"):
                control += 1
            else:
                data += 1
    return {"nodes": len(graph_def.node), "edges": data + control,
            "data_edges": data, "control_edges": control}
