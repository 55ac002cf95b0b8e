"""The C paths read the recorder's per-call state at its slots' offsets (capture/_slot_attrs.h), and still see
what Python sees: a class patched after the offsets were cached is looked up again, and an attribute that is
not a plain slot takes the generic lookup."""
from __future__ import annotations

import pytest
import torch

import msprobe_nb
from msprobe_nb import debugger
from msprobe_nb.capture import api_mode, recorder

pytestmark = pytest.mark.skipif(api_mode._api_handler is None,
                                reason="msprobe_nb.capture._api_handler is not built (no C compiler, or not "
                                       "CPython 3.11+)")


def _calls(tmp_path, name: str) -> list[str]:
    """One recorded step of three API calls; the names of the calls its dump holds."""
    dbg = msprobe_nb.Debugger(dump_path=str(tmp_path / name), level="L1", task="statistics")
    a, b = torch.ones(4), torch.full((4,), 2.0)
    dbg.start()
    torch.add(a, b)
    torch.mul(a, b).sum()
    dbg.stop()
    dbg.step()
    dbg.close()
    if not (tmp_path / name).exists():  # nothing recorded, nothing written
        return []
    return sorted(msprobe_nb.load(str(tmp_path / name)).calls["call"].unique())


def test_the_hot_state_is_in_slots():
    assert {"active", "busy", "rows", "calls", "_seen", "call_index"} <= set(recorder.Recorder.__slots__)


def test_a_patched_class_is_looked_up_again(tmp_path, monkeypatch):
    """``call_index`` is read and written at its slot's offset on every recorded call. Once a property is put
    over the slot on the class, the offset cached by the step before must not be used: the handler's writes
    go through the property's setter."""
    names = ["Tensor.sum.0.forward", "Torch.add.0.forward", "Torch.mul.0.forward"]
    assert _calls(tmp_path, "before") == names  # the offsets are cached now
    slot = recorder.Recorder.__dict__["call_index"]
    seen: list[int] = []

    def set_index(self, v):
        seen.append(v)
        slot.__set__(self, v)

    monkeypatch.setattr(recorder.Recorder, "call_index", property(slot.__get__, set_index))
    assert _calls(tmp_path, "patched") == names
    first = seen.index(1)
    assert seen[first:first + 3] == [1, 2, 3]  # one index taken per recorded call, through the setter
    monkeypatch.undo()
    assert _calls(tmp_path, "after") == names


def test_a_subclass_property_takes_the_generic_lookup(tmp_path, monkeypatch):
    """A Recorder subclass whose ``call_index`` is a property: the C handler reads and writes it through the
    property, as Python would."""
    seen: list[int] = []

    class Counting(recorder.Recorder):
        @property
        def call_index(self):
            return self._index

        @call_index.setter
        def call_index(self, v):
            seen.append(v)
            self._index = v

    monkeypatch.setattr(debugger, "Recorder", Counting)
    names = _calls(tmp_path, "sub")
    assert names == ["Tensor.sum.0.forward", "Torch.add.0.forward", "Torch.mul.0.forward"]
    first = seen.index(1)
    assert seen[first:first + 3] == [1, 2, 3]  # taken once per recorded call, through the setter


def _row_builder():
    from msprobe_nb.capture import recorder as r
    if r._attr_columns is None:
        pytest.skip("msprobe_nb.capture._row_builder is not built (no C compiler)")
    return r._attr_columns


def test_attr_columns_read_what_getattr_reads():
    """A step's Call fields, read at their slots, equal getattr's; so do a subclass's property and a plain
    object's instance dict, mixed in one list; a new set of names is resolved afresh."""
    attr_columns = _row_builder()
    from msprobe_nb.capture.calls import Call

    class Renamed(Call):
        __slots__ = ()

        @property
        def op(self):
            return "renamed"

        @op.setter
        def op(self, v):  # the dataclass's __init__ sets it
            pass

    class Plain:
        def __init__(self):
            self.call, self.family, self.op, self.counter = "x.0.forward", "X", "x", 0

    objs = [Call(f"Torch.add.{i}.forward", "Torch", "add", i, "forward", "", "Module.m", 7, i) for i in range(5)]
    objs += [Renamed("Tensor.t.0.forward", "Tensor", "t", 0, "forward"), Plain()]
    names = ("call", "family", "op", "counter")
    want = [[getattr(o, n) for o in objs] for n in names]
    assert attr_columns(objs, names) == want
    assert attr_columns(objs, names) == want  # the second time from the caches
    assert attr_columns(objs[:5], ("index", "parent")) == [list(range(5)), ["Module.m"] * 5]
    assert attr_columns(objs, names[::-1]) == want[::-1]
    with pytest.raises(AttributeError, match="index"):
        attr_columns(objs, ("index",))  # Plain has none: getattr's own error
    with pytest.raises(ValueError, match="at most"):
        attr_columns(objs, ("call",) * 33)


def test_the_recorder_writes_the_same_call_fields_either_way(tmp_path, monkeypatch):
    """The dump's call columns are the same with the C read of the Call fields and without it."""
    from msprobe_nb.capture import recorder as r
    _row_builder()

    def columns(name):
        _calls(tmp_path, name)
        calls = msprobe_nb.load(str(tmp_path / name)).calls
        return calls[[col for col, _ in r.CALL_FIELDS]].astype(str).values.tolist()

    with_c = columns("c")
    monkeypatch.setattr(r, "_attr_columns", None)
    assert columns("python") == with_c
