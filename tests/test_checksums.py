"""store/checksums.py: the dumps' crc32 is zlib-ng's where installed, and equals the standard library's."""
from __future__ import annotations

import subprocess
import sys
import zlib

import numpy as np
import pytest

from msprobe_nb.store import checksums


def test_zlib_ng_serves_where_it_is_installed():
    """zlib-ng is a core dependency: with it installed the writer's tails and the hash task use its crc32."""
    ng = pytest.importorskip("zlib_ng.zlib_ng", reason="zlib-ng is not installed (a core dependency)")
    assert checksums.BACKEND == "zlib-ng"
    assert checksums.crc32 is ng.crc32


@pytest.mark.parametrize("n", [0, 1, 3, 15, 16, 17, 63, 64, 65, 255, 256, 4095, 4097, 65_537, 285_001])
def test_crc32_equals_the_standard_library_s_for_any_length_start_and_alignment(n):
    rng = np.random.default_rng(n)
    buf = rng.integers(0, 256, n + 7, dtype=np.uint8)
    for off in (0, 1, 5):  # unaligned starts: the SIMD path's head and tail
        data = buf[off:off + n]
        for start in (0, 1, 0xFFFFFFFF, zlib.crc32(b"msprobe")):
            assert checksums.crc32(data, start) == zlib.crc32(data, start), (n, off, start)
    assert checksums.crc32(buf[:n]) == zlib.crc32(buf[:n].tobytes())


def test_crc32_continues_from_a_running_value_as_the_tails_use_it():
    """A tail's crc goes on from the committed rows' crc over the new rows only: the sum of the whole."""
    rows = np.random.default_rng(0).integers(0, 256, (100, 133), dtype=np.uint8)
    crc = 0
    for lo in range(0, 100, 7):
        crc = checksums.crc32(rows[lo:lo + 7], crc)
    assert crc == zlib.crc32(rows.tobytes())


def test_without_zlib_ng_the_standard_library_serves(tmp_path):
    """Installed without its dependencies, the store still writes and reads dumps with equal checksums."""
    code = ("import sys; sys.modules['zlib_ng'] = None; sys.modules['zlib_ng.zlib_ng'] = None\n"
            "import zlib\n"
            "from msprobe_nb.store import checksums\n"
            "assert checksums.BACKEND == 'zlib' and checksums.crc32 is zlib.crc32, checksums.BACKEND\n"
            "from msprobe_nb.store.hdf5_writer import DumpWriter\n"
            "from msprobe_nb.store.hdf5_reader import read_hdf5\n"
            "with DumpWriter(sys.argv[1]) as w:\n"
            "    for s in range(3):\n"
            "        w.write_step(s, {'name': [f'Torch.add.{s}.forward.input.0'], 'max': [float(s)]})\n"
            "d = read_hdf5(sys.argv[1])\n"
            "print(len(d.calls), list(d.calls['max']))\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "dump")], capture_output=True, text=True,
                         check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["3", "[0.0,", "1.0,", "2.0]"], out.stdout
