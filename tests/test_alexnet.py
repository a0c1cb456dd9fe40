"""AlexNet (slim_models.alexnet): the single-tower "one weird trick" net
(Krizhevsky 2014, torchvision's ``alexnet``), its parameter count against
that source and against the layer arithmetic, its shapes at 224x224, and one
training step at CIFAR size."""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import slim_models  # noqa: E402
from slim_models import alexnet  # noqa: E402

v1 = tf.compat.v1


def _conv(k, cin, cout):
    return k * k * cin * cout + cout


def _fc(cin, cout):
    return cin * cout + cout


def test_reference_counts_follow_from_the_layers():
    # Single tower (one weird trick / torchvision): 64-192-384-256-256.
    single = (_conv(11, 3, 64) + _conv(5, 64, 192) + _conv(3, 192, 384)
              + _conv(3, 384, 256) + _conv(3, 256, 256)
              + _fc(6 * 6 * 256, 4096) + _fc(4096, 4096) + _fc(4096, 1000))
    assert single == alexnet.REFERENCE_PARAMS == 61_100_840
    # The 2012 two-tower net (96-256-384-384-256, conv2/4/5 grouped in 2):
    # a different model, about as big; we do not build it.
    two = (_conv(11, 3, 96) + _conv(5, 48, 256) + _conv(3, 256, 384)
           + _conv(3, 192, 384) + _conv(3, 192, 256)
           + _fc(6 * 6 * 256, 4096) + _fc(4096, 4096) + _fc(4096, 1000))
    assert two == alexnet.REFERENCE_PARAMS_2012_TWO_TOWER


def test_parameter_count_and_shapes_at_imagenet_size():
    assert "alexnet" in slim_models.BENCHMARK_MODELS
    assert slim_models.model_parameter_count("alexnet") == 61_100_840
    assert slim_models.SPECS["alexnet"].reference_params == 61_100_840
    with tf.Graph().as_default():
        L = alexnet.make_layers(0)
        images = tf.zeros([2, 224, 224, 3])
        logits, aux = alexnet.alexnet(L, images, 1000)
        g = v1.get_default_graph()
        shape = lambda name: g.get_tensor_by_name(name).shape.as_list()
        assert shape("alexnet/conv1/Relu:0") == [2, 55, 55, 64]
        assert shape("alexnet/pool1:0") == [2, 27, 27, 64]
        assert shape("alexnet/pool2:0") == [2, 13, 13, 192]
        assert shape("alexnet/pool5:0") == [2, 6, 6, 256]
        assert logits.shape.as_list() == [2, 1000]
        assert aux is None
        # No batch norm, no LRN: weight and bias of 8 layers.
        assert len(v1.trainable_variables()) == 16


def test_one_training_step_at_cifar_size():
    m = slim_models.build_training_graph("alexnet", 4, dataset="cifar10")
    assert m.logits.shape.as_list() == [4, 10]
    # CIFAR: the final map is 1x1, so fc6 reads 256 features.
    assert slim_models.count_parameters(m) == (
        _conv(11, 3, 64) + _conv(5, 64, 192) + _conv(3, 192, 384)
        + _conv(3, 384, 256) + _conv(3, 256, 256) + _fc(256, 4096)
        + _fc(4096, 4096) + _fc(4096, 10))
    with v1.Session(graph=m.graph) as sess:
        sess.run(m.init_op)
        losses = [sess.run(m.fetches())[1] for _ in range(2)]
    assert all(np.isfinite(losses))
    # Plus weight decay: the cross-entropy starts near ln(10).
    assert losses[0] > np.log(10) * 0.5
    assert losses[1] != losses[0]


def test_per_gpu_batch_is_flexflows():
    assert alexnet.PER_GPU_BATCH == 256
    with pytest.raises(ValueError, match="alexnet needs images"):
        slim_models.model_parameter_count("alexnet", image_size=5)
