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

Caveat for multi-step runs: at CIFAR size with batch 2, the last stage of the
batch-norm networks runs on 1x1 maps, so each batch norm normalises 2 values
per channel; its gradient is then ~1/sqrt(epsilon) large and these nets
diverge after a step or two (the loss reaches 1e9 or more; step 0 is fine).
Batch 8 trains normally. VGG-16 has no batch norm and trains at batch 2.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List, NamedTuple, Optional

import tensorflow as tf

from . import inception, nasnet, resnet, vgg
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


def _nasnet_forward(variant):
    def forward(L, images, num_classes, **options):
        return nasnet.nasnet(L, images, num_classes, variant=variant,
                             **options)
    return forward


def _resnet_forward(depth, version):
    def forward(L, images, num_classes):
        return resnet.resnet(L, images, num_classes, depth, version)
    return forward


SPECS: Dict[str, _Spec] = {
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
}

MODELS = ("vgg16", "inception_v3", "resnet50", "resnet200", "pnasnet_mobile",
          "nasnet_large")

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
    if preset.image_size is None and model is not None:
        preset = preset._replace(image_size=_spec(model).default_image_size)
    return preset


def _spec(name: str) -> _Spec:
    try:
        return SPECS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known: {MODELS}") from None


@dataclasses.dataclass
class TrainingGraph:
    """A built training graph and handles into it.

    Attributes:
      name, batch_size, image_size, num_classes, seed: the build arguments.
      graph: the `tf.Graph` (not finalized).
      images: ``[N, H, W, 3]`` float32, in-graph constant-seeded stateless
        random batch (same values on every step and every run).
      labels: ``[N]`` int32, likewise.
      logits: ``[N, num_classes]``; aux_logits: the auxiliary head's, or None.
      cross_entropy: mean softmax cross-entropy of the main head.
      loss: total loss (cross-entropy + 0.4 aux + weight decay), scalar.
      train_op: one momentum-SGD step plus the batch-norm updates.
      init_op: initialises all variables (including optimizer slots).
      global_step: int64 resource variable incremented by ``train_op``.
      trainable_variables: the model's trainable variables.
      options: the model options used (e.g. ``aux_head``).
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


def _build_forward(spec: _Spec, batch_size: int, image_size: int,
                   num_classes: int, seed: int, dropout: bool,
                   model_options: Dict[str, Any]):
    """Data and forward pass, in the current (fresh) graph."""
    # Graph-level seed: variable initialisers get deterministic op seeds.
    v1.set_random_seed(seed)
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
    return images, labels, logits, aux_logits, L


def model_parameter_count(name: str, image_size: Optional[int] = None,
                          num_classes: int = 1000, **model_options) -> int:
    """Trainable parameters of a model, building only its forward pass
    (batch 1, no gradients or optimizer: a few times faster than
    `build_training_graph` and nothing is run).

    Args:
      name: one of `MODELS`.
      image_size: None: the model's ImageNet size.
      num_classes: classes.
      **model_options: as for `build_training_graph` (e.g. ``aux_head``).
    Returns:
      the number of trainable scalars.
    """
    spec = _spec(name)
    size = spec.default_image_size if image_size is None else int(image_size)
    with tf.Graph().as_default():
        _build_forward(spec, 1, size, int(num_classes), 0, True, model_options)
        return sum(int(tf.TensorShape(v.shape).num_elements())
                   for v in v1.trainable_variables())


def build_training_graph(name: str, batch_size: int,
                         image_size: Optional[int] = None,
                         num_classes: Optional[int] = None, seed: int = 0, *,
                         dataset: Optional[str] = None,
                         learning_rate: float = 0.01, momentum: float = 0.9,
                         weight_decay: Optional[float] = None,
                         dropout: bool = True,
                         **model_options) -> TrainingGraph:
    """Build one training step of a model in a fresh `tf.Graph`.

    Args:
      name: one of `MODELS`.
      batch_size: examples per step.
      image_size: square input size; None: the model's ImageNet size (or the
        ``dataset``'s).
      num_classes: classes; None: 1000 (or the ``dataset``'s).
      seed: seeds the graph-level RNG (variable initial values) and the
        constant seeds of the stateless data, dropout and drop-path ops.
      dataset: ``"cifar10"`` or ``"imagenet"`` to fill in ``image_size`` and
        ``num_classes`` left as None.
      learning_rate, momentum: of the MomentumOptimizer.
      weight_decay: L2 coefficient; None: the model's TF-Slim value; 0: none.
      dropout: build dropout and drop-path (fixed stateless masks).
      **model_options: per-model options: ``aux_head`` (Inception-V3,
        NASNet, PNASNet; default True as in TF-Slim training), and for the
        NASNets any TF-Slim hparam of `nasnet.NASNET_LARGE_CONFIG` (e.g.
        ``num_cells``, ``num_conv_filters``).
    Returns:
      a `TrainingGraph`. Same arguments give the same GraphDef.
    """
    spec = _spec(name)
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
        images, labels, logits, aux_logits, L = _build_forward(
            spec, batch_size, image_size, num_classes, seed, dropout,
            model_options)
        trainable = v1.trainable_variables()

        with v1.name_scope("loss"):
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

    options = dict(model_options)
    return TrainingGraph(
        name=name, batch_size=batch_size, image_size=image_size,
        num_classes=num_classes, seed=seed, graph=graph, images=images,
        labels=labels, logits=logits, aux_logits=aux_logits,
        cross_entropy=xent, loss=loss, train_op=train_op, init_op=init_op,
        global_step=global_step, trainable_variables=list(trainable),
        options=options)


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
