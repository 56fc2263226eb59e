"""Elementwise epilogues: the fused elementwise work an op's own CPU kernel applies to its result.

An op whose lowering declares ``Lowering.epilogue`` can absorb the elementwise group that reads
its result (bendc/passes/fusion.py, ``absorb_producers``). Codegen renders that group as a numba
function over blocks of the group's leading axis (bendc/codegen/cpu.py) and hands it to the op's
CPU renderer as an :class:`Epilogue`; the op's kernel calls it on each block of its result right
after computing the block, while the block is in cache:

    _epilogue(first, count, value, in3, in4, out1, out2, p3[block])

applies the group to rows ``first .. first + count - 1`` of its iteration space, reading the op's
result from ``value`` (the block: the op's result shape with ``count`` leading rows, row 0 being
row ``first``), the group's other operands (``in3, in4``: whole arrays, read broadcast), writing
the group's outputs (``out1, out2``: whole arrays) and adding its sums into the block's float64
partial sums (``p3[block:block + 1]``: one block's). The leading axis of the group's iteration space is the leading axis
of the op's result.

conv2d is the op that takes one today. The fusion pass and codegen ask nothing of an op but
``Lowering.epilogue`` and a ``cpu`` renderer that takes ``epilogue=``; matmul would opt in by
computing its product block by block of leading rows inside a numba kernel (np.dot per block,
its operands contiguous or transposed) and calling the epilogue on each block, where it now makes
one numpy call for the whole product.
"""
from __future__ import annotations

from dataclasses import dataclass

from bendc.kernels.cpu_kit import sum_partials

__all__ = ["Epilogue"]


@dataclass(frozen=True)
class Epilogue:
    """What an op's CPU renderer is given to apply a fused elementwise group to its result.

    ``source`` defines the njit function ``_epilogue`` (its own helpers included);
    ``inputs`` are the kernel parameters after the op's own operands that the epilogue reads,
    ``outputs`` the kernel parameters it writes; ``value_output`` is the kernel parameter the op
    writes its own result into when the result is needed beyond the epilogue (another kernel
    reads it, or the step returns it), else None: the op then computes each block into a
    scratch array of its own and only the epilogue's outputs are written.

    ``sums`` are the group's epilogue sums, (output parameter, partial): each block of rows adds
    into its own float64 partial sum (``partial[block:block + 1]``), and the partials are added in block
    order once every block is done, so that the sums do not depend on which thread ran which
    block. The op's kernel places ``setup`` before its loop over blocks and ``finish`` after it.
    """

    source: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    value_output: str | None
    sums: tuple[tuple[str, str], ...] = ()

    def parameters(self, own_inputs: tuple[str, ...]) -> str:
        """The kernel's parameter list: the op's operands, the epilogue's, the outputs."""
        value = (self.value_output,) if self.value_output else ()
        return ", ".join(own_inputs + self.inputs + value + self.outputs)

    def arrays(self) -> str:
        """The epilogue's arrays, passed on from the kernel to the op's numba function."""
        return ", ".join(self.inputs + self.outputs)

    def setup(self, blocks: str) -> list[str]:
        """Statements before the op's loop over ``blocks`` blocks: the partial sums, zeroed."""
        return [f"{partial} = np.zeros(({blocks},) + {out}.shape, np.float64)" for out, partial in self.sums]

    def call(self, first: str, count: str, value: str, block: str) -> str:
        """The statement applying the epilogue to rows ``first .. first + count - 1``, the
        ``block``-th block of the op's loop."""
        summed = {out for out, _ in self.sums}
        rest = [*self.inputs, *(o for o in self.outputs if o not in summed),
                *(f"{partial}[{block}:{block} + 1]" for _, partial in self.sums)]
        return f"_epilogue({', '.join([first, count, value, *rest])})"

    def finish(self, blocks: str) -> list[str]:
        """Statements after the op's loop: each sum's partials added in block order."""
        return [line for out, partial in self.sums for line in sum_partials(partial, out, blocks, partial)]
