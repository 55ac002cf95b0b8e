"""The commit index's rules, one by one (store/hdf5_index.py, issue 36): each damage a reader must refuse, with
a DumpFormatError naming the file, the row and what is wrong, and each healthy file it must read. Small files
written by the real writer, then edited with h5py; no torch."""
from __future__ import annotations

import errno
import json
import os
import zlib
from pathlib import Path

import h5py
import numpy as np
import pytest

from msprobe_nb.store.errors import DumpFormatError
from msprobe_nb.store.hdf5_index import check_attrs, check_header, commit_ends, committed_rows, drop_reason, index_rows
from msprobe_nb.store.hdf5_layout import (
    COMMIT_MAGIC,
    FLAG_DROPPED,
    INDEX_FIELDS,
    INDEX_FIELDS_V3,
    INDEX_FIELDS_V4,
    INDEX_POS,
    attrs_digest,
)
from msprobe_nb.store.hdf5_reader import read_hdf5
from msprobe_nb.store.hdf5_writer import DumpWriter
from msprobe_nb.store.schema import SCHEMA_VERSION

P = INDEX_POS
CRC = P["crc"]


def _dump(d: Path, steps: int = 3, rows: int = 5) -> Path:
    with DumpWriter(d, meta={"task": "tensor"}) as w:
        for s in range(steps):
            w.write_step(s, {"name": [f"s{s}.n{k}" for k in range(rows)], "numel": list(range(rows))},
                         tensors={f"t{s}": np.arange(s + 1, dtype=np.float32)})
    return d / "rank0.h5"


@pytest.fixture(scope="module")
def healthy(tmp_path_factory) -> tuple[Path, np.ndarray]:
    """A 3-step file and its committed index rows (read back, never edited)."""
    f = _dump(tmp_path_factory.mktemp("healthy") / "d")
    with h5py.File(f, "r") as h:
        rows = h["index/steps"][()]
    return f, rows[rows[:, P["commit"]] == COMMIT_MAGIC]


def _sealed(rows: np.ndarray) -> np.ndarray:
    """``rows`` with each row's checksum recomputed, as a writer would have written them."""
    rows = np.array(rows, dtype=np.int64)
    for r in rows:
        r[CRC] = zlib.crc32(np.ascontiguousarray(r[:CRC], dtype="<i8"))
    return rows


def _rewrite(tmp_path: Path, healthy, edit, seal: bool = True) -> Path:
    """A copy of the healthy file whose committed index rows went through ``edit`` (checksums recomputed)."""
    src, rows = healthy
    d = tmp_path / "d"
    d.mkdir(parents=True)
    f = d / "rank0.h5"
    f.write_bytes(src.read_bytes())
    new = edit(np.array(rows))
    with h5py.File(f, "r+") as h:
        ds = h["index/steps"]
        ds[: len(new)] = _sealed(new) if seal else new
    return f


def _refused(f: Path, match: str) -> str:
    with pytest.raises(DumpFormatError, match=match) as e:
        read_hdf5(f)
    assert str(f) in str(e.value)
    return str(e.value)


def test_the_healthy_file_reads_all_its_steps(healthy):
    f, rows = healthy
    assert len(rows) == 3
    assert sorted(set(read_hdf5(f).calls["step"])) == [0, 1, 2]


# ------------------------------------------------------------------ header
def _header_file(tmp_path: Path, **attrs) -> Path:
    f = tmp_path / "h.h5"
    with h5py.File(f, "w") as h:
        h.attrs.update({"format": "msprobe_nb.dump", "schema_version": SCHEMA_VERSION, "layout_version": 5, **attrs})
    return f


@pytest.mark.parametrize("layout", [1, 2, 3, 4, 5])
def test_each_layout_this_reader_reads_passes_the_header(tmp_path, layout):
    f = _header_file(tmp_path, layout_version=layout)
    with h5py.File(f, "r") as h:
        assert check_header(h, f)["layout_version"] == layout


@pytest.mark.parametrize("attrs,match", [
    ({"format": "other.dump"}, r"is not a msprobe_nb dump \(root attribute format='other.dump', expected "
                               r"'msprobe_nb.dump'\)"),
    ({"format": "a.dump"}, r"is not a msprobe_nb dump \(root attribute format='a.dump'"),
    ({"schema_version": SCHEMA_VERSION + 1}, rf"schema_version {SCHEMA_VERSION + 1} is not supported \(this "
                                             rf"msprobe_nb reads schema_version {SCHEMA_VERSION}\)"),
    ({"schema_version": SCHEMA_VERSION - 1}, rf"schema_version {SCHEMA_VERSION - 1} is not supported"),
    ({"layout_version": 6}, r"layout_version 6 is not supported \(this msprobe_nb reads layout_version "
                            r"1, 2, 3, 4, 5\)"),
    ({"layout_version": 0}, r"layout_version 0 is not supported"),
])
def test_a_foreign_or_newer_header_is_refused_naming_the_file_and_the_attribute(tmp_path, attrs, match):
    f = _header_file(tmp_path, **attrs)
    with h5py.File(f, "r") as h, pytest.raises(DumpFormatError, match=match) as e:
        check_header(h, f)
    assert str(e.value).startswith(repr(str(f)))


# ------------------------------------------------------------------ the index dataset
def test_an_index_naming_unknown_fields_is_refused(tmp_path, healthy):
    for fields in ("not json {", json.dumps(["step", "commit"])):
        f = _rewrite(tmp_path / str(len(fields)), healthy, lambda r: r)
        with h5py.File(f, "r+") as h:
            h["index/steps"].attrs["fields"] = fields
        _refused(f, r"/index/steps lists fields .* which is none of the layouts this msprobe_nb reads")


@pytest.mark.parametrize("shape,dtype", [((256, len(INDEX_FIELDS) - 1), "int64"),
                                         ((256, len(INDEX_FIELDS) + 1), "int64"),
                                         ((256, len(INDEX_FIELDS)), "int32"), ((256, len(INDEX_FIELDS)), "uint64"),
                                         ((256, len(INDEX_FIELDS)), "float64"), ((256 * len(INDEX_FIELDS),), "int64"),
                                         ((256, len(INDEX_FIELDS), 1), "int64")])
def test_an_index_of_the_wrong_shape_or_type_is_refused(tmp_path, healthy, shape, dtype):
    f = _rewrite(tmp_path, healthy, lambda r: r)
    with h5py.File(f, "r+") as h:
        fields = h["index/steps"].attrs["fields"]
        del h["index/steps"]
        h.create_dataset("index/steps", shape=shape, dtype=dtype).attrs["fields"] = fields
    _refused(f, rf"/index/steps is {dtype}\[.*\], expected int64 \[n, {len(INDEX_FIELDS)}\]")


@pytest.mark.parametrize("more", [0, 1, 2])
def test_an_index_claiming_more_rows_than_the_file_can_hold_is_refused_and_its_bound_is_exact(tmp_path, healthy, more):
    # fill rows cost no space: the bound is every chunk the file's bytes could hold, plus the growing one; files
    # of three sizes (bytes past HDF5's end of data are allowed)
    f = _rewrite(tmp_path, healthy, lambda r: r)
    block = 256
    chunk_bytes = block * len(INDEX_FIELDS) * 8
    pad = bytes(more * chunk_bytes + chunk_bytes // 2)

    def claim(rows: int) -> int:  # h5py cuts the file to HDF5's end of data on closing: pad after
        with h5py.File(f, "r+") as h:
            h["index/steps"].resize((rows, len(INDEX_FIELDS)))
        with open(f, "ab") as fh:
            fh.write(pad)
        return os.path.getsize(f)
    size = claim(4 * block)
    most = (size // chunk_bytes + 2) * block
    assert claim(most) == size
    assert sorted(set(read_hdf5(f).calls["step"])) == [0, 1, 2]  # at the bound: fill rows, no commits
    assert claim(most + 1) == size
    _refused(f, rf"/index/steps claims {most + 1} rows; a file of {size} bytes holds at most {most}")


@pytest.mark.parametrize("fields", [INDEX_FIELDS_V3, INDEX_FIELDS_V4])
def test_older_index_rows_come_back_in_todays_columns_without_checksums(tmp_path, healthy, fields):
    _, rows = healthy
    f = tmp_path / "old.h5"
    keep = [INDEX_FIELDS.index(k) for k in fields]
    with h5py.File(f, "w") as h:
        h.create_dataset("index/steps", data=rows[:, keep], chunks=(4, len(keep)), maxshape=(None, len(keep)))
        h.create_dataset("contiguous", data=rows[:, keep]).attrs["fields"] = json.dumps(fields)
        h["index/steps"].attrs["fields"] = json.dumps(fields)
    with h5py.File(f, "r") as h:
        got, checked = index_rows(h, f)
    assert not checked and got.shape == rows.shape
    want = np.zeros_like(rows)
    want[:, keep] = rows[:, keep]
    np.testing.assert_array_equal(got, want)
    with h5py.File(f, "r+") as h:  # an index stored whole, not in chunks (every row is stored: always fits)
        del h["index/steps"]
        h.move("contiguous", "index/steps")
    with h5py.File(f, "r") as h:
        np.testing.assert_array_equal(index_rows(h, f)[0], want)
    with h5py.File(f, "r+") as h:
        del h["index/steps"].attrs["fields"]  # layouts 1-2 wrote no fields: theirs are layout 3's
    if fields == INDEX_FIELDS_V3:
        with h5py.File(f, "r") as h:
            np.testing.assert_array_equal(index_rows(h, f)[0], want)


# ------------------------------------------------------------------ row checksums and the attributes' checksum
@pytest.mark.parametrize("row", [0, 1, 2])
def test_a_damaged_committed_row_fails_its_checksum_whichever_row_it_is(tmp_path, healthy, row):
    def damage(r):
        r[row, P["flags"]] ^= 4  # an unused bit: every rule but the checksum holds
        return r
    f = _rewrite(tmp_path, healthy, damage, seal=False)
    msg = _refused(f, rf"/index/steps row {row} \(step {row}\) fails its checksum \(crc32 0x[0-9a-f]{{8}}, stored "
                      r"0x[0-9a-f]{8}\): the commit record is damaged")
    stored = int(healthy[1][row, CRC]) & 0xFFFFFFFF
    assert f"stored {stored:#010x}" in msg


@pytest.mark.parametrize("stored,shown", [(0xFFFFFFFF, "0xffffffff"), (-1, "0xffffffff"), (0, "0x00000000")])
def test_a_damaged_checksum_is_shown_as_the_32_bits_stored(tmp_path, healthy, stored, shown):
    def damage(r):
        r[1, CRC] = stored
        return r
    _refused(_rewrite(tmp_path, healthy, damage, seal=False),
             rf"row 1 \(step 1\) fails its checksum .* stored {shown}\)")


def test_a_file_of_the_current_layout_without_its_attrs_checksum_is_refused(tmp_path, healthy):
    f = _rewrite(tmp_path, healthy, lambda r: r)
    with h5py.File(f, "r+") as h:
        del h.attrs["attrs_crc"]
    _refused(f, r"layout 5 file without its attrs_crc attribute")


def test_attributes_changed_after_writing_fail_their_checksum_and_older_layouts_have_none(tmp_path, healthy):
    f = _rewrite(tmp_path, healthy, lambda r: r)
    with h5py.File(f, "r+") as h:
        meta = json.loads(h.attrs["meta"])
        h.attrs["meta"] = json.dumps({**meta, "task": "statistics"})
        got = attrs_digest(h)
    _refused(f, rf"its attributes \(meta, record layouts, index fields\) fail their checksum \(crc32 {got:#010x}")
    for off in (1, -1):  # a damaged attrs_crc, above or below the right one
        with h5py.File(f, "r+") as h:
            h.attrs["attrs_crc"] = attrs_digest(h) + off
        _refused(f, r"fail their checksum")
    with h5py.File(f, "r+") as h:
        h.attrs["attrs_crc"] = attrs_digest(h)
    assert len(read_hdf5(f).calls) == 15
    for layout in (3, 4):  # no attrs_crc in these layouts: nothing to check
        with h5py.File(f, "r+") as h:
            h.attrs["layout_version"] = layout
            if "attrs_crc" in h.attrs:
                del h.attrs["attrs_crc"]
            check_attrs(h, check_header(h, f), f)


# ------------------------------------------------------------------ which rows are commits
def test_rows_after_the_first_unmarked_row_are_not_read_and_a_marked_one_there_is_damage(tmp_path, healthy):
    def unmark(r):
        r[2, P["commit"]] = 0
        r[2, :] = 0  # a half-written last commit: zeros
        return r
    f = _rewrite(tmp_path, healthy, unmark, seal=False)
    assert sorted(set(read_hdf5(f).calls["step"])) == [0, 1]

    def hole(r):
        r[1, :] = 0
        return r
    f = _rewrite(tmp_path / "b", healthy, hole, seal=False)
    _refused(f, r"/index/steps row 2 is a commit after row 1, which is not one; a writer never commits past")

    def first(r):
        r[0, :] = 0
        return r
    _refused(_rewrite(tmp_path / "c", healthy, first, seal=False), r"/index/steps row 1 is a commit after row 0,")


def test_an_index_whose_every_row_is_a_commit_reads_them_all():
    rows = np.zeros((300, len(INDEX_FIELDS)), np.int64)
    rows[:, P["step"]] = np.arange(300)
    rows[:, P["commit"]] = COMMIT_MAGIC
    assert len(committed_rows(_sealed(rows), Path("x"), checked=True)) == 300


def test_a_whole_commit_whose_marker_is_damaged_is_refused_not_dropped(tmp_path, healthy):
    def marker(r):
        r[2, P["commit"]] = COMMIT_MAGIC ^ 0x100
        return r
    f = _rewrite(tmp_path, healthy, marker)
    _refused(f, r"/index/steps row 2 \(step 2\) is a whole commit record whose commit marker is damaged "
                rf"\({COMMIT_MAGIC ^ 0x100:#x}\)")
    _, rows = healthy
    damaged = np.vstack([rows, np.zeros((1, rows.shape[1]), np.int64)])
    damaged[2, P["commit"]] ^= 0x100
    assert len(committed_rows(damaged, Path("x"))) == 2  # without checksums (older layouts): a half-written row
    whole = zlib.crc32(np.ascontiguousarray(damaged[2, :CRC], dtype="<i8"))
    for off in (1, -1):
        damaged[2, CRC] = whole + off
        assert len(committed_rows(damaged, Path("x"), checked=True)) == 2  # its checksum fails too: half-written


@pytest.mark.parametrize("slot", [2, -1])
def test_a_tail_slot_other_than_0_or_1_is_refused(tmp_path, healthy, slot):
    def bad(r):
        r[1:, P["calls_slot"]] = slot  # rows 1 and 2: the first is named
        return r
    _refused(_rewrite(tmp_path, healthy, bad), rf"/index/steps row 1 names tail slots \[{slot}, 0, 0, .*\]; each must "
                                               r"be 0 or 1")
    _, rows = healthy
    ok = np.array(rows)
    ok[:, P["strings_slot"]] = [0, 1, 1]
    assert len(committed_rows(ok, Path("x"))) == 3


@pytest.mark.parametrize("field", ["calls", "string_bytes", "u4"])
def test_a_length_that_shrinks_from_one_commit_to_the_next_is_refused_naming_it(tmp_path, healthy, field):
    _, rows = healthy
    before = int(rows[1, P[field]])

    def shrink(r):
        r[1, P[field]] = r[0, P[field]] - 1
        r[2, P[field]] = r[0, P[field]] - 2  # rows 1 and 2 shrink: the first is named
        r[1:, P["u8"]] = -5  # a later field shrinks too: the first is named
        return r
    first = int(rows[0, P[field]])
    _refused(_rewrite(tmp_path, healthy, shrink),
             rf"/index/steps row 1: the length of {field} goes from {first} to {first - 1}; committed lengths")
    same = np.array(rows)
    same[2, P[field]] = before  # a step that adds nothing to it
    assert len(committed_rows(same, Path("x"))) == 3


def test_a_negative_first_length_is_refused():
    rows = np.zeros((1, len(INDEX_FIELDS)), np.int64)
    rows[0, P["commit"]] = COMMIT_MAGIC
    rows[0, P["calls"]] = -1
    with pytest.raises(DumpFormatError, match=r"row 0: the length of calls goes from 0 to -1"):
        committed_rows(rows, Path("x"))
    rows[0, P["calls"]] = 0
    assert len(committed_rows(rows, Path("x"))) == 1


@pytest.mark.parametrize("step,ok", [(2 ** 31 - 1, True), (2 ** 31, False), (2 ** 31 + 1, False), (-(2 ** 31), True),
                                     (-(2 ** 31) - 1, False)])
def test_a_step_outside_int32_is_refused(tmp_path, healthy, step, ok):
    def far(r):
        r[1, P["step"]] = step if not ok else 1
        r[2, P["step"]] = step if ok else 2 ** 40  # a later bad one: the first is named
        return r
    f = _rewrite(tmp_path, healthy, far)
    if ok:
        with h5py.File(f, "r") as h:
            rows, checked = index_rows(h, f)
        assert int(committed_rows(rows, f, checked)[2, P["step"]]) == step
    else:
        _refused(f, rf"/index/steps row 1: step {step} does not fit int32")


def test_a_dropped_steps_mark_must_repeat_the_lengths(tmp_path, healthy):
    _, rows = healthy
    mark = np.array(rows[2])
    mark[P["step"]] = 3
    mark[P["flags"]] = FLAG_DROPPED | (errno.ENOSPC << 8)
    ok = np.vstack([rows, mark])
    assert [int(s) for s in committed_rows(ok, Path("x"))[:, 0]] == [0, 1, 2, 3]
    bad = np.vstack([ok, ok[3:]])
    bad[3:, P["u4"]] += [4, 8]  # rows 3 and 4
    bad[4, P["step"]] = 4
    with pytest.raises(DumpFormatError, match=r"row 3 marks step 3 as dropped but changes the committed lengths"):
        committed_rows(bad, Path("x"))
    partial = np.array(bad)
    partial[3:, P["flags"]] = 2  # a step cut short keeps its rows: lengths may move
    assert len(committed_rows(partial, Path("x"))) == 5


def test_an_all_zero_index_has_no_commits_and_its_ends_are_zero():
    zeros = np.zeros((256, len(INDEX_FIELDS)), np.int64)
    assert len(committed_rows(zeros, Path("x"), checked=True)) == 0
    ends = commit_ends(committed_rows(zeros, Path("x")))
    assert set(ends) == set(INDEX_FIELDS[1:-1]) and not any(ends.values())


def test_the_ends_are_those_of_the_last_commit(healthy):
    _, rows = healthy
    ends = commit_ends(rows)
    assert list(ends) == INDEX_FIELDS[1:-1]
    assert ends == {k: int(rows[-1, P[k]]) for k in INDEX_FIELDS[1:-1]} and ends["calls"] == 15


# ------------------------------------------------------------------ dropped steps' reasons
def test_a_dropped_steps_reason_names_its_errno():
    assert drop_reason(FLAG_DROPPED) == "writing it failed"
    assert drop_reason(FLAG_DROPPED | (errno.ENOSPC << 8)) == (
        f"writing it failed with errno {errno.ENOSPC} (ENOSPC: {os.strerror(errno.ENOSPC)})")
    assert drop_reason(FLAG_DROPPED | (errno.EIO << 8) | (1 << 24)) == (
        f"writing it failed with errno {errno.EIO} (EIO: {os.strerror(errno.EIO)})")  # bits above 23: not errno
    assert drop_reason(FLAG_DROPPED | (0xFFFF << 8)).startswith("writing it failed with errno 65535 (?: ")


# ------------------------------------------------------------------ extents
@pytest.mark.parametrize("field", ["calls", "strings", "string_bytes", "u4"])
def test_a_length_beyond_the_stored_data_is_refused_before_reading(tmp_path, healthy, field):
    def grow(r):
        r[2, P[field]] += 10 ** 9
        return r
    f = _rewrite(tmp_path, healthy, grow)
    name = f"tensors/{field}" if field.startswith("u") else field
    _refused(f, rf"the commit index says {name} has {int(healthy[1][2, P[field]]) + 10 ** 9} "
                r"(rows, so /\S+ needs \d+ in whole chunks, but it holds \d+|entries, but it holds \d+)")


def test_a_dataset_of_the_wrong_shape_is_refused(tmp_path, healthy):
    f = _rewrite(tmp_path, healthy, lambda r: r)
    with h5py.File(f, "r+") as h:
        del h["calls/numel"]
        h.create_dataset("calls/numel", shape=(4, 4), dtype="int64")
    _refused(f, r"/calls/numel or its tail has an unexpected shape")
    f = _rewrite(tmp_path / "b", healthy, lambda r: r)
    with h5py.File(f, "r+") as h:
        del h["tensors/u4"]
        h.create_dataset("tensors/u4", data=np.zeros((4, 4), "uint32"))
    _refused(f, r"the commit index says tensors/u4 has \d+ entries, but it holds 0")


def test_a_buffer_whose_stored_chunks_are_missing_is_refused(tmp_path, healthy):
    # the extent is right but the chunks were never written (a file cut short): reading would return zeros
    f = _rewrite(tmp_path, healthy, lambda r: r)
    need = int(healthy[1][2, P["u4"]])
    with h5py.File(f, "r+") as h:
        ds = h["tensors/u4"]
        shape, chunks, dtype = ds.shape, ds.chunks, ds.dtype
        del h["tensors/u4"]
        h.create_dataset("tensors/u4", shape=shape, chunks=chunks, dtype=dtype, maxshape=(None,))
    assert shape[0] >= need
    _refused(f, rf"the commit index says tensors/u4 has {need} entries, but it holds 0")


@pytest.mark.parametrize("width", [1, 2])
def test_a_buffer_stored_whole_must_hold_every_entry_the_index_names(tmp_path, healthy, width):
    # a contiguous (unchunked) buffer stores all of its extent: exactly enough reads, one entry short is refused
    def grow(r):  # the steps' buffer ends, at 8 entries past the last
        r[:, P[f"u{width}"]] = [0, 0, 8]
        return r
    for short in (0, 1):
        f = _rewrite(tmp_path / str(short), healthy, grow)
        with h5py.File(f, "r+") as h:
            dtype = h[f"tensors/u{width}"].dtype
            del h[f"tensors/u{width}"]
            h.create_dataset(f"tensors/u{width}", data=np.zeros(8 - short, dtype))
        if short:
            _refused(f, rf"the commit index says tensors/u{width} has 8 entries, but it holds 7")
        else:
            assert len(read_hdf5(f).calls) == 15


def test_a_buffer_whose_last_chunk_was_never_stored_is_refused(tmp_path, healthy):
    f = _rewrite(tmp_path, healthy, lambda r: r)
    need = int(healthy[1][2, P["u4"]])
    with h5py.File(f, "r+") as h:
        ds = h["tensors/u4"]
        shape, chunks, data = ds.shape, ds.chunks, ds[()]
        del h["tensors/u4"]
        new = h.create_dataset("tensors/u4", shape=shape, chunks=chunks, dtype=data.dtype, maxshape=(None,))
        new[: need - chunks[0]] = data[: need - chunks[0]]  # all chunks but the last
        stored = new.id.get_num_chunks() * chunks[0]
    assert 0 < stored < need
    _refused(f, rf"the commit index says tensors/u4 has {need} entries, but it holds {stored}")


def test_a_tail_of_no_rows_is_refused(tmp_path, healthy):
    f = _rewrite(tmp_path, healthy, lambda r: r)
    with h5py.File(f, "r+") as h:
        t = h["tail/calls"]
        attrs, shape, dtype = dict(t.attrs), t.shape, t.dtype
        del h["tail/calls"]
        new = h.create_dataset("tail/calls", shape=(shape[0], 0, *shape[2:]), dtype=dtype)
        new.attrs.update(attrs)
        h.attrs["attrs_crc"] = attrs_digest(h)
    _refused(f, r"/calls/\S+ or its tail has an unexpected shape")


@pytest.fixture(scope="module")
def long(tmp_path_factory) -> tuple[Path, np.ndarray]:
    """A 3-step file of 9000 calls rows: two whole chunks of /calls/* (4096 rows each) and a tail."""
    f = _dump(tmp_path_factory.mktemp("long") / "d", rows=3000)
    with h5py.File(f, "r") as h:
        rows = h["index/steps"][()]
    return f, rows[rows[:, P["commit"]] == COMMIT_MAGIC]


def test_rows_in_whole_chunks_must_be_in_the_main_datasets(tmp_path, long):
    f, rows = long
    assert int(rows[-1, P["calls"]]) == 9000 and len(read_hdf5(f).calls) == 9000
    ahead = _rewrite(tmp_path / "ahead", long, lambda r: r)
    with h5py.File(ahead, "r+") as h:  # a writer killed after growing a column, before its commit: still reads
        h["calls/numel"].resize((12288,))
        h["calls/numel"][8192:] = 7
    assert read_hdf5(ahead).calls["numel"].tolist() == read_hdf5(f).calls["numel"].tolist()
    cut = _rewrite(tmp_path / "cut", long, lambda r: r)
    with h5py.File(cut, "r+") as h:
        h["calls/numel"].resize((4096,))  # the extent lost a chunk
    _refused(cut, r"the commit index says calls has 9000 rows, so /calls/numel needs 8192 in whole chunks, but it "
                  r"holds 4096")
    lost = _rewrite(tmp_path / "lost", long, lambda r: r)
    with h5py.File(lost, "r+") as h:
        ds = h["calls/numel"]
        shape, chunks, data = ds.shape, ds.chunks, ds[()]
        attrs = dict(ds.attrs)
        del h["calls/numel"]
        new = h.create_dataset("calls/numel", shape=shape, chunks=chunks, dtype=data.dtype, maxshape=(None,))
        new.attrs.update(attrs)
        new[:4096] = data[:4096]  # the second chunk never reached the disk
    _refused(lost, r"the commit index says calls has 9000 rows, so /calls/numel needs 8192 in whole chunks, but it "
                   r"holds 4096")


def test_a_scalar_dataset_where_a_column_or_a_buffer_belongs_is_refused(tmp_path, healthy):
    f = _rewrite(tmp_path, healthy, lambda r: r)
    with h5py.File(f, "r+") as h:
        del h["calls/numel"]
        h.create_dataset("calls/numel", data=np.int64(3))
    _refused(f, r"/calls/numel or its tail has an unexpected shape")
    f = _rewrite(tmp_path / "b", healthy, lambda r: r)
    with h5py.File(f, "r+") as h:
        del h["tensors/u2"]
        h.create_dataset("tensors/u2", data=np.uint16(3))
    _refused(f, r"the commit index says tensors/u2 has 0 entries, but it holds 0")
    f = _rewrite(tmp_path / "c", healthy, lambda r: r)
    with h5py.File(f, "r+") as h:  # 2-D, and no entry of it is needed: refused all the same
        del h["tensors/u2"]
        h.create_dataset("tensors/u2", data=np.zeros((4, 4), "uint16"))
    _refused(f, r"the commit index says tensors/u2 has 0 entries, but it holds 0")


def test_a_buffer_stored_whole_but_never_written_is_refused(tmp_path, healthy):
    # HDF5 allocates a contiguous dataset's storage on first write: an extent with no storage holds nothing
    def grow(r):
        r[:, P["u2"]] = [0, 0, 2]
        return r
    f = _rewrite(tmp_path, healthy, grow)
    with h5py.File(f, "r+") as h:
        del h["tensors/u2"]
        h.create_dataset("tensors/u2", shape=(2,), dtype="uint16")
        assert h["tensors/u2"].id.get_storage_size() == 0
    _refused(f, r"the commit index says tensors/u2 has 2 entries, but it holds 0")
