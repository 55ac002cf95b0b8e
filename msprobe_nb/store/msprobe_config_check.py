"""msprobe's ``config_check`` pack (``config_check_pack.zip``, or the folder it was unpacked to) read as a set-up
record, where its format allows: the environment variables, the library versions (pip) and the training
hyper-parameters, found by their members' names (``*env*.json``, ``*pip*``, ``*hyperparameter*.json``). Its
weights, dataset and random-operation parts are not read (docs/setup_check.md). Nothing is unpacked to disk
and nothing is unpickled; every member is read with a size limit, and a damaged pack is a DumpFormatError.
"""
from __future__ import annotations

import json
import re
import zipfile
from pathlib import Path
from typing import Any

from msprobe_nb.store.errors import DumpFormatError

__all__ = ["read_config_check"]

_MEMBER_MAX = 16 << 20
_MEMBERS_MAX = 20000
_PIP_LINE = re.compile(r"^\s*([A-Za-z0-9_.\-]+)\s*(?:==|\s)\s*([^\s;]+)")


def _members(path: Path) -> dict[str, bytes]:
    """name -> bytes of the members worth reading (env, pip, hyper-parameters), size-bounded."""
    wanted = ("env", "pip", "requirement", "hyperparameter")
    out: dict[str, bytes] = {}
    if path.is_dir():
        files = [p for p in path.rglob("*") if p.is_file()][:_MEMBERS_MAX]
        for p in files:
            if any(w in p.name.lower() for w in wanted):
                if p.stat().st_size > _MEMBER_MAX:
                    raise DumpFormatError(f"config_check pack {str(path)!r}: {p.name} is over {_MEMBER_MAX} bytes")
                out[str(p.relative_to(path))] = p.read_bytes()
        return out
    try:
        with zipfile.ZipFile(path) as zf:
            infos = zf.infolist()
            if len(infos) > _MEMBERS_MAX:
                raise DumpFormatError(f"config_check pack {str(path)!r}: {len(infos)} members, over {_MEMBERS_MAX}")
            for info in infos:
                name = info.filename.rsplit("/", 1)[-1].lower()
                if info.is_dir() or not any(w in name for w in wanted):
                    continue
                with zf.open(info) as fh:
                    data = fh.read(_MEMBER_MAX + 1)
                if len(data) > _MEMBER_MAX:
                    raise DumpFormatError(f"config_check pack {str(path)!r}: {info.filename} is over {_MEMBER_MAX} "
                                          "bytes")
                out[info.filename] = data
    except (zipfile.BadZipFile, OSError, EOFError, NotImplementedError, RuntimeError) as e:
        raise DumpFormatError(f"config_check pack {str(path)!r}: not a readable zip ({e})") from None
    return out


def _json(path: Path, name: str, data: bytes) -> Any:
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise DumpFormatError(f"config_check pack {str(path)!r}: {name} is not JSON ({str(e)[:200]})") from None


def read_config_check(path: str | Path) -> dict[str, Any]:
    """The parts of an msprobe config_check pack this kit can compare, as a set-up record."""
    p = Path(path)
    env: dict[str, str] = {}
    versions: dict[str, str] = {}
    hyper: dict[str, Any] = {}
    for name, data in sorted(_members(p).items()):
        low = name.rsplit("/", 1)[-1].lower()
        if "hyperparameter" in low and low.endswith(".json"):
            value = _json(p, name, data)
            if isinstance(value, dict):
                hyper.update({str(k): v for k, v in value.items() if isinstance(v, (str, int, float, bool, list))})
        elif "env" in low and low.endswith(".json"):
            value = _json(p, name, data)
            if isinstance(value, dict):
                env.update({str(k): str(v)[:1000] for k, v in value.items()})
        elif "pip" in low or "requirement" in low:
            if low.endswith(".json"):
                value = _json(p, name, data)
                if isinstance(value, dict):
                    versions.update({str(k): str(v) for k, v in value.items()})
                continue
            for line in data.decode("utf-8", errors="replace").splitlines():
                m = _PIP_LINE.match(line)
                if m and not line.lstrip().startswith("#"):
                    versions[m.group(1).lower().replace("_", "-")] = m.group(2)
    if not (env or versions or hyper):
        raise DumpFormatError(f"config_check pack {str(p)!r}: no environment, pip or hyper-parameter member found")
    versions = {("torch_npu" if k == "torch-npu" else k): v for k, v in versions.items()}
    record: dict[str, Any] = {"format": "msprobe_nb.setup", "version": 1, "rank": 0, "world_size": 1,
                              "source": "msprobe config_check", "path": str(p)}
    if env:
        record["environment"] = {"env": env}
    if versions:
        record["versions"] = versions
    if hyper:
        record["optimizer"] = {"hyperparameters": hyper}
    return record
