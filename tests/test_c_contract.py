"""The C extensions' layouts are declared once (capture/c_contract.py) and a stale build is refused, not misread."""
from __future__ import annotations

import types

import pytest

from msprobe_nb.capture import c_contract, recorder


def test_the_built_row_builder_exports_the_layout_python_expects():
    mod = pytest.importorskip("msprobe_nb.capture._row_builder", reason="the C row builder is not built here")
    assert c_contract.row_builder_problems(mod, len(recorder.ROW_FIELDS)) == []
    assert mod.CONTEXT_FIELDS == c_contract.CONTEXT_FIELDS and mod.KIND_CODES == c_contract.KIND_CODES
    assert recorder._build_rows is mod.build_rows  # taken, since it matches


@pytest.mark.parametrize("name", ["_fused_stats", "_stack_keys"])
def test_the_other_extensions_export_their_abi(name):
    mod = pytest.importorskip(f"msprobe_nb.capture.{name}", reason=f"{name} is not built here")
    assert mod.ABI == (c_contract.STACK_KEYS_ABI if name == "_stack_keys" else c_contract.STATS_ABI)


def _stale(**changes):
    layout = dict(ABI=c_contract.STATS_ABI, ROW_ARITY=len(recorder.ROW_FIELDS), SEEN_ARITY=5,
                  CONTEXT_FIELDS=c_contract.CONTEXT_FIELDS, KIND_CODES=dict(c_contract.KIND_CODES),
                  build_rows=lambda *a: 0, stats_at=None, norms_into=None, int_stats_at=None, stack_key=None)
    layout.update(changes)
    return types.SimpleNamespace(**layout)


@pytest.mark.parametrize("changes,why", [
    ({"ABI": 0}, "ABI 0"), ({"ROW_ARITY": 15}, "rows of 15 fields"), ({"KIND_CODES": {"tensor": 1}}, "kind codes"),
    ({"CONTEXT_FIELDS": c_contract.CONTEXT_FIELDS[:-1]}, "context fields"), ({"SEEN_ARITY": 4}, "seen entries"),
    ({"ABI": None}, "ABI None"),  # a build older than the exported layout
])
def test_a_stale_row_builder_is_refused_with_one_warning(monkeypatch, changes, why):
    monkeypatch.setattr(c_contract, "_load", lambda name: _stale(**changes))
    with pytest.warns(RuntimeWarning, match=f"_row_builder does not match.*{why}.*Python path"):
        assert c_contract.row_builder(len(recorder.ROW_FIELDS)) is None


@pytest.mark.parametrize("load,abi", [("fused_stats", "STATS_ABI"), ("stack_keys", "STACK_KEYS_ABI")])
def test_stale_statistics_and_stack_extensions_are_refused(monkeypatch, load, abi):
    monkeypatch.setattr(c_contract, "_load", lambda name: _stale(ABI=getattr(c_contract, abi) + 1))
    with pytest.warns(RuntimeWarning, match="Python path"):
        assert getattr(c_contract, load)() is None
    monkeypatch.setattr(c_contract, "_load", lambda name: _stale(ABI=getattr(c_contract, abi)))
    assert getattr(c_contract, load)() is not None


def test_the_context_is_built_by_name_in_the_extensions_order():
    values = {name: i for i, name in enumerate(c_contract.CONTEXT_FIELDS)}
    reordered = _stale(CONTEXT_FIELDS=tuple(reversed(c_contract.CONTEXT_FIELDS)))
    assert c_contract.context(reordered, values) == tuple(reversed(range(len(values))))
    assert c_contract.context(None, values) == tuple(range(len(values)))
