"""The cuda tiled attention kernels' tile choice and thread mapping (bendc/ops/attention/cuda_tiled.py),
for head sizes the simulator cannot afford: every choice fits the static shared memory and the
accumulator budget, and every split of a tile over the block's threads gives each cell exactly one
owner (padding only past the tile's columns, never past its rows). No numba needed."""
from __future__ import annotations

import collections

import pytest

from bendc.kernels import cuda_kit
from bendc.ops.attention import cuda_tiled
from bendc.ops.attention.cuda_tiled import Split, backward_tiles, forward_tiles

HEAD_SIZES = [1, 3, 4, 16, 32, 50, 64, 80, 96, 128]


def owners(split: Split) -> collections.Counter:
    cells = collections.Counter()
    for thread in range(split.threads):
        ty, tx = divmod(thread, split.tx)
        for m in range(split.rm):
            for k in range(split.cm):
                cells[(ty + split.ty * m, tx + split.tx * k)] += 1
    return cells


@pytest.mark.parametrize("width", [1, 5, 64, 128])
@pytest.mark.parametrize("depth", HEAD_SIZES)
def test_tiles_fit_and_every_cell_has_one_owner(depth: int, width: int) -> None:
    for tiles, layouts in ((forward_tiles(depth, width), [cuda_tiled._forward_layout]),
                           (backward_tiles(depth, width), [cuda_tiled._key_grads_layout,
                                                          cuda_tiled._query_grads_layout])):
        assert tiles is not None, (depth, width)
        assert max(tiles.shared_bytes) <= cuda_kit.MAX_SHARED_BYTES
        assert tiles.accumulators <= cuda_tiled.MAX_ACCUMULATORS
        for make in layouts:
            layout = make(tiles.queries, tiles.keys, depth, width, tiles.threads)
            for split in (value for value in layout.values() if isinstance(value, Split)):
                cells = owners(split)
                inside = {cell: n for cell, n in cells.items() if cell[1] < split.cols}
                assert inside == {(r, c): 1 for r in range(split.rows) for c in range(split.cols)}, split
                assert all(r < split.rows and c < split.width for r, c in cells), split
            arrays = layout["arrays"]
            for array, axis, split, extent in READS[make.__name__]:
                assert arrays[array][axis] >= getattr(layout[split], extent), (make.__name__, array, axis, split)


# Each shared-array read of the generated kernels: (array, axis, split, "rows" | "width"): the axis is
# indexed by that split's rows (up to .rows) or its padded columns (up to .width).
READS = {
    "_forward_layout": [("q_tile", 0, "s", "rows"), ("kv_tile", 0, "s", "width"), ("s_tile", 0, "s", "rows"),
                        ("s_tile", 1, "s", "width"), ("top", 0, "s", "rows"), ("s_tile", 0, "o", "rows"),
                        ("kv_tile", 1, "o", "width"), ("alpha", 0, "o", "rows"), ("total", 0, "o", "rows")],
    "_key_grads_layout": [("k_tile", 0, "st", "rows"), ("q_tile", 0, "st", "width"), ("v_tile", 0, "st", "rows"),
                          ("g_tile", 0, "st", "width"), ("p_tile", 0, "st", "rows"), ("p_tile", 1, "st", "width"),
                          ("lse_tile", 0, "st", "width"), ("delta_tile", 0, "st", "width"),
                          ("p_tile", 0, "dv", "rows"), ("g_tile", 1, "dv", "width"),
                          ("p_tile", 0, "dk", "rows"), ("q_tile", 1, "dk", "width")],
    "_query_grads_layout": [("q_tile", 0, "sq", "rows"), ("k_tile", 0, "sq", "width"), ("g_tile", 0, "sq", "rows"),
                            ("v_tile", 0, "sq", "width"), ("ds_tile", 0, "sq", "rows"), ("ds_tile", 1, "sq", "width"),
                            ("lse_tile", 0, "sq", "rows"), ("delta_tile", 0, "sq", "rows"),
                            ("ds_tile", 0, "dq", "rows"), ("k_tile", 1, "dq", "width")],
}


def test_the_documented_tiles() -> None:
    """The tiles the module docstring and the README name, for D = Dv = 64 and 128."""
    assert (forward_tiles(64, 64).queries, forward_tiles(64, 64).keys) == (64, 32)
    assert (backward_tiles(64, 64).queries, backward_tiles(64, 64).keys) == (32, 32)
    assert (forward_tiles(128, 128).queries, forward_tiles(128, 128).keys) == (32, 32)
    assert (backward_tiles(128, 128).queries, backward_tiles(128, 128).keys) == (16, 16)
    assert backward_tiles(256, 256) is None and forward_tiles(256, 256) is not None
