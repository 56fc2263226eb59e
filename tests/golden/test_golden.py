"""Golden IR for the examples, one file per stage: tests/golden/<example>/<stage>.ir.

Regenerate on purpose with ``pytest tests/golden --regen-golden`` and read
the diff before committing it.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from bendc.ir.parser import parse_graph
from bendc.ir.printer import format_graph
from bendc.ir.verify import verify

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).resolve().parent

# example name -> (module path, jitted function name)
EXAMPLES = {
    "mlp": ("examples/mlp.py", "train_step"),
    "transformer": ("examples/transformer.py", "train_step"),
    "cnn": ("examples/cnn.py", "train_step"),  # op-coverage issue
}


def load_example(name: str):
    path, function = EXAMPLES[name]
    spec = importlib.util.spec_from_file_location(f"bendc_example_{name}", ROOT / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, getattr(module, function)


def example_stages(name: str) -> dict[str, str]:
    module, step = load_example(name)
    step.lower(module.EXAMPLE_SHAPES)
    return {stage: step.ir(stage) for stage in step.stages()}


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_matches_golden(name: str, regen_golden: bool) -> None:
    stages = example_stages(name)
    folder = GOLDEN / name
    if regen_golden:
        folder.mkdir(exist_ok=True)
        for old in folder.glob("*.ir"):
            old.unlink()
        for stage, text in stages.items():
            (folder / f"{stage}.ir").write_text(text)
    expected = {path.stem: path.read_text() for path in folder.glob("*.ir")}
    assert sorted(expected) == sorted(stages), "stages differ from the golden files (--regen-golden?)"
    for stage, text in stages.items():
        assert text == expected[stage], f"{name}/{stage}.ir differs (regenerate with --regen-golden and read the diff)"


GOLDEN_FILES = sorted(GOLDEN.glob("*/*.ir"))


@pytest.mark.parametrize("path", GOLDEN_FILES, ids=[f"{p.parent.name}/{p.name}" for p in GOLDEN_FILES])
def test_golden_file_round_trips(path: Path) -> None:
    text = path.read_text()
    graph = parse_graph(text)
    verify(graph, path.stem, allow_placeholders=path.stem == "traced")
    assert format_graph(graph) == text


def test_every_example_has_golden_files() -> None:
    for name in EXAMPLES:
        assert (GOLDEN / name / "final.ir").exists(), f"no golden files for {name}"
