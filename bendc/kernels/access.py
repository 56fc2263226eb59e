"""Strided access: where a value's elements live in the flat array of its root.

Part of the kernel-text kit (imports nothing of bendc). Used by the cuda
lowerings in op files and by codegen, which resolves every value's access
(bendc/codegen/views.py).

Every value a kernel reads is an element ``offset`` and ``strides`` into the
flat array of its *root*: the parameter, constant or kernel output whose
storage it shares. Layout ops (permute, expand, basic indexing, reshape)
only change the offset and strides, so a kernel reads a transposed or
broadcast operand in place, without a copy. A reshape of a strided value
that no strides can describe (numpy would copy there too), and a view that
the caller gets back, are materialized by a copy kernel instead: their step
becomes a ``write`` step, which the memory plan then gives a buffer.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from runtime.dtypes import numel


@dataclass(frozen=True)
class Access:
    """Where the elements of a value live: ``root``'s flat array at ``offset + sum(i * stride)``."""

    root: int
    offset: int
    strides: tuple[int, ...]

    def flat(self, index: Sequence[str]) -> str:
        """The flat element index for one index expression per axis ("0" where the axis is fixed)."""
        terms = [str(self.offset)] if self.offset else []
        for expression, stride in zip(index, self.strides):
            if expression == "0" or stride == 0:
                continue
            terms.append(expression if stride == 1 else f"{expression} * {stride}")
        return " + ".join(terms) if terms else "0"

    def is_contiguous(self, shape: Sequence[int]) -> bool:
        """Row-major and dense from element 0 (size-1 axes may have any stride)."""
        expected = contiguous_strides(shape)
        return self.offset == 0 and all(s == e for s, e, d in zip(self.strides, expected, shape) if d != 1)


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Row-major strides in elements."""
    strides = []
    step = 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def dense(root: int, shape: Sequence[int]) -> Access:
    return Access(root, 0, contiguous_strides(shape))


def permuted(access: Access, perm: Sequence[int]) -> Access:
    """permute: axis k of the result is axis perm[k] of the operand."""
    return Access(access.root, access.offset, tuple(access.strides[p] for p in perm))


def expanded(access: Access, source: Sequence[int], shape: Sequence[int]) -> Access:
    """expand: new leading axes and broadcast size-1 axes read one element (stride 0)."""
    lead = len(shape) - len(source)
    strides = [0] * lead + [0 if size == 1 else stride for size, stride in zip(source, access.strides)]
    return Access(access.root, access.offset, tuple(strides))


def indexed(access: Access, spec: Sequence) -> Access:
    """Basic indexing: an int fixes an axis (moves the offset), (start, stop, step) slices it."""
    offset = access.offset
    strides = []
    for axis, entry in enumerate(spec):
        stride = access.strides[axis]
        if isinstance(entry, int):
            offset += entry * stride
            continue
        start, _, step = entry
        offset += start * stride
        strides.append(stride * step)
    strides.extend(access.strides[len(spec):])
    return Access(access.root, offset, tuple(strides))


def reshaped(access: Access, source: Sequence[int], shape: Sequence[int]) -> Access | None:
    """reshape without a copy, or None where no strides describe it (numpy's
    ``_attempt_nocopy_reshape``, C order, in elements)."""
    if numel(source) == 0:
        return dense(access.root, shape)
    old = [(size, stride) for size, stride in zip(source, access.strides) if size != 1]
    old_sizes = [size for size, _ in old]
    old_strides = [stride for _, stride in old]
    new_sizes = list(shape)
    new_strides = [0] * len(new_sizes)
    oi, oj, ni, nj = 0, 1, 0, 1
    while ni < len(new_sizes) and oi < len(old_sizes):
        new_product, old_product = new_sizes[ni], old_sizes[oi]
        while new_product != old_product:
            if new_product < old_product:
                new_product *= new_sizes[nj]
                nj += 1
            else:
                old_product *= old_sizes[oj]
                oj += 1
        for k in range(oi, oj - 1):  # the old axes of this group must be one dense run
            if old_strides[k] != old_sizes[k + 1] * old_strides[k + 1]:
                return None
        new_strides[nj - 1] = old_strides[oj - 1]
        for k in range(nj - 1, ni, -1):
            new_strides[k - 1] = new_strides[k] * new_sizes[k]
        ni, nj = nj, nj + 1
        oi, oj = oj, oj + 1
    last = new_strides[ni - 1] if ni >= 1 else 1
    for k in range(ni, len(new_sizes)):
        new_strides[k] = last
    return Access(access.root, access.offset, tuple(new_strides))


