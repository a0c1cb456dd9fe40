"""ResNet-50 v1 (He et al., 2016) and ResNet-200 v2 (pre-activation; He et
al., "Identity Mappings in Deep Residual Networks", 2016), as TF-Slim's
``nets/resnet_v1.py`` and ``nets/resnet_v2.py`` build them.

Both use bottleneck units (1x1, 3x3, 1x1 with 4x expansion) in four blocks of
base depth 64, 128, 256, 512. As in TF-Slim, a block's stride sits in its
*last* unit (3x3 conv of the residual, a 1x1/stride max-pool "subsample" or a
strided 1x1 conv on the shortcut), strides 2, 2, 2, 1 after the 7x7/2 conv
and 3x3/2 max pool (total stride 32). Strided convolutions pad explicitly
(``conv2d_same``) and then run VALID. Batch norm has gamma and beta
(``resnet_arg_scope(batch_norm_scale=True)``), decay 0.997, epsilon 1e-5.

* v1 (``resnet_v1_50``, blocks 3-4-6-3): conv -> BN -> ReLU, the projection
  shortcut has BN, ``relu(shortcut + residual)``.
* v2 (``resnet_v2_200``, blocks 3-24-36-3): ``preact = relu(BN(x))`` feeds
  the projection shortcut and the residual; the shortcut projection and the
  last 1x1 conv of the residual have a bias and no BN; the root 7x7 conv has
  a bias and no BN; a final BN+ReLU ("postnorm") precedes pooling.

Logits: global average pool, then a fully connected layer with bias. TF-Slim
writes that layer as a 1x1 conv on the 1x1 pooled map; we use a MatMul (same
weights and math) because TensorFlow 2.21's CPU conv backprop kernels on a 1x1
map run one GEMV per example over the whole filter, tens of times slower than
the MatMul (the same holds for Inception-V3's logits and VGG's fc layers).

Reference parameter counts (1000 classes, 224x224; trainable, BN gamma and
beta counted, moving statistics not):

* ResNet-50 v1: 25,557,032 (torchvision ``resnet50`` and TF-Slim
  ``resnet_v1_50`` agree: same layers, no conv biases; Keras' ResNet50,
  25,636,712 with 25,583,592 trainable, differs because its convs carry
  biases).
* ResNet-200: 64,673,832, i.e. "64.7M" as timm's ``resnet200`` lists it: the
  torchvision layer table (the one giving 25,557,032 for ResNet-50) with
  blocks 3-24-36-3 (He et al. give no count for 200 layers). Slim's v2
  layout, built here, adds the biases of the shortcut projections, the conv3
  layers and the root conv, and moves BN to the unit inputs: 64,726,120,
  +0.08%.
"""

from __future__ import annotations

import tensorflow as tf

from .layers import Layers, channels, max_pool

v1 = tf.compat.v1

REFERENCE_PARAMS = {"resnet50": 25_557_032, "resnet200": 64_673_832}
DEFAULT_IMAGE_SIZE = 224
WEIGHT_DECAY = 1e-4  # TF-Slim resnet_arg_scope
BLOCKS = {"resnet50": (3, 4, 6, 3), "resnet200": (3, 24, 36, 3)}


def make_layers(seed: int, **_) -> Layers:
    """Slim's resnet_arg_scope: He-normal weights, BN with gamma."""
    return Layers(seed, v1.variance_scaling_initializer(scale=2.0),
                  bn_decay=0.997, bn_epsilon=1e-5, bn_scale=True)


def _conv2d_same(L: Layers, x, filters, kernel, stride, scope, bn=True,
                 activation=tf.nn.relu, bias=False):
    """Slim's ``resnet_utils.conv2d_same``: SAME for stride 1, otherwise an
    explicit symmetric pad and a VALID conv (so the output does not depend on
    whether the input size is even)."""
    if stride == 1:
        padding = "SAME"
    else:
        pad_total = kernel - 1
        beg = pad_total // 2
        x = tf.pad(x, [[0, 0], [beg, pad_total - beg],
                       [beg, pad_total - beg], [0, 0]])
        padding = "VALID"
    if bn:
        return L.conv_bn(x, filters, kernel, stride, padding,
                         activation=activation, scope=scope)
    return L.conv2d(x, filters, kernel, stride, padding, bias=bias,
                    activation=activation, scope=scope)


def _subsample(x, stride):
    """Slim's ``resnet_utils.subsample``: a 1x1/stride max pool."""
    if stride == 1:
        return x
    return max_pool(x, 1, stride, "SAME", name="shortcut")


def _bottleneck_v1(L: Layers, x, depth, bottleneck, stride):
    """Post-activation unit: relu(shortcut(x) + conv3(conv2(conv1(x))));
    returns ``[N, H/stride, W/stride, depth]``."""
    with v1.variable_scope("bottleneck_v1"):
        if channels(x) == depth:
            shortcut = _subsample(x, stride)
        else:
            shortcut = L.conv_bn(x, depth, 1, stride, activation=None,
                                 scope="shortcut")
        r = L.conv_bn(x, bottleneck, 1, scope="conv1")
        r = _conv2d_same(L, r, bottleneck, 3, stride, "conv2")
        r = L.conv_bn(r, depth, 1, activation=None, scope="conv3")
        return tf.nn.relu(shortcut + r)


def _bottleneck_v2(L: Layers, x, depth, bottleneck, stride):
    """Pre-activation unit: shortcut + conv3(conv2(conv1(relu(BN(x)))));
    returns ``[N, H/stride, W/stride, depth]``."""
    with v1.variable_scope("bottleneck_v2"):
        preact = L.batch_norm(x, activation=tf.nn.relu, scope="preact")
        if channels(x) == depth:
            shortcut = _subsample(x, stride)
        else:
            shortcut = L.conv2d(preact, depth, 1, stride, bias=True,
                                scope="shortcut")
        r = L.conv_bn(preact, bottleneck, 1, scope="conv1")
        r = _conv2d_same(L, r, bottleneck, 3, stride, "conv2")
        r = L.conv2d(r, depth, 1, bias=True, scope="conv3")
        return shortcut + r


def resnet(L: Layers, images: tf.Tensor, num_classes: int,
           depth: int = 50, version: int = 1):
    """Build a bottleneck ResNet's forward pass.

    Args:
      L: the layer factory.
      images: ``[N, H, W, 3]`` float32 (224 for ImageNet, 32 works: the
        last block then runs at 1x1).
      num_classes: width of the logits.
      depth: 50 or 200 (selects the block sizes).
      version: 1 (post-activation) or 2 (pre-activation).
    Returns:
      ``(logits [N, num_classes], None)``.
    """
    units = BLOCKS[f"resnet{depth}"]
    unit_fn = _bottleneck_v1 if version == 1 else _bottleneck_v2
    with v1.variable_scope(f"resnet_v{version}_{depth}"):
        if version == 1:
            net = _conv2d_same(L, images, 64, 7, 2, "conv1")
        else:
            net = _conv2d_same(L, images, 64, 7, 2, "conv1", bn=False,
                               activation=None, bias=True)
        net = max_pool(net, 3, 2, "SAME", name="pool1")
        for b, (n, base, stride) in enumerate(
                zip(units, (64, 128, 256, 512), (2, 2, 2, 1)), start=1):
            with v1.variable_scope(f"block{b}"):
                for u in range(1, n + 1):
                    with v1.variable_scope(f"unit_{u}"):
                        net = unit_fn(L, net, base * 4, base,
                                      stride if u == n else 1)
        if version == 2:
            net = L.batch_norm(net, activation=tf.nn.relu, scope="postnorm")
        net = tf.reduce_mean(net, [1, 2], name="pool5")
        logits = L.dense(net, num_classes, scope="logits")
    return logits, None
