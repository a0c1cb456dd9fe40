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

Wide ResNets (``wide_resnet``): Tofu (Wang et al., EuroSys 2019, Section 7,
"WResNet") widens *every* convolution of a v1 bottleneck ResNet-50/101/152
by a scalar W (4 to 10): the root conv's 64 channels, each unit's bottleneck
and its 4x output, so weights grow as W^2 (the root conv's and the logits' as
W). We build exactly that (v1 layout, ``width`` multiplies every conv's
output channels; a fractional width such as 0.25 gives small test nets).
Tofu's Table 2 lists the "total weight tensor sizes (GB)" of WResNet-50/101/
152 at W = 4, 6, 8, 10 (4.2 to 65.1). Those figures are 12 bytes per
trainable parameter in GiB: weights, gradients and one optimizer slot in
float32 (our reading: it reproduces all twelve entries within 2.1%, see
`TOFU_TABLE2_GIB` and `parameter_count`; 4 bytes per parameter would give a
third of each).
"""

from __future__ import annotations

import tensorflow as tf

from .layers import Layers, channels, max_pool

v1 = tf.compat.v1

REFERENCE_PARAMS = {"resnet50": 25_557_032, "resnet200": 64_673_832}
DEFAULT_IMAGE_SIZE = 224
WEIGHT_DECAY = 1e-4  # TF-Slim resnet_arg_scope
BLOCKS = {"resnet50": (3, 4, 6, 3), "resnet101": (3, 4, 23, 3),
          "resnet152": (3, 8, 36, 3), "resnet200": (3, 24, 36, 3)}
BASE_DEPTHS = (64, 128, 256, 512)
ROOT_CHANNELS = 64

#: Tofu (EuroSys 2019) Table 2, "Total weight tensor sizes (GB)" of WResNet:
#: ``{(depth, width): GiB}``; 12 bytes per parameter (see the module doc).
TOFU_TABLE2_GIB = {
    (50, 4): 4.2, (50, 6): 9.6, (50, 8): 17.1, (50, 10): 26.7,
    (101, 4): 7.8, (101, 6): 17.1, (101, 8): 30.6, (101, 10): 47.7,
    (152, 4): 10.5, (152, 6): 23.4, (152, 8): 41.7, (152, 10): 65.1,
}
#: Bytes per parameter in Tofu's Table 2: weight, gradient, optimizer slot.
TOFU_BYTES_PER_PARAMETER = 12


def _widened(channels_: int, width: float) -> int:
    """``channels * width`` rounded, at least 1."""
    return max(1, int(round(channels_ * width)))


def layer_widths(depth: int, width: float = 1):
    """Channels of a (wide) bottleneck ResNet, shared by `resnet` and
    `parameter_count`.

    Args:
      depth: 50, 101, 152 or 200.
      width: multiplier of every conv's output channels (1: the plain net).
    Returns:
      ``(root_channels, [(units, bottleneck, output, stride)] per block)``.
    Raises:
      ValueError: for an unknown depth or a width <= 0.
    """
    if f"resnet{depth}" not in BLOCKS:
        raise ValueError(f"no ResNet of depth {depth!r}; known: "
                         f"{sorted(int(k[6:]) for k in BLOCKS)}")
    if not width > 0:
        raise ValueError(f"width must be > 0, got {width!r}")
    blocks = [(n, _widened(base, width), _widened(4 * base, width), stride)
              for n, base, stride in zip(BLOCKS[f"resnet{depth}"], BASE_DEPTHS,
                                         (2, 2, 2, 1))]
    return _widened(ROOT_CHANNELS, width), blocks


def parameter_count(depth: int, width: float = 1,
                    num_classes: int = 1000) -> int:
    """Trainable parameters of the v1 (wide) ResNet `resnet` builds, counted
    from the layer shapes without building anything.

    Equals the built graph's count (tests check it); with ``width=1`` and
    depth 50, torchvision's 25,557,032.

    Example: ``parameter_count(152, 10) * 12 / 2**30`` is 65.05, Tofu's
    Table 2 lists 65.1 (GB) for WResNet-152-10.
    """
    root, blocks = layer_widths(depth, width)

    def conv_bn(cin, cout, k=1):  # conv without bias + BN gamma and beta
        return k * k * cin * cout + 2 * cout

    total = conv_bn(3, root, 7)
    cin = root
    for n, bottleneck, out, _ in blocks:
        for _ in range(n):
            if cin != out:
                total += conv_bn(cin, out)
            total += (conv_bn(cin, bottleneck) + conv_bn(bottleneck, bottleneck, 3)
                      + conv_bn(bottleneck, out))
            cin = out
    return total + cin * num_classes + num_classes


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
           depth: int = 50, version: int = 1, width: float = 1):
    """Build a bottleneck ResNet's forward pass.

    Args:
      L: the layer factory.
      images: ``[N, H, W, 3]`` float32 (224 for ImageNet, 32 works: the
        last block then runs at 1x1).
      num_classes: width of the logits.
      depth: 50, 101, 152 or 200 (selects the block sizes).
      version: 1 (post-activation) or 2 (pre-activation).
      width: multiplier of every conv's output channels (Tofu's wide
        ResNets: 4 to 10); 1 builds the plain network.
    Returns:
      ``(logits [N, num_classes], None)``.
    """
    root, blocks = layer_widths(depth, width)
    unit_fn = _bottleneck_v1 if version == 1 else _bottleneck_v2
    scope = f"resnet_v{version}_{depth}"
    if width != 1:
        scope = f"wide_{scope}_w{width:g}".replace(".", "_")
    with v1.variable_scope(scope):
        if version == 1:
            net = _conv2d_same(L, images, root, 7, 2, "conv1")
        else:
            net = _conv2d_same(L, images, root, 7, 2, "conv1", bn=False,
                               activation=None, bias=True)
        net = max_pool(net, 3, 2, "SAME", name="pool1")
        for b, (n, bottleneck, out, stride) in enumerate(blocks, start=1):
            with v1.variable_scope(f"block{b}"):
                for u in range(1, n + 1):
                    with v1.variable_scope(f"unit_{u}"):
                        net = unit_fn(L, net, out, bottleneck,
                                      stride if u == n else 1)
        if version == 2:
            net = L.batch_norm(net, activation=tf.nn.relu, scope="postnorm")
        net = tf.reduce_mean(net, [1, 2], name="pool5")
        logits = L.dense(net, num_classes, scope="logits")
    return logits, None
