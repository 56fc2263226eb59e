"""docs/ops.md is generated from the registry and the torch table: it must be up to date."""
from __future__ import annotations

from bendc import opdocs


def test_ops_doc_is_up_to_date():
    with open(opdocs.PATH, encoding="utf-8") as stream:
        current = stream.read()
    assert current == opdocs.render(), "docs/ops.md is stale: run `python -m bendc.opdocs` and commit it"


def test_every_op_and_torch_name_is_listed():
    text = opdocs.render()
    for name in opdocs.OPS:
        assert f"| `{name}` |" in text
    assert "| `torch.nn.functional.scaled_dot_product_attention` | `bendc.functional.scaled_dot_product_attention` |" in text
