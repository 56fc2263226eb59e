"""The device script's grid probe (issue 25 item 2): x @ w with 1,100,000 rows (68,750 row tiles,
past grid.y's 65535 blocks), carried from the build machine (tests/gpu/carried.py). Its launches
are within the GPU's limits; on a GPU it runs (graph and eager) and matches numpy in float64. The
simulator's dry run checks the launches only (a simulated thread costs ~170 us)."""
from __future__ import annotations

import numpy as np
import pytest

from devices import SIMULATED, carried_folder, program, require_device

LIMIT_GRID = (2**31 - 1, 65535, 65535)


def test_the_tall_products_launches_are_within_the_limits() -> None:
    from runtime.artifact import read_manifest, read_plan

    folder = carried_folder() / "grid" / "cuda"
    plan = read_plan(str(folder), read_manifest(str(folder), trust=True))
    launches = [launch for step in plan["steps"] for launch in step["launches"]]
    assert launches
    for launch in launches:
        assert all(1 <= n <= limit for n, limit in zip(launch["grid"], LIMIT_GRID)), launch["grid"]
        assert launch["block"][0] * launch["block"][1] * launch["block"][2] <= 1024


@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_the_tall_product_runs_and_matches_numpy(mode: str) -> None:
    require_device()
    if SIMULATED:
        pytest.skip("1,100,000 rows: a GPU run only (the dry run checks the launches)")
    from runtime.artifact import read_manifest
    from runtime.cli import random_inputs

    folder = carried_folder() / "grid" / "cuda"
    x, w = random_inputs(read_manifest(str(folder), trust=True), 0)
    (got,) = program(folder, mode=mode).run([x, w])
    want = np.asarray(x, np.float64) @ np.asarray(w, np.float64)
    np.testing.assert_allclose(got.copy_to_host(), want, rtol=1e-5, atol=1e-5)
