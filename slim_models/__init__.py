"""Training graphs of the FD-DPS paper's six networks, with no download.

VGG-16, Inception-V3, ResNet-50 (v1), ResNet-200 (v2), PNASNet-5 Mobile and
NASNet-A Large, written as TF-Slim defines them but with `tf.compat.v1`
resource variables and plain `tf.nn` ops (no `tf_slim`, no Keras), so that a
training step is a plain, stable op graph.

Usage::

    import slim_models
    m = slim_models.build_training_graph("resnet50", batch_size=8,
                                         image_size=32, num_classes=10)
    with tf.compat.v1.Session(graph=m.graph) as sess:
        sess.run(m.init_op)
        _, loss = sess.run([m.train_op, m.loss])

The input batch is generated in the graph from constant seeds (no feeding),
identical on every step and run.

Trainable parameters at ImageNet size, 1000 classes, without auxiliary heads
(`model_parameter_count`), and what batch norm trains:

==============  ===========  ===========================  ==================
model           ours         reference                    BN trainable
==============  ===========  ===========================  ==================
vgg16           138,357,544  138,357,544 (Keras VGG16)    (no BN)
inception_v3     23,817,352  23,851,784 (Keras, incl.     beta only
                             34,432 moving stats)
resnet50         25,557,032  25,557,032 (torchvision)     gamma and beta
resnet200        64,726,120  64,673,832 (64.7M, timm)     gamma and beta
pnasnet_mobile    5,064,487  5.1M (PNASNet paper)         gamma and beta
nasnet_large     88,753,150  88,949,818 (Keras, incl.     gamma and beta
                             196,668 moving stats)
==============  ===========  ===========================  ==================

Models that do not fit on one device (`LARGE_MODELS`; Tofu's and FlexFlow's
workloads, see `resnet` and `rnn` for sources and counts):
``wide_resnet`` (``depth`` 50/101/152, ``width``: Tofu's WResNets),
``rnn_lm`` (multi-layer LSTM language model, statically unrolled) and
``nmt`` (encoder-decoder LSTM with attention)::

    m = slim_models.build_training_graph("wide_resnet", 8, dataset="cifar10",
                                         depth=152, width=10)
    m = slim_models.build_training_graph("rnn_lm", 64)   # FlexFlow's RNNLM

AlexNet (``"alexnet"``, `BENCHMARK_MODELS`: FlexFlow's and the
vertex-elimination DP's benchmark, the single-tower one-weird-trick net,
61,100,840 parameters as torchvision's) and FlexFlow's RNNTC (``"rnntc"``)
are built the same way.

See `training` for the graph's contents and
the model modules (`vgg`, `inception`, `resnet`, `nasnet`, `rnn`) for the
architectures and their reference parameter counts.
"""

from .training import (ALL_MODELS, BENCHMARK_MODELS, LARGE_MODELS, MODELS, PAPER_TABLE3,
                       SPECS, DatasetPreset, TrainingGraph,
                       build_training_graph, count_parameters,
                       dataset_preset, graph_size, model_parameter_count,
                       parse_model_options, resolved_options, step_graph_def)

__all__ = [
    "ALL_MODELS", "BENCHMARK_MODELS", "LARGE_MODELS", "MODELS", "PAPER_TABLE3", "SPECS",
    "DatasetPreset", "TrainingGraph", "build_training_graph",
    "count_parameters", "dataset_preset", "graph_size",
    "model_parameter_count", "parse_model_options", "resolved_options",
    "step_graph_def",
]
