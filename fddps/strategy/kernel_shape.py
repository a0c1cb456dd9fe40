"""The kernel shape of an op's part, for the GPU presets' kernel model: :func:`part_kernel_shape`.

A GPU preset times its FP32 convolutions and MatMuls by a model that also sees
the kernel's shape (``costmodel.kernel_model``: batch, channels, filter size,
stride, padding; a MatMul's M, N, K and transposes), read from an op-table row's
``kernel_shape``. The TensorFlow adapter fills it for every whole op
(:attr:`fddps.strategy.graph.OpInfo.kernel_shape`); a part of a split op has a
shape of its own, which is the op's shapes cut to the part's boxes. TensorFlow-free.
"""

from __future__ import annotations


def part_kernel_shape(op, dims, box, in_boxes, out_boxes):
    """The kernel shape string of the part of ``op`` covering ``box``, or None.

    Parameters
    ----------
    op : fddps.strategy.graph.OpInfo
        The whole op; None is returned where its ``kernel_shape`` is None (not an FP32
        convolution or MatMul, or a dimension unknown).
    dims : fddps.strategy.ops.OpDims
        The op's resolved iteration domain.
    box : dict of str -> (int, int)
        The part's range of each dimension.
    in_boxes, out_boxes : sequence of tuple of (int, int)
        The boxes of the op's inputs and outputs the part reads and writes.

    Returns
    -------
    str or None
        :func:`costmodel.kernel_model.tf_kernel_shape` of the boxes' extents and the op's
        attributes; None also where a spatial dimension (rows, columns) is split: such a
        part reads a halo and pads only at the image's borders, which the shape string
        (one padding per axis) cannot say, so it keeps the FLOPs-and-bytes time.

    Examples
    --------
    >>> from fddps.strategy.graph import OpInfo
    >>> from fddps.strategy.ops import resolve
    >>> op = OpInfo("y", "MatMul", input_shapes=((8, 16), (16, 4)), output_shapes=((8, 4),),
    ...             kernel_shape="M=4 N=8 K=16 transpose=NN")
    >>> part_kernel_shape(op, resolve(op), {"n": (0, 4), "c": (0, 4), "k": (0, 16)},
    ...                   [((0, 4), (0, 16)), ((0, 16), (0, 4))], [((0, 4), (0, 4))])
    'M=4 N=4 K=16 transpose=NN'
    """
    if op.kernel_shape is None:
        return None
    if any(tuple(box.get(d, (0, dims.extent[d]))) != (0, dims.extent[d]) for d in dims.halo):
        return None
    from costmodel.kernel_model import tf_kernel_shape

    ins = [tuple(b - a for a, b in bx) for bx in in_boxes]
    outs = [tuple(b - a for a, b in bx) for bx in out_boxes]
    return tf_kernel_shape(op.op_type, ins, outs[0] if outs else None, op.attrs)
