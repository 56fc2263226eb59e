"""Convolution and pooling over (N, C, H, W) images: conv2d and its two VJP products, max_pool2d,
avg_pool2d, adaptive_avg_pool2d and their gradients.

How F.conv2d, F.conv1d and the pools use them::

    %3 = conv2d[dilation=(1,1), groups=1, padding=(1,1,1,1), stride=(1,1)] %x, %w, %b : f32[8,16,12,12]
    %9 = conv2d_grad_input[..., input_size=(12,12)] %g, %w                            : f32[8,3,12,12]
    %10 = conv2d_grad_weight[..., kernel_size=(3,3)] %x, %g                            : f32[16,3,3,3]

conv1d is conv2d on (N, C, 1, L) views. Padding is (top, bottom, left, right): torch's
``padding="same"`` pads an even kernel more on the bottom and right.

Lowering. On the CPU each conv product is one numba kernel over blocks of samples (a parallel cell
each): a sample's planes are copied into zero-bordered padded planes, so each tap is one strided
window of them (no bounds tests), and the sample's columns (G, C/G*KH*KW, Ho*Wo) feed BLAS inside
the kernel (numba's np.dot), in cache. The forward multiplies each group's weight by the sample's
columns straight into the sample's block of (N, O, Ho, Wo), adds the bias in place, and then
applies the elementwise group that reads the conv's result, when the fusion pass folded one into
the conv (``Lowering.epilogue``, cpu only: the cuda kernels take no epilogue; see
bendc/kernels/epilogue.py), to that block; the conv's own result is then written only if another
kernel reads it. The input gradient is W^T @ g per (sample, group) (g read in place)
followed by col2im, accumulated per (sample, channel) plane in tap order, so no two threads write
one element; the weight gradient is columns @ g^T per (sample, group), summed over the batch and
transposed, the columns recomputed from x rather than saved. On cuda the forward is an implicit GEMM: TILE x TILE
tiles of the weight and of the im2col matrix (computed on the fly, never stored) in shared memory;
the gradients are implicit GEMMs too (bendc/ops/conv_cuda.py: the input gradient one per stride
phase, the weight gradient's long reduction split over the threads of a block; no atomics, so the
sums have a fixed order).

Pools are one cell per output element; their gradients route each output's gradient back in
output order, on the CPU as a scatter per (sample, channel) plane, on cuda as a gather per input
element over the windows that hold it (the same order, so the two targets agree bit for bit).
A max pool whose windows tile the input (kernel == stride, no padding or dilation, floor mode:
the common 2x2/2) has its own CPU loops, the taps unrolled, its gradient writing each dx tile once
(no clearing pass), with the same values bit for bit.
max_pool2d's gradient recomputes each window's argmax from x (never stores indices), with torch's
rule: the first maximum in the window, a NaN taken as the maximum. avg_pool2d sums each window in
float32 in row order and divides once, as PyTorch's CPU kernel does; adaptive_avg_pool2d divides
by the window's height, then by its width, as PyTorch does.

The conv products are linear in each operand, so their VJPs are the other two products; a pooled
gradient of an average is the average's adjoint, so avg_pool2d_grad's VJP is avg_pool2d.
"""
from __future__ import annotations

import numpy as np

from bendc.ir.types import numel
from bendc.kernels.epilogue import Epilogue
from bendc.kernels import cuda_kit as kit
from bendc.kernels import cpu_policy as policy
from bendc.kernels.cpu_kit import njit_decorator
from bendc.ops import conv_cuda
from bendc.ops.base import InferError, Lowering, define_op, require_float

CONV_TILE = 16
CONV_ATTRS = ("stride", "padding", "dilation", "groups")


# ------------------------------------------------------------------ geometry
def conv_output_size(size: int, kernel: int, stride: int, low: int, high: int, dilation: int) -> int:
    """PyTorch's convolution output length along one axis."""
    return (size + low + high - dilation * (kernel - 1) - 1) // stride + 1


def pool_output_size(size: int, kernel: int, stride: int, pad: int, dilation: int, ceil_mode: bool) -> int:
    """PyTorch's pooling_output_shape: floor or ceil, and a last window never starting in the right padding."""
    extent = size + 2 * pad - dilation * (kernel - 1) - 1 + (stride - 1 if ceil_mode else 0)
    out = extent // stride + 1
    if ceil_mode and (out - 1) * stride >= size + pad:
        out -= 1
    return out


def _pair(value, name: str, count: int = 2) -> tuple[int, ...]:
    if not (isinstance(value, tuple) and len(value) == count and all(isinstance(v, int) for v in value)):
        raise InferError(f"{name} must be a tuple of {count} ints, got {value!r}")
    return value


def _image(x, op: str) -> None:
    if x.ndim != 4:
        raise InferError(f"{op} needs a 4-D (N, C, H, W) input, got {x}")


def _conv_geometry(x_shape, w_shape, attrs, op: str) -> tuple[int, int]:
    """(Ho, Wo) of a conv of x by w, or InferError for shapes torch refuses."""
    stride = _pair(attrs["stride"], "stride")
    dilation = _pair(attrs["dilation"], "dilation")
    top, bottom, left, right = _pair(attrs["padding"], "padding", 4)
    groups = attrs["groups"]
    if min(stride) < 1 or min(dilation) < 1 or min(top, bottom, left, right) < 0:
        raise InferError(f"needs positive stride and dilation and non-negative padding, got stride {stride}, "
                         f"dilation {dilation}, padding {attrs['padding']}")
    if not isinstance(groups, int) or groups < 1:
        raise InferError(f"groups must be a positive int, got {groups!r}")
    n, c, h, w = x_shape
    o, cg, kh, kw = w_shape
    if c % groups or o % groups:
        raise InferError(f"groups={groups} must divide the {c} input channels and the {o} output channels")
    if cg != c // groups:
        raise InferError(f"weight [{o},{cg},{kh},{kw}] needs {c // groups} input channels per group "
                         f"({c} channels, groups={groups}), got {cg}")
    ho = conv_output_size(h, kh, stride[0], top, bottom, dilation[0])
    wo = conv_output_size(w, kw, stride[1], left, right, dilation[1])
    if ho < 1 or wo < 1:
        raise InferError(f"kernel {kh}x{kw} (dilation {dilation}) is larger than the padded input "
                         f"{h + top + bottom}x{w + left + right}")
    return ho, wo


def _infer_conv2d(types, attrs):
    require_float(types, "conv2d")
    if len(types) not in (2, 3):
        raise InferError(f"conv2d takes 2 or 3 operands (x, weight, bias), got {len(types)}")
    x, w = types[0], types[1]
    _image(x, "conv2d")
    if w.ndim != 4:
        raise InferError(f"conv2d needs a 4-D (O, C/groups, KH, KW) weight, got {w}")
    ho, wo = _conv_geometry(x.shape, w.shape, attrs, "conv2d")
    if len(types) == 3 and types[2].shape != (w.shape[0],):
        raise InferError(f"conv2d bias must be of shape [{w.shape[0]}] (one per output channel), got {types[2]}")
    return x.with_shape((x.shape[0], w.shape[0], ho, wo))


def _infer_conv2d_grad_input(types, attrs):
    require_float(types, "conv2d_grad_input")
    g, w = types
    h, wd = _pair(attrs["input_size"], "input_size")
    if g.ndim != 4 or w.ndim != 4:
        raise InferError(f"conv2d_grad_input needs a 4-D gradient and weight, got {g} and {w}")
    x_shape = (g.shape[0], w.shape[1] * attrs["groups"], h, wd)
    if g.shape[1:] != (w.shape[0], *_conv_geometry(x_shape, w.shape, attrs,
                                                                                  "conv2d_grad_input")):
        raise InferError(f"gradient {g} does not match weight {w} and input size {(h, wd)}")
    return g.with_shape(x_shape)


def _infer_conv2d_grad_weight(types, attrs):
    require_float(types, "conv2d_grad_weight")
    x, g = types
    _image(x, "conv2d_grad_weight")
    kh, kw = _pair(attrs["kernel_size"], "kernel_size")
    if g.ndim != 4:
        raise InferError(f"conv2d_grad_weight needs a 4-D gradient, got {g}")
    w_shape = (g.shape[1], x.shape[1] // max(attrs["groups"], 1), kh, kw)
    if g.shape != (x.shape[0], w_shape[0], *_conv_geometry(x.shape, w_shape, attrs,
                                                                            "conv2d_grad_weight")):
        raise InferError(f"gradient {g} does not match input {x} and kernel {(kh, kw)}")
    return x.with_shape(w_shape)


# ------------------------------------------------------------------ conv reference (float64 sums)
def _padded(x: np.ndarray, attrs) -> np.ndarray:
    top, bottom, left, right = attrs["padding"]
    return np.pad(x.astype(np.float64), ((0, 0), (0, 0), (top, bottom), (left, right)))


def _taps(kh: int, kw: int, ho: int, wo: int, attrs):
    """(i, j, rows slice, columns slice) of each kernel tap into the padded input."""
    (sh, sw), (dh, dw) = attrs["stride"], attrs["dilation"]
    for i in range(kh):
        for j in range(kw):
            yield i, j, slice(i * dh, i * dh + (ho - 1) * sh + 1, sh), slice(j * dw, j * dw + (wo - 1) * sw + 1, sw)


def _columns_reference(x: np.ndarray, kh: int, kw: int, ho: int, wo: int, attrs) -> np.ndarray:
    """(N, C, KH, KW, Ho, Wo) float64: the input under each tap."""
    padded = _padded(x, attrs)
    cols = np.zeros(x.shape[:2] + (kh, kw, ho, wo))
    for i, j, rows, columns in _taps(kh, kw, ho, wo, attrs):
        cols[:, :, i, j] = padded[:, :, rows, columns]
    return cols


def _grouped(array: np.ndarray, axis: int, groups: int) -> np.ndarray:
    shape = array.shape
    return array.reshape(shape[:axis] + (groups, shape[axis] // groups) + shape[axis + 1:])


def _reference_conv2d(values, attrs):
    x, w = values[0], values[1]
    groups = attrs["groups"]
    o, _, kh, kw = w.shape
    ho, wo = _conv_geometry(x.shape, w.shape, attrs, "conv2d")
    cols = _grouped(_columns_reference(x, kh, kw, ho, wo, attrs), 1, groups)   # N G Cg KH KW Ho Wo
    weight = _grouped(w.astype(np.float64), 0, groups)                         # G Og Cg KH KW
    out = np.einsum("ngcijhw,gocij->ngohw", cols, weight).reshape(x.shape[0], o, ho, wo)
    if len(values) == 3:
        out = out + values[2].astype(np.float64)[None, :, None, None]
    return out.astype(np.float32)


def _reference_conv2d_grad_input(values, attrs):
    g, w = values
    groups = attrs["groups"]
    h, wd = attrs["input_size"]
    n, o, ho, wo = g.shape
    _, cg, kh, kw = w.shape
    top, bottom, left, right = attrs["padding"]
    cols = np.einsum("ngohw,gocij->ngcijhw", _grouped(g.astype(np.float64), 1, groups),
                     _grouped(w.astype(np.float64), 0, groups)).reshape(n, cg * groups, kh, kw, ho, wo)
    padded = np.zeros((n, cg * groups, h + top + bottom, wd + left + right))
    for i, j, rows, columns in _taps(kh, kw, ho, wo, attrs):
        padded[:, :, rows, columns] += cols[:, :, i, j]
    return padded[:, :, top:top + h, left:left + wd].astype(np.float32)


def _reference_conv2d_grad_weight(values, attrs):
    x, g = values
    groups = attrs["groups"]
    kh, kw = attrs["kernel_size"]
    n, o, ho, wo = g.shape
    cols = _grouped(_columns_reference(x, kh, kw, ho, wo, attrs), 1, groups)
    dw = np.einsum("ngohw,ngcijhw->gocij", _grouped(g.astype(np.float64), 1, groups), cols)
    return dw.reshape(o, x.shape[1] // groups, kh, kw).astype(np.float32)


# ------------------------------------------------------------------ conv VJPs
def _conv_attrs(attrs) -> dict:
    return {name: attrs[name] for name in CONV_ATTRS}


def vjp_conv2d(b, node, grad, needs):
    """d conv2d(x, w, b) = (conv2d_grad_input(g, w), conv2d_grad_weight(x, g), sum of g over N, H, W)."""
    x, w = node.inputs[0], node.inputs[1]
    attrs = _conv_attrs(node.attr)
    x_shape, w_shape = b.shape(x), b.shape(w)
    grad_x = (b.emit("conv2d_grad_input", (grad, w), input_size=x_shape[2:], **attrs) if needs[0] else None)
    grad_w = (b.emit("conv2d_grad_weight", (x, grad), kernel_size=w_shape[2:], **attrs) if needs[1] else None)
    contributions = [grad_x, grad_w]
    if len(node.inputs) == 3:
        contributions.append(b.sum(grad, (0, 2, 3), False) if needs[2] else None)
    return tuple(contributions)


def vjp_conv2d_grad_input(b, node, grad, needs):
    """conv2d_grad_input(g, w) is linear in each: d/dg = conv2d(grad, w), d/dw = conv2d_grad_weight(grad, g)."""
    g, w = node.inputs
    attrs = _conv_attrs(node.attr)
    return (b.emit("conv2d", (grad, w), **attrs) if needs[0] else None,
            b.emit("conv2d_grad_weight", (grad, g), kernel_size=b.shape(w)[2:], **attrs) if needs[1] else None)


def vjp_conv2d_grad_weight(b, node, grad, needs):
    """conv2d_grad_weight(x, g) is linear in each: d/dx = conv2d_grad_input(g, grad), d/dg = conv2d(x, grad)."""
    x, g = node.inputs
    attrs = _conv_attrs(node.attr)
    return (b.emit("conv2d_grad_input", (g, grad), input_size=b.shape(x)[2:], **attrs) if needs[0] else None,
            b.emit("conv2d", (x, grad), **attrs) if needs[1] else None)


# ------------------------------------------------------------------ conv on the CPU: im2col + BLAS
# Each conv product is one numba kernel over blocks of samples (a parallel cell each, with its own
# zero-bordered planes and columns): each sample's planes are copied into the padded planes, so
# every tap is one strided window of them (no bounds tests), and the columns (G, C/G*KH*KW, Ho*Wo)
# of a sample are multiplied by BLAS (numba's np.dot) inside the kernel, while they are in cache.
CONV_BLOCKS = 16  # a parallel kernel splits the batch in at most this many blocks of samples
# A sample's tap loops keep Ho and Wo as literals up to this many output positions (LLVM unrolls
# the rows whole: faster at 8x8); above, they are read from the shapes and each tap's row loop is
# vectorized instead (16x16, 1 channel: 2.5x faster than unrolled, measured at the CNN's sizes).
UNROLLED_POSITIONS = 64

_CONV_GEOMETRY = """    batch, channels, height, width = {image}.shape
    cg = channels // {groups}
    ho = (height + {pad_h} - {span_h} - 1) // {sh} + 1
    wo = (width + {pad_w} - {span_w} - 1) // {sw} + 1
    ph = (ho - 1) * {sh} + {span_h} + 1
    pw = (wo - 1) * {sw} + {span_w} + 1
    # the rows and columns of the padded plane that hold the image
    r0 = min({top}, ph)
    r1 = max(r0, min(ph, {top} + height))
    q0 = min({left}, pw)
    q1 = max(q0, min(pw, {left} + width))
    blocks = {blocks}"""
_PAD_SAMPLE = """            for c in range(channels):
                padded[c, r0:r1, q0:q1] = x[n, c, r0 - {top}:r1 - {top}, q0 - {left}:q1 - {left}]"""
_PLANES = """
        padded = np.zeros((channels, ph, pw), np.float32)"""
# Without padding the taps read the sample's planes in place: each tap's window is inside them (the
# padded plane's extent is at most the image's), and the copy was a quarter of im2col's time
# (the MNIST net's conv2, (32, 26, 26) a sample: 39.7 -> 30.6 us).
_UNPADDED_SAMPLE = """            padded = x[n]"""


def _unpadded(sizes: dict) -> bool:
    return sizes["top"] == sizes["left"] == sizes["pad_h"] == sizes["pad_w"] == 0


def _sample_planes(sizes: dict) -> dict:
    """The template's ``planes`` (the block's padded planes) and ``pad`` (sample n's planes into
    them) lines, or none and sample n's own planes where the conv has no padding."""
    if _unpadded(sizes):
        return dict(planes="", pad=_UNPADDED_SAMPLE)
    return dict(planes=_PLANES, pad=_PAD_SAMPLE.format(**sizes))
# one tap's walk over the output positions: im2col reads the padded plane, col2im adds into it
_UNROLLED_TAPS = """            for c in range(channels):
                pad = padded[c]
                row0 = (c % cg) * {kh} * {kw}
                for i in range({kh}):
                    for j in range({kw}):
                        line = col[c // cg, row0 + i * {kw} + j]
                        for oh in range({ho}):
                            for ow in range({wo}):
                                {unrolled}"""
_VECTOR_TAPS = """            for c in range(channels):
                g = c // cg
                row0 = (c % cg) * {kh} * {kw}
                for i in range({kh}):
                    for j in range({kw}):
                        for oh in range(ho):
                            for ow in range(wo):
                                {vector}"""
_IM2COL = dict(unrolled="line[{base}oh * {wo} + ow] = pad[i * {dh} + oh * {sh}, j * {dw} + ow * {sw}]",
               vector="col[g, row0 + i * {kw} + j, {base}oh * wo + ow] = padded[c, i * {dh} + oh * {sh}, j * {dw} + ow * {sw}]")
_COL2IM = dict(unrolled="pad[i * {dh} + oh * {sh}, j * {dw} + ow * {sw}] += line[oh * {wo} + ow]",
               vector="padded[c, i * {dh} + oh * {sh}, j * {dw} + ow * {sw}] += col[g, row0 + i * {kw} + j, oh * wo + ow]")


def _conv_sizes_cpu(attrs, kernel: tuple[int, int], output: tuple[int, int], parallel: bool) -> dict:
    (sh, sw), (dh, dw) = attrs["stride"], attrs["dilation"]
    top, bottom, left, right = attrs["padding"]
    return dict(kh=kernel[0], kw=kernel[1], ho=output[0], wo=output[1], sh=sh, sw=sw, dh=dh, dw=dw, top=top,
                left=left, pad_h=top + bottom, pad_w=left + right, span_h=(kernel[0] - 1) * dh,
                span_w=(kernel[1] - 1) * dw, groups=attrs["groups"], loop="prange" if parallel else "range",
                blocks=f"min(batch, {CONV_BLOCKS})" if parallel else "1", decorator=njit_decorator(parallel))


def _cpu_geometry(sizes: dict, image: str) -> str:
    """The kernel's first lines: the sizes, the padded plane's extent (what the taps reach), the
    image's place in it, the blocks."""
    return _CONV_GEOMETRY.format(image=image, **sizes)


def _cpu_taps(sizes: dict, walk: dict, base: str = "") -> str:
    """The loops of every tap of every channel of sample ``n`` over the output positions, with the
    statement ``walk`` (_IM2COL or _COL2IM; ``base`` offsets the columns of sample n in col)."""
    unrolled = sizes["ho"] * sizes["wo"] <= UNROLLED_POSITIONS
    template = _UNROLLED_TAPS if unrolled else _VECTOR_TAPS
    statement = walk["unrolled" if unrolled else "vector"].format(base=base, **sizes)
    return template.format(unrolled=statement, vector=statement, **sizes)


_CPU_CONV_FORWARD = '''
{decorator}
def _conv(x, weight, {parameters}):
    """Per block of samples: each sample's columns, then per group (O/G, C/G*KH*KW) @
    (C/G*KH*KW, Ho*Wo) by BLAS into the sample's output block, then the bias{what}."""
{geometry}
    groups, og, taps = weight.shape{setup}
    for block in {loop}(blocks):{planes}
        col = np.empty((groups, taps, ho * wo), np.float32){scratch}
        for n in range(block * batch // blocks, (block + 1) * batch // blocks):
{pad}
{columns}
            result = {result}
            for g in range(groups):
                np.dot(weight[g], col[g], result[g]){bias}{call}{finish}
'''


def _cpu_conv2d(attrs, ins, out, epilogue: Epilogue | None = None) -> str:
    """One numba kernel over blocks of samples: per sample im2col, one BLAS product per group
    written into the sample's block of (N, O, Ho, Wo), the bias added in place, then the fused
    elementwise epilogue (if the fusion pass gave the conv one) applied to the block while it is
    in cache; the conv's own result is then written only where something else reads it."""
    groups = attrs["groups"]
    o, _, kh, kw = ins[1].shape
    sizes = _conv_sizes_cpu(attrs, (kh, kw), out.shape[2:], policy.parallel("rows", max(ins[0].numel, out.numel)))
    has_bias = len(ins) == 3
    own = tuple(f"in{k}" for k in range(len(ins)))
    writes_value = epilogue is None or epilogue.value_output is not None
    parameters = (["bias"] if has_bias else []) + (["value"] if writes_value else [])
    if epilogue is not None:
        parameters += list(epilogue.inputs + epilogue.outputs)
    bias = ("\n            for g in range(groups):\n                for oc in range(og):\n"
            "                    b = bias[g * og + oc]\n                    for q in range(ho * wo):\n"
            "                        result[g, oc, q] += b") if has_bias else ""
    call = setup = finish = ""
    if epilogue is not None:
        call = f"\n            {epilogue.call('n', '1', f'result.reshape(1, {o}, ho, wo)', 'block')}"
        setup = "".join("\n    " + line for line in epilogue.setup("blocks"))
        finish = "".join("\n    " + line for line in epilogue.finish("blocks"))
    scratch = ("" if writes_value else
               "\n        block_out = np.empty((groups, og, ho * wo), np.float32)  # the conv's result: not written")
    source = _CPU_CONV_FORWARD.format(
        parameters=", ".join(parameters), what=", then the fused epilogue on the block" if epilogue else "",
        geometry=_cpu_geometry(sizes, "x"), columns=_cpu_taps(sizes, _IM2COL), **_sample_planes(sizes),
        scratch=scratch, result="value[n].reshape(groups, og, ho * wo)" if writes_value else "block_out",
        bias=bias, call=call, setup=setup, finish=finish, decorator=sizes["decorator"], loop=sizes["loop"])
    value = ("out0" if epilogue is None else epilogue.value_output) if writes_value else None
    arguments = ["x", "weight"] + (["np.ascontiguousarray(in2)"] if has_bias else []) + ([value] if value else [])
    if epilogue is not None and epilogue.arrays():
        arguments.append(epilogue.arrays())
    signature = epilogue.parameters(own) if epilogue is not None else ", ".join(own + ("out0",))
    return (("" if epilogue is None else epilogue.source) + source + f'''

def kernel({signature}):
    x = np.ascontiguousarray(in0)
    weight = np.ascontiguousarray(in1).reshape({groups}, {o // groups}, in1.shape[1] * {kh * kw})
    _conv({", ".join(arguments)})
''')


_CPU_CONV_GRAD_INPUT = '''
{decorator}
def _grad_input(grad, weight, dx):
    """Per block of samples: per group the sample's columns (C/G*KH*KW, O/G) @ (O/G, Ho*Wo) by
    BLAS, then col2im: each dx plane the sum of the column entries it fed, in tap order."""
{geometry}
    groups, taps, og = weight.shape
    for block in {loop}(blocks):{planes}
        col = np.empty((groups, taps, ho * wo), np.float32)
        for n in range(block * batch // blocks, (block + 1) * batch // blocks):
            for g in range(groups):
                np.dot(weight[g], grad[n, g], col[g])
{zero}
{columns}{copy}
'''

_GRAD_INPUT_COPY = """
            for c in range(channels):
                dx[n, c] = np.float32(0.0)
                dx[n, c, r0 - {top}:r1 - {top}, q0 - {left}:q1 - {left}] = padded[c, r0:r1, q0:q1]"""


def _cpu_conv2d_grad_input(attrs, ins, out) -> str:
    """One numba kernel over blocks of samples: per sample W^T @ g by BLAS, then col2im into dx
    (each plane summed in tap order in the sample's padded planes, in cache)."""
    groups = attrs["groups"]
    o, cg, kh, kw = ins[1].shape
    sizes = _conv_sizes_cpu(attrs, (kh, kw), ins[0].shape[2:], policy.parallel("rows", max(ins[0].numel, out.numel)))
    if _unpadded(sizes):  # col2im adds into dx's planes in place (see _UNPADDED_SAMPLE)
        lines = dict(planes="", zero="            padded = dx[n]\n            padded[:] = np.float32(0.0)", copy="")
    else:
        lines = dict(planes="\n        padded = np.empty((channels, ph, pw), np.float32)",
                     zero="            padded[:] = np.float32(0.0)", copy=_GRAD_INPUT_COPY.format(**sizes))
    source = _CPU_CONV_GRAD_INPUT.format(geometry=_cpu_geometry(sizes, "dx"), columns=_cpu_taps(sizes, _COL2IM),
                                         **lines, **sizes)
    return source + f'''

def kernel(in0, in1, out0):
    grad = np.ascontiguousarray(in0)
    batch, channels, ho, wo = grad.shape
    # per group W^T, (C/G*KH*KW, O/G)
    weight = np.ascontiguousarray(np.ascontiguousarray(in1).reshape({groups}, {o // groups}, {cg * kh * kw}).transpose(0, 2, 1))
    _grad_input(grad.reshape(batch, {groups}, {o // groups}, ho * wo), weight, out0)
'''


_CPU_CONV_COLUMNS = '''
{decorator}
def _columns(x, columns):
    """Per block of samples: each sample's columns, columns[n] (G, C/G*KH*KW, Ho*Wo)."""
{geometry}
    for block in {loop}(blocks):{planes}
        for n in range(block * batch // blocks, (block + 1) * batch // blocks):
            col = columns[n]
{pad}
{columns}
'''


_CPU_CONV_GRAD_WEIGHT = '''
{decorator}
def _grad_weight(x, grad, partial):
    """Per block of samples: each sample's columns (in cache), then per group columns @ g^T
    (C/G*KH*KW, Ho*Wo) @ (Ho*Wo, O/G) by BLAS, added to the block's partial[block, g] in sample order."""
{geometry}
    groups, taps, og = partial.shape[1], partial.shape[2], partial.shape[3]
    for block in {loop}(blocks):{planes}
        col = np.empty((groups, taps, ho * wo), np.float32)
        product = np.empty((taps, og), np.float32)
        total = partial[block]  # zeros
        for n in range(block * batch // blocks, (block + 1) * batch // blocks):
{pad}
{columns}
            rows = grad[n]
            for g in range(groups):
                np.dot(col[g], rows[g * og:(g + 1) * og].T, product)
                for t in range(taps):
                    for o in range(og):
                        total[g, t, o] += product[t, o]
'''
# The in-kernel products pay numba's np.dot call per sample: worth it where a sample's product is
# large; below, the batch's columns and numpy's batched product (few taps: the in-kernel form was 4x
# slower at 1 channel). The MNIST net (batch 64, 1 thread, step.profile): conv2's weight gradient,
# (288, 576) @ (576, 64) a sample, 33.2 -> 20.2 ms (its 42 MB of columns no longer go through
# memory), conv1's (9, 676) @ (676, 32) 1.34 -> 1.16 ms; the step 95.6 -> 81.7 ms at 1 thread,
# 80-86 -> 43.5 at 2 (numpy's batched product ran on OpenBLAS's own threads; these run on the pool).
GRAD_WEIGHT_IN_KERNEL = 1 << 16  # multiply-adds of one sample's product (taps x Ho*Wo x O/G) from which it runs in the kernel


def _cpu_conv2d_grad_weight(attrs, ins, out) -> str:
    """Large products (GRAD_WEIGHT_IN_KERNEL): per block of samples in one kernel, each sample's
    columns then columns @ g^T by BLAS, added into the block's partial sum; the blocks' sums added in
    block order. Otherwise the columns recomputed from x (numba, per sample), then columns @ g^T per
    (sample, group) by numpy's batched BLAS (g read in place), summed over the batch and transposed. (One product per block of
    samples inside the kernel, as the forward does, measured slower: 4x at 1 channel, where the
    product is (8, 16384) @ (16384, 9); numba's per-sample np.dot calls cost more than numpy's
    batched loop at 8 channels.)"""
    groups = attrs["groups"]
    parallel = policy.parallel("rows", max(ins[0].numel, ins[1].numel))
    sizes = _conv_sizes_cpu(attrs, out.shape[2:], ins[1].shape[2:], parallel)
    o, cg, kh, kw = out.shape
    ho, wo = ins[1].shape[2:]
    in_kernel = cg * kh * kw * ho * wo * (o // groups) >= GRAD_WEIGHT_IN_KERNEL
    source = (_CPU_CONV_GRAD_WEIGHT if in_kernel else _CPU_CONV_COLUMNS).format(
        geometry=_cpu_geometry(sizes, "x"), columns=_cpu_taps(sizes, _IM2COL), **_sample_planes(sizes), **sizes)
    source += """

def kernel(in0, in1, out0):
    x = np.ascontiguousarray(in0)
    grad = np.ascontiguousarray(in1)
    batch, channels, ho, wo = grad.shape
"""
    if in_kernel:
        return source + f'''    blocks = {sizes["blocks"]}
    partial = np.zeros((max(blocks, 1), {groups}, {cg * kh * kw}, channels // {groups}), np.float32)
    _grad_weight(x, grad.reshape(batch, channels, ho * wo), partial)
    total = partial[0].copy()
    for block in range(1, blocks):  # the blocks' sums in block order (no thread count in the bits)
        total += partial[block]
    out0.reshape({groups}, channels // {groups}, {cg * kh * kw})[...] = total.transpose(0, 2, 1)
'''
    return source + f'''    _, cg, kh, kw = out0.shape
    col = np.empty((batch, {groups}, cg * kh * kw, ho * wo), np.float32)
    _columns(x, col)
    # per (sample, group): (C/G*KH*KW, Ho*Wo) @ (Ho*Wo, O/G), BLAS, g^T read in place (OpenBLAS runs
    # this orientation 1.1-2x faster than g @ columns^T: 29.4 -> 18.3 ms for 64 x (64, 576) @ (576, 288));
    # then the sum over the samples, transposed into the output
    partial = np.matmul(col, grad.reshape(batch, {groups}, channels // {groups}, ho * wo).transpose(0, 1, 3, 2))
    out0.reshape({groups}, channels // {groups}, cg * kh * kw)[...] = np.sum(partial, axis=0).transpose(0, 2, 1)
'''


# ------------------------------------------------------------------ conv on cuda
def _conv_sizes(op: kit.CudaNode, x_shape, w_shape) -> dict:
    attrs = op.attrs
    (sh, sw), (dh, dw) = attrs["stride"], attrs["dilation"]
    top, _, left, _ = attrs["padding"]
    ho, wo = _conv_geometry(x_shape, w_shape, attrs, op.node.op)
    groups = attrs["groups"]
    return dict(N=x_shape[0], C=x_shape[1], H=x_shape[2], W=x_shape[3], O=w_shape[0], CG=w_shape[1],
                KH=w_shape[2], KW=w_shape[3], HO=ho, WO=wo, SH=sh, SW=sw, DH=dh, DW=dw, TOP=top, LEFT=left,
                G=groups, OG=w_shape[0] // groups)


def _cuda_conv2d(op: kit.CudaNode) -> kit.Kernels:
    """Implicit GEMM per group: out[g] (O/G, N*Ho*Wo) = W[g] (O/G, C/G*KH*KW) @ columns[g], the
    columns (im2col of x, zero in the padding) loaded tile by tile into shared memory and never
    stored; each thread computes one output element, the bias added last."""
    s = _conv_sizes(op, op.shapes[0], op.shapes[1])
    m, k_size, columns = s["OG"], s["CG"] * s["KH"] * s["KW"], s["N"] * s["HO"] * s["WO"]
    tile = CONV_TILE if max(m, columns) > 8 else min(CONV_TILE, 8)
    positions, taps = s["HO"] * s["WO"], s["KH"] * s["KW"]
    kw, cg = s["KW"], s["CG"]
    bias = f" + {op.read(2, ['o'])}" if len(op.shapes) == 3 else ""
    head = ["tile_a = cuda.shared.array((TILE, PADDED), numba.float32)",
            "tile_b = cuda.shared.array((TILE, PADDED), numba.float32)",
            "tx = cuda.threadIdx.x", "ty = cuda.threadIdx.y", "column = cuda.blockIdx.x * TILE + tx",
            f"columns = {op.count(columns, s['O'])}  # N*HO*WO, from the output's length (kit.length_of)"]
    per_tile = ["row = row_tile * TILE + ty",
            "acc = np.float32(0.0)",
            f"for tile in range({kit.ceil_div(k_size, tile)}):",
            "    # the weight tile: rows of output channels, columns of (c', i, j)",
            "    k = tile * TILE + tx",
            f"    if row < {m} and k < {k_size}:",
            f"        o = g * {m} + row",
            f"        c = k // {taps}",
            f"        i = k % {taps} // {kw}",
            f"        j = k % {kw}",
            f"        tile_a[ty, tx] = {op.read(1, ['o', 'c', 'i', 'j'])}",
            "    else:",
            "        tile_a[ty, tx] = np.float32(0.0)",
            "    # the column tile: x under tap k for output position `column` (0 in the padding)",
            "    k = tile * TILE + ty",
            "    value = np.float32(0.0)",
            f"    if column < columns and k < {k_size}:",
            f"        n = column // {positions}",
            f"        q = column % {positions}",
            f"        ih = q // {s['WO']} * {s['SH']} - {s['TOP']} + k % {taps} // {s['KW']} * {s['DH']}",
            f"        iw = q % {s['WO']} * {s['SW']} - {s['LEFT']} + k % {s['KW']} * {s['DW']}",
            f"        if ih >= 0 and ih < {s['H']} and iw >= 0 and iw < {s['W']}:",
            f"            c = g * {cg} + k // {taps}",
            f"            value = {op.read(0, ['n', 'c', 'ih', 'iw'])}",
            "    tile_b[ty, tx] = value",
            "    cuda.syncthreads()",
            "    for kk in range(TILE):",
            "        acc += tile_a[ty, kk] * tile_b[kk, tx]",
            "    cuda.syncthreads()",
            f"if row < {m} and column < columns:",
            f"    o = g * {m} + row",
            f"    n = column // {positions}",
            f"    out0[(n * {s['O']} + o) * {positions} + column % {positions}] = acc{bias}"]
    # columns on grid.x; channel tiles on y and groups on z, each block looping past 65535 of them
    row_tiles = kit.ceil_div(m, tile)
    body = head + kit.block_loop("g", "z", s["G"], kit.block_loop("row_tile", "y", row_tiles, per_tile))
    constants = f"\nTILE = {tile}\nPADDED = {tile + 1}  # a padding column against shared-memory bank conflicts\n"
    source = constants + kit.kernel_source("kernel", op.arguments, body,
                                           "Implicit GEMM: one output element per thread, TILE x TILE tiles.")
    grid = (kit.ceil_div(columns, tile), kit.grid_blocks(row_tiles), kit.grid_blocks(s["G"]))
    launch = kit.Launch("kernel", grid, (tile, tile, 1), 2 * tile * (tile + 1) * 4)
    return kit.Kernels(f"conv2d {s['G']} group(s) of [{m},{k_size}] @ [{k_size},{columns}] implicit GEMM, "
                       f"{tile}x{tile} tiles", source, [launch])


def _per_element(op: kit.CudaNode, split: list[str], body: list[str], what: str) -> kit.Kernels:
    """A grid-stride kernel: ``body`` (with the index statements of ``split`` it needs) once per
    element of the output, written to ``out0[cell]``."""
    body = kit.used(split, body) + body
    cells = numel(op.shape)
    source = kit.kernel_source("kernel", op.arguments, kit.grid_stride_loop(op.count(cells), body),  # length_of
                               f"{op.node.op}: {what}.")
    return kit.Kernels(f"{op.node.op} into [{','.join(map(str, op.shape))}], {what}", source,
                       [kit.grid_stride_launch("kernel", cells)])


def _cuda_conv2d_grad_input(op: kit.CudaNode) -> kit.Kernels:
    """Implicit GEMM per stride phase (bendc/ops/conv_cuda.py): dx[g] = W[g]^T @ g's columns."""
    return conv_cuda.grad_input_kernels(op, _conv_sizes(op, op.shape, op.shapes[1]), CONV_TILE)


def _cuda_conv2d_grad_weight(op: kit.CudaNode) -> kit.Kernels:
    """Implicit GEMM (bendc/ops/conv_cuda.py): dw[g] = g[g] @ im2col(x)^T, the reduction split in the block."""
    return conv_cuda.grad_weight_kernels(op, _conv_sizes(op, op.shapes[0], op.shape), CONV_TILE)


_CONV_DOC = "stride (sh, sw), padding (top, bottom, left, right), dilation (dh, dw), groups"

define_op(
    name="conv2d",
    arity=None,
    infer=_infer_conv2d,
    reference=_reference_conv2d,
    lowering=Lowering("matmul", cpu=_cpu_conv2d, cuda=_cuda_conv2d, epilogue=True),
    vjp=vjp_conv2d,
    attr_names=CONV_ATTRS,
    doc="`%3 = conv2d[dilation=(1,1), groups=1, padding=(1,1,1,1), stride=(1,1)] %x, %w, %b : f32[8,16,12,12]`: "
        f"torch's conv2d of x (N, C, H, W) by w (O, C/groups, KH, KW), bias (O,) optional; {_CONV_DOC}.",
)

# conv2d's two VJP products: (name, extra attribute, renderers and rule, doc)
for _name, _extra, _parts, _doc in (
        ("conv2d_grad_input", "input_size",
         (_infer_conv2d_grad_input, _reference_conv2d_grad_input, _cpu_conv2d_grad_input, _cuda_conv2d_grad_input,
          vjp_conv2d_grad_input),
         "`%9 = conv2d_grad_input[dilation=(1,1), groups=1, input_size=(12,12), padding=(1,1,1,1), stride=(1,1)] "
         "%g, %w : f32[8,3,12,12]`: conv2d's input gradient (the transposed convolution of g by w)."),
        ("conv2d_grad_weight", "kernel_size",
         (_infer_conv2d_grad_weight, _reference_conv2d_grad_weight, _cpu_conv2d_grad_weight,
          _cuda_conv2d_grad_weight, vjp_conv2d_grad_weight),
         "`%10 = conv2d_grad_weight[dilation=(1,1), groups=1, kernel_size=(3,3), padding=(1,1,1,1), stride=(1,1)] "
         "%x, %g : f32[16,3,3,3]`: conv2d's weight gradient (g correlated with x over the batch).")):
    _infer, _reference, _cpu, _cuda, _rule = _parts
    define_op(name=_name, arity=2, infer=_infer, reference=_reference,
              lowering=Lowering("matmul", cpu=_cpu, cuda=_cuda), vjp=_rule, attr_names=CONV_ATTRS + (_extra,),
              doc=_doc)


# ------------------------------------------------------------------ pooling windows
# A pool kind says how output index o along an axis maps to its window: the taps lo, lo + step, ..
# below hi (already clipped to the input), and for averages ``pool``, the window's length counting
# the padding (count_include_pad). Written twice, side by side: as Python (the reference) and as
# kernel source lines (both targets).
MAX, AVG, ADAPTIVE = "max", "avg", "adaptive"
POOL_KIND = {"max_pool2d": MAX, "max_pool2d_grad": MAX, "avg_pool2d": AVG, "avg_pool2d_grad": AVG,
             "adaptive_avg_pool2d": ADAPTIVE, "adaptive_avg_pool2d_grad": ADAPTIVE}


def pool_window(kind: str, attrs, axis: int, o: int, size: int, out_size: int) -> tuple[int, int, int, int]:
    """(lo, hi, step, pool) of output index ``o`` along ``axis``: PyTorch's CPU kernels' windows."""
    if kind == ADAPTIVE:
        lo, hi = (o * size) // out_size, ((o + 1) * size + out_size - 1) // out_size
        return lo, hi, 1, hi - lo
    k, s, p = attrs["kernel_size"][axis], attrs["stride"][axis], attrs["padding"][axis]
    if kind == MAX:
        d = attrs["dilation"][axis]
        lo = o * s - p
        hi = min(lo + (k - 1) * d + 1, size)
        while lo < 0:
            lo += d
        return lo, hi, d, 0
    lo = o * s - p
    hi = min(lo + k, size + p)
    pool = hi - lo
    return max(lo, 0), min(hi, size), 1, pool


def pool_window_lines(kind: str, attrs, axis: int, o: str, size: str, out_size: str) -> list[str]:
    """pool_window as kernel statements defining lo{axis}, hi{axis}, step{axis} (and pool{axis})."""
    a = axis
    if kind == ADAPTIVE:
        return [f"lo{a} = ({o} * {size}) // {out_size}", f"hi{a} = (({o} + 1) * {size} + {out_size} - 1) // {out_size}",
                f"step{a} = 1", f"pool{a} = hi{a} - lo{a}"]
    k, s, p = attrs["kernel_size"][axis], attrs["stride"][axis], attrs["padding"][axis]
    if kind == MAX:
        d = attrs["dilation"][axis]
        return [f"lo{a} = {o} * {s} - {p}", f"hi{a} = min(lo{a} + {(k - 1) * d + 1}, {size})",
                f"while lo{a} < 0:", f"    lo{a} += {d}", f"step{a} = {d}"]
    return [f"lo{a} = {o} * {s} - {p}", f"hi{a} = min(lo{a} + {k}, {size} + {p})", f"pool{a} = hi{a} - lo{a}",
            f"lo{a} = max(lo{a}, 0)", f"hi{a} = min(hi{a}, {size})", f"step{a} = 1"]


def pool_scale_lines(kind: str, attrs, total: str) -> list[str]:
    """``avg = total / divisor`` for an average window (adaptive: / height / width, as PyTorch)."""
    if kind == ADAPTIVE:
        return [f"avg = {total} / np.float32(hi0 - lo0) / np.float32(hi1 - lo1)"]
    if attrs["count_include_pad"]:
        return [f"avg = {total} / np.float32(pool0 * pool1)"]
    return [f"avg = {total} / np.float32((hi0 - lo0) * (hi1 - lo1))"]


def _pool_scale(kind: str, attrs, total, windows):
    (lo0, hi0, _, pool0), (lo1, hi1, _, pool1) = windows
    if kind == ADAPTIVE:
        return total / np.float32(hi0 - lo0) / np.float32(hi1 - lo1)
    if attrs["count_include_pad"]:
        return total / np.float32(pool0 * pool1)
    return total / np.float32((hi0 - lo0) * (hi1 - lo1))


def pooled_size(kind: str, attrs, in_size: tuple[int, int]) -> tuple[int, int]:
    if kind == ADAPTIVE:
        return tuple(attrs["output_size"])
    dilation = attrs.get("dilation", (1, 1))
    return tuple(pool_output_size(in_size[a], attrs["kernel_size"][a], attrs["stride"][a], attrs["padding"][a],
                                  dilation[a], attrs["ceil_mode"]) for a in range(2))


def _check_pool(kind: str, attrs, in_size, op: str) -> tuple[int, int]:
    """The pooled (Ho, Wo), or InferError for windows PyTorch refuses."""
    if kind == ADAPTIVE:
        out = _pair(attrs["output_size"], "output_size")
        if min(out) < 1:
            raise InferError(f"output_size must be positive, got {out}")
        return out
    kernel, stride, padding = (_pair(attrs[n], n) for n in ("kernel_size", "stride", "padding"))
    dilation = _pair(attrs["dilation"], "dilation") if kind == MAX else (1, 1)
    if min(kernel) < 1 or min(stride) < 1 or min(dilation) < 1 or min(padding) < 0:
        raise InferError(f"needs positive kernel_size, stride and dilation and non-negative padding, got "
                         f"kernel_size {kernel}, stride {stride}, padding {padding}, dilation {dilation}")
    for axis in range(2):  # torch's rule reads the kernel size, not its dilated extent
        if padding[axis] > kernel[axis] // 2:
            raise InferError(f"padding {padding} should be at most half of the kernel {kernel}")
    out = pooled_size(kind, attrs, in_size)
    if min(out) < 1:
        raise InferError(f"kernel {kernel} is larger than the padded input {in_size} (output {out})")
    return out


def _infer_pool(name: str):
    kind = POOL_KIND[name]

    def infer(types, attrs):
        require_float(types, name)
        x = types[0]
        if name.endswith("_grad"):
            in_size = tuple(attrs["input_size"]) if "input_size" in attrs else None
            if kind == MAX:  # (x, g)
                _image(x, name)
                g, in_size = types[1], x.shape[2:]
            else:  # (g): the input size is an attribute
                g = x
                in_size = _pair(attrs["input_size"], "input_size")
            _image(g, name)
            if g.shape[2:] != _check_pool(kind, attrs, in_size, name) or (kind == MAX and g.shape[:2] != x.shape[:2]):
                raise InferError(f"gradient {g} does not match the pooled input size {in_size}")
            return g.with_shape(g.shape[:2] + tuple(in_size))
        _image(x, name)
        return x.with_shape(x.shape[:2] + _check_pool(kind, attrs, x.shape[2:], name))

    return infer


# ------------------------------------------------------------------ pooling reference
def _windows(kind, attrs, in_size, out_size):
    """Each output position's ((lo, hi, step, pool) for H, for W), in output order."""
    rows = [pool_window(kind, attrs, 0, o, in_size[0], out_size[0]) for o in range(out_size[0])]
    columns = [pool_window(kind, attrs, 1, o, in_size[1], out_size[1]) for o in range(out_size[1])]
    for oh, row in enumerate(rows):
        for ow, column in enumerate(columns):
            yield oh, ow, (row, column)


def _argmax(x: np.ndarray, windows) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(max, row, column) over one window for every (n, c): the first max, a NaN taken (torch)."""
    (lo0, hi0, st0, _), (lo1, hi1, st1, _) = windows
    best = np.full(x.shape[:2], -np.inf, np.float32)
    rows = np.full(x.shape[:2], lo0)
    columns = np.full(x.shape[:2], lo1)
    for ih in range(lo0, hi0, st0):
        for iw in range(lo1, hi1, st1):
            value = x[:, :, ih, iw]
            take = (value > best) | np.isnan(value)
            best = np.where(take, value, best)
            rows = np.where(take, ih, rows)
            columns = np.where(take, iw, columns)
    return best, rows, columns


def _reference_pool(name: str):
    kind = POOL_KIND[name]

    def reference(values, attrs):
        x = values[0]
        out_size = pooled_size(kind, attrs, x.shape[2:])
        out = np.zeros(x.shape[:2] + out_size, np.float32)
        for oh, ow, windows in _windows(kind, attrs, x.shape[2:], out_size):
            if kind == MAX:
                out[:, :, oh, ow] = _argmax(x, windows)[0]
                continue
            (lo0, hi0, _, _), (lo1, hi1, _, _) = windows
            total = np.zeros(x.shape[:2], np.float32)
            for ih in range(lo0, hi0):
                for iw in range(lo1, hi1):
                    total = total + x[:, :, ih, iw]
            out[:, :, oh, ow] = _pool_scale(kind, attrs, total, windows)
        return out

    return reference


def _reference_pool_grad(name: str):
    kind = POOL_KIND[name]

    def reference(values, attrs):
        if kind == MAX:
            x, g = values
            in_size = x.shape[2:]
        else:
            (g,) = values
            in_size = tuple(attrs["input_size"])
        dx = np.zeros(g.shape[:2] + tuple(in_size), np.float32)
        n, c = np.meshgrid(np.arange(g.shape[0]), np.arange(g.shape[1]), indexing="ij")
        for oh, ow, windows in _windows(kind, attrs, in_size, g.shape[2:]):
            if kind == MAX:
                _, rows, columns = _argmax(x, windows)
                dx[n, c, rows, columns] += g[:, :, oh, ow]  # one element per (n, c): no repeats
                continue
            (lo0, hi0, _, _), (lo1, hi1, _, _) = windows
            delta = _pool_scale(kind, attrs, g[:, :, oh, ow], windows)
            dx[:, :, lo0:hi0, lo1:hi1] += delta[:, :, None, None]
        return dx

    return reference


# ------------------------------------------------------------------ pooling VJPs
def _pool_attrs(node) -> dict:
    return {k: v for k, v in node.attr.items() if k != "input_size"}


def vjp_max_pool2d(b, node, grad, needs):
    """The gradient goes to each window's argmax (recomputed from x by max_pool2d_grad)."""
    (x,) = node.inputs
    return (b.emit("max_pool2d_grad", (x, grad), **node.attr),)


def vjp_avg_pool2d(b, node, grad, needs):
    """Each output's gradient, divided as the forward divides, spread over its window."""
    (x,) = node.inputs
    return (b.emit(f"{node.op}_grad", (grad,), input_size=b.shape(x)[2:], **node.attr),)


def vjp_avg_pool2d_grad(b, node, grad, needs):
    """The gradient of an average pool is linear in g, and its adjoint is the average pool itself."""
    return (b.emit(node.op[:-len("_grad")], (grad,), **_pool_attrs(node)),)


# ------------------------------------------------------------------ pooling on the CPU
def _pool_cell_lines(kind: str, attrs, read: str) -> list[str]:
    """Statements computing one output cell's ``best`` (max, with its ``bi``, ``bj``) or ``avg``,
    after the window lines; ``read`` is the input element at (ih, iw)."""
    if kind == MAX:
        return ["best = np.float32(-np.inf)", "bi = lo0", "bj = lo1",
                "for ih in range(lo0, hi0, step0):",
                "    for iw in range(lo1, hi1, step1):",
                f"        value = {read}"] + _select_lines(("bi", "ih"), ("bj", "iw"))
    return (["total = np.float32(0.0)", "for ih in range(lo0, hi0):", "    for iw in range(lo1, hi1):",
             f"        total += {read}"] + pool_scale_lines(kind, attrs, "total"))


def _select_lines(*positions: tuple[str, str], indent: str = "        ") -> list[str]:
    """The window loop's step of a max: ``value`` wins when it is greater, or NaN (the first max; a
    NaN wins, torch's rule), and ``best`` and each (name, position) pair follow it, as selects: on
    random data a branch here is mispredicted every other tap (cpu: the native translator selects a
    conditional expression of names, runtime/native/translate.py). ``indent``: the window loop's body."""
    return ([f"{indent}wins = (value > best) | (value != value)", f"{indent}best = value if wins else best"]
            + [f"{indent}{name} = {at} if wins else {name}" for name, at in positions])


# the common non-overlapping max pool (2x2, stride 2): its own unrolled loops
def _tiled_max_pool(attrs) -> bool:
    """max_pool2d whose windows tile the input: kernel == stride, no padding or dilation, floor
    mode (every window whole, no two sharing an element)."""
    return (tuple(attrs["kernel_size"]) == tuple(attrs["stride"]) and tuple(attrs["padding"]) == (0, 0)
            and tuple(attrs["dilation"]) == (1, 1) and not attrs["ceil_mode"])


def _tiled_max_cell(attrs) -> list[str]:
    """Window (oh, ow)'s first max (a NaN wins, torch's rule) as ``best`` and its tap ``a * kw + b``
    as ``tap``, the taps unrolled: kernel-size literals. The tap is an int32, as wide as the floats
    beside it: LLVM sizes a loop's vectors by its widest type, and an int64 tap held the gradient's
    loops to 8 lanes (mnist_cnn's max_pool2d_grad, (64, 64, 24, 24), 1.79 -> 0.86 ms alone)."""
    kh, kw = attrs["kernel_size"]
    return ["best = np.float32(-np.inf)", "tap = np.int32(0)",
            f"for a in range({kh}):", f"    for b in range({kw}):",
            f"        value = x[plane, oh * {kh} + a, ow * {kw} + b]",
            f"        k = np.int32(a * {kw} + b)"] + _select_lines(("tap", "k"))


def _cpu_tiled_max_pool(attrs, ins, out) -> str:
    """max_pool2d over tiling windows: one (sample, channel) plane per parallel cell."""
    parallel = policy.parallel("rows", ins[0].numel)
    lines = ([njit_decorator(parallel), "def _pool(x, out):", "    ho, wo = out.shape[1], out.shape[2]",
              f"    for plane in {'prange' if parallel else 'range'}(x.shape[0]):",
              "        for oh in range(ho):", "            for ow in range(wo):"]
             + ["                " + line for line in _tiled_max_cell(attrs)]
             + ["                out[plane, oh, ow] = best"])
    return ("\n".join(lines) + "\n\n\n"
            "def kernel(in0, out0):\n"
            "    batch, channels, height, width = in0.shape\n"
            "    _pool(np.ascontiguousarray(in0).reshape(batch * channels, height, width),\n"
            "          out0.reshape(batch * channels, out0.shape[2], out0.shape[3]))\n")


# planes of a parallel work item of the tiled max pool's gradient (its scratch allocated once an item)
POOL_GRAD_PLANES = 32


def _cpu_tiled_max_pool_grad(attrs, ins, out) -> str:
    """max_pool2d_grad over tiling windows, a plane at a time: the windows' taps copied out of x
    into rows of the plane's windows (``values[tap, window]``), each window's argmax over them (a
    NaN wins, the first max on ties), then dx's rows written in memory order (0 + g at the argmax,
    as a cleared dx plus g would be, 0 elsewhere): dx is written once, only the rows and columns no
    window covers cleared apart. The argmaxes run over a plane's windows at once (144 for 12 x 12),
    in vectors, not over a row of windows (12: a row that short ran as scalar code) and are held as
    float32 numbers, so that dx's selects compare floats: on AVX2 (no mask registers) LLVM makes a
    float select on an integer or combined condition a branch, mispredicted on random data.
    mnist_cnn's (64, 64, 24, 24), 1 thread, Zen 3 EPYC: 9.4 -> 1.7 ms alone."""
    kh, kw = attrs["kernel_size"]
    taps = kh * kw
    parallel = policy.parallel("rows", out.numel)
    cell = (["best = np.float32(-np.inf)", "tap = np.float32(0.0)", f"for k in range({taps}):",
             "    value = values[k, i]"] + _select_lines(("tap", "np.float32(k)"), indent="    ") + ["taps[i] = tap"])
    lines = ([njit_decorator(parallel), "def _pool_grad(x, g, dx):", "    planes, height, width = dx.shape",
              "    ho, wo = g.shape[1], g.shape[2]", "    windows = ho * wo",
              f"    for item in {'prange' if parallel else 'range'}((planes + {POOL_GRAD_PLANES - 1}) // {POOL_GRAD_PLANES}):",
              f"        values = np.empty(({taps}, windows), np.float32)",
              "        taps = np.empty(windows, np.float32)",
              f"        for plane in range(item * {POOL_GRAD_PLANES}, min(planes, (item + 1) * {POOL_GRAD_PLANES})):",
              f"            for ih in range(ho * {kh}, height):", "                for iw in range(width):",
              "                    dx[plane, ih, iw] = np.float32(0.0)",
              f"            for ih in range(ho * {kh}):", f"                for iw in range(wo * {kw}, width):",
              "                    dx[plane, ih, iw] = np.float32(0.0)",
              "            for oh in range(ho):", f"                for a in range({kh}):",
              f"                    for b in range({kw}):", f"                        line = values[a * {kw} + b]",
              "                        for ow in range(wo):",
              f"                            line[oh * wo + ow] = x[plane, oh * {kh} + a, ow * {kw} + b]",
              "            for i in range(windows):"]
             + ["                " + line for line in cell]
             + ["            for oh in range(ho):", f"                for a in range({kh}):",
                "                    for ow in range(wo):",
                "                        delta = np.float32(0.0) + g[plane, oh, ow]",
                "                        tap = taps[oh * wo + ow]",
                f"                        for b in range({kw}):",
                f"                            dx[plane, oh * {kh} + a, ow * {kw} + b] = "
                f"delta if tap == np.float32(a * {kw} + b) else np.float32(0.0)"])
    return ("\n".join(lines) + "\n\n\n"
            "def kernel(in0, in1, out0):\n"
            "    batch, channels, height, width = out0.shape\n"
            "    g = np.ascontiguousarray(in1)\n"
            "    _pool_grad(np.ascontiguousarray(in0).reshape(batch * channels, height, width),\n"
            "               g.reshape(batch * channels, g.shape[2], g.shape[3]), out0.reshape(batch * channels, height, width))\n")


def _cpu_pool(name: str):
    kind = POOL_KIND[name]

    def render(attrs, ins, out) -> str:
        """One (sample, channel) plane per parallel cell, one output element per inner cell."""
        if kind == MAX and _tiled_max_pool(attrs):
            return _cpu_tiled_max_pool(attrs, ins, out)
        parallel = policy.parallel("rows", ins[0].numel)
        window_h = pool_window_lines(kind, attrs, 0, "oh", "height", "ho")
        window_w = pool_window_lines(kind, attrs, 1, "ow", "width", "wo")
        cell = _pool_cell_lines(kind, attrs, "x[plane, ih, iw]")
        result = "best" if kind == MAX else "avg"
        body = (window_h + ["for ow in range(wo):"] + ["    " + line for line in window_w + cell]
                + [f"    out[plane, oh, ow] = {result}"])
        lines = [njit_decorator(parallel), "def _pool(x, out):", "    planes, height, width = x.shape",
                 "    ho, wo = out.shape[1], out.shape[2]",
                 f"    for plane in {'prange' if parallel else 'range'}(planes):",
                 "        for oh in range(ho):"] + ["            " + line for line in body]
        return ("\n".join(lines) + "\n\n\n"
                "def kernel(in0, out0):\n"
                "    batch, channels, height, width = in0.shape\n"
                "    _pool(np.ascontiguousarray(in0).reshape(batch * channels, height, width),\n"
                "          out0.reshape(batch * channels, out0.shape[2], out0.shape[3]))\n")

    return render


def _cpu_pool_grad(name: str):
    kind = POOL_KIND[name]

    def render(attrs, ins, out) -> str:
        """One (sample, channel) plane per parallel cell: clear the plane's dx, then add each output's
        gradient to its argmax (max) or spread it over its window (averages), in output order."""
        if kind == MAX and _tiled_max_pool(attrs):
            return _cpu_tiled_max_pool_grad(attrs, ins, out)
        parallel = policy.parallel("rows", out.numel)
        window_h = pool_window_lines(kind, attrs, 0, "oh", "height", "ho")
        window_w = pool_window_lines(kind, attrs, 1, "ow", "width", "wo")
        if kind == MAX:
            cell = _pool_cell_lines(kind, attrs, "x[plane, ih, iw]") + ["dx[plane, bi, bj] += g[plane, oh, ow]"]
            parameters, grad = "x, g, dx", "in1"
        else:
            cell = (pool_scale_lines(kind, attrs, "g[plane, oh, ow]")
                    + ["for ih in range(lo0, hi0):", "    for iw in range(lo1, hi1):",
                       "        dx[plane, ih, iw] += avg"])
            parameters, grad = "g, dx", "in0"
        body = window_h + ["for ow in range(wo):"] + ["    " + line for line in window_w + cell]
        lines = [njit_decorator(parallel), f"def _pool_grad({parameters}):", "    planes, height, width = dx.shape",
                 "    ho, wo = g.shape[1], g.shape[2]",
                 f"    for plane in {'prange' if parallel else 'range'}(planes):",
                 "        for ih in range(height):", "            for iw in range(width):",
                 "                dx[plane, ih, iw] = np.float32(0.0)",
                 "        for oh in range(ho):"] + ["            " + line for line in body]
        x_argument = ("np.ascontiguousarray(in0).reshape(batch * channels, height, width), "
                      if kind == MAX else "")
        arguments = "in0, in1, out0" if kind == MAX else "in0, out0"
        return ("\n".join(lines) + "\n\n\n"
                f"def kernel({arguments}):\n"
                "    batch, channels, height, width = out0.shape\n"
                f"    g = np.ascontiguousarray({grad})\n"
                f"    _pool_grad({x_argument}g.reshape(batch * channels, g.shape[2], g.shape[3]),\n"
                "               out0.reshape(batch * channels, height, width))\n")

    return render


# ------------------------------------------------------------------ pooling on cuda
def _cuda_pool(name: str):
    kind = POOL_KIND[name]

    def render(op: kit.CudaNode) -> kit.Kernels:
        """One output element per thread."""
        _, _, height, width = op.shapes[0]
        ho, wo = op.shape[2], op.shape[3]
        split, (n, c, oh, ow) = kit.unflatten("cell", op.shape, "o")
        lines = (pool_window_lines(kind, op.attrs, 0, oh, str(height), str(ho))
                 + pool_window_lines(kind, op.attrs, 1, ow, str(width), str(wo))
                 + _pool_cell_lines(kind, op.attrs, op.read(0, [n, c, "ih", "iw"]))
                 + [f"out0[cell] = {'best' if kind == MAX else 'avg'}"])
        return _per_element(op, split, lines, "one output element per thread")

    return render


def _cuda_pool_grad(name: str):
    kind = POOL_KIND[name]

    def render(op: kit.CudaNode) -> kit.Kernels:
        """One dx element per thread: the gradients of the windows holding it, in output order (the
        CPU scatter's order); max_pool2d_grad recomputes each window's argmax from x."""
        g_operand = 1 if kind == MAX else 0
        _, _, ho, wo = op.shapes[g_operand]
        _, _, height, width = op.shape
        split, (n, c, ih_, iw_) = kit.unflatten("cell", op.shape, "x")
        if kind == ADAPTIVE:  # windows holding ih: a superset of them, each checked
            first = [f"first0 = ({ih_} * {ho}) // {height}", f"last0 = (({ih_} + 1) * {ho} + {height} - 1) // {height}",
                     f"first1 = ({iw_} * {wo}) // {width}", f"last1 = (({iw_} + 1) * {wo} + {width} - 1) // {width}"]
        else:
            span = [(op.attrs["kernel_size"][a] - 1) * (op.attrs["dilation"][a] if kind == MAX else 1)
                    for a in range(2)]
            first = []
            for a, (index, limit) in enumerate(((ih_, ho), (iw_, wo))):
                s, p = op.attrs["stride"][a], op.attrs["padding"][a]
                first += [f"first{a} = max(0, ({index} + {p} - {span[a]}) // {s})",
                          f"last{a} = min({limit}, ({index} + {p}) // {s} + 1)"]
        window_h = pool_window_lines(kind, op.attrs, 0, "oh", str(height), str(ho))
        window_w = pool_window_lines(kind, op.attrs, 1, "ow", str(width), str(wo))
        grad = op.read(g_operand, [n, c, "oh", "ow"])
        if kind == MAX:
            cell = (_pool_cell_lines(kind, op.attrs, op.read(0, [n, c, "ih", "iw"]))
                    + [f"if bi == {ih_} and bj == {iw_}:", f"    acc += {grad}"])
        else:
            cell = ([f"if lo0 <= {ih_} and {ih_} < hi0 and lo1 <= {iw_} and {iw_} < hi1:"]
                    + ["    " + line for line in pool_scale_lines(kind, op.attrs, grad)] + ["    acc += avg"])
        lines = (first + ["acc = np.float32(0.0)", "for oh in range(first0, last0):"]
                 + ["    " + line for line in window_h + ["for ow in range(first1, last1):"]
                    + ["    " + line for line in window_w + cell]]
                 + ["out0[cell] = acc"])
        return _per_element(op, split, lines, "one input-gradient element per thread")

    return render


_MAX_ATTRS = ("kernel_size", "stride", "padding", "dilation", "ceil_mode")
_AVG_ATTRS = ("kernel_size", "stride", "padding", "ceil_mode", "count_include_pad")

for _name, _attrs, _vjp, _doc in (
        ("max_pool2d", _MAX_ATTRS, vjp_max_pool2d,
         "`%1 = max_pool2d[ceil_mode=False, dilation=(1,1), kernel_size=(2,2), padding=(0,0), stride=(2,2)] %x "
         ": f32[8,16,6,6]`: torch's max_pool2d of x (N, C, H, W)."),
        ("avg_pool2d", _AVG_ATTRS, vjp_avg_pool2d,
         "`%1 = avg_pool2d[ceil_mode=False, count_include_pad=True, kernel_size=(2,2), padding=(0,0), "
         "stride=(2,2)] %x : f32[8,16,6,6]`: torch's avg_pool2d of x (N, C, H, W)."),
        ("adaptive_avg_pool2d", ("output_size",), vjp_avg_pool2d,
         "`%1 = adaptive_avg_pool2d[output_size=(1,1)] %x : f32[8,16,1,1]`: torch's adaptive_avg_pool2d.")):
    define_op(name=_name, arity=1, infer=_infer_pool(_name), reference=_reference_pool(_name),
              lowering=Lowering("row", cpu=_cpu_pool(_name), cuda=_cuda_pool(_name)), vjp=_vjp,
              attr_names=_attrs, doc=_doc)

define_op(
    name="max_pool2d_grad",
    arity=2,
    infer=_infer_pool("max_pool2d_grad"),
    reference=_reference_pool_grad("max_pool2d_grad"),
    lowering=Lowering("row", cpu=_cpu_pool_grad("max_pool2d_grad"), cuda=_cuda_pool_grad("max_pool2d_grad")),
    no_vjp="max_pool2d has no second derivative in bendc (its gradient routes by a recomputed argmax)",
    attr_names=_MAX_ATTRS,
    doc="`%5 = max_pool2d_grad[ceil_mode=False, dilation=(1,1), kernel_size=(2,2), padding=(0,0), stride=(2,2)] "
        "%x, %g : f32[8,16,12,12]`: max_pool2d's VJP: each window's gradient to its first max, recomputed from x.",
)

for _name, _attrs in (("avg_pool2d_grad", _AVG_ATTRS + ("input_size",)),
                      ("adaptive_avg_pool2d_grad", ("input_size", "output_size"))):
    define_op(name=_name, arity=1, infer=_infer_pool(_name), reference=_reference_pool_grad(_name),
              lowering=Lowering("row", cpu=_cpu_pool_grad(_name), cuda=_cuda_pool_grad(_name)),
              vjp=vjp_avg_pool2d_grad, attr_names=_attrs,
              doc=f"`%5 = {_name}[{'...' if _name == 'avg_pool2d_grad' else 'input_size=(12,12), output_size=(1,1)'}] "
                  f"%g : f32[8,16,12,12]`: {_name[:-5]}'s VJP: each output's gradient, divided as the forward "
                  "divides, spread over its window.")
