"""Call stacks: each recorded call's stack, deduplicated to a small id, and its text for stack.json.

The walk runs on every recorded call, so it is kept cheap: a stack's key is the (instruction offset,
id(code)) of its frames packed into bytes (the optional C walk builds the same bytes faster), and calls
from the frame of the previous call reuse its ids. A new key is described once by the (file, line,
function) of its user frames; its source text is read at the step's end.
"""
from __future__ import annotations

import inspect
import linecache
import os
import sys
import tokenize
from array import array
from types import FrameType
from typing import Any

from msprobe_nb.capture import c_contract

_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: the kit's recording machinery: its frames are left out of user stacks (the demo's are kept)
_KIT_FILES = (os.path.dirname(os.path.abspath(__file__)) + os.sep, os.path.join(_PKG_DIR, "debugger.py"),
              os.path.join(_PKG_DIR, "magics.py"))
MAX_STACK_DEPTH = 64
KEY_BYTES_PER_FRAME = 16  # a frame's (f_lasti, id(f_code)) in a stack key
_U64 = (1 << 64) - 1
#: generator and coroutine frames: suspended and resumed under other callers, so their ancestors change
_RESUMABLE = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ITERABLE_COROUTINE | inspect.CO_ASYNC_GENERATOR

# optional C walk (setup.py, CPython 3.11+): the same key as _walk_key, faster; None where not built or stale
_stack_keys = c_contract.stack_keys()
_stack_key = _stack_keys.stack_key if _stack_keys is not None else None
# the same extension's stack_id / walked_id over a table's state (None: StackTable's own methods)
_Ids = getattr(_stack_keys, "Ids", None)


def _walk_key(frame) -> bytes:
    """(f_lasti, id(f_code)) of ``frame`` and its callers, MAX_STACK_DEPTH frames at most, as native unsigned
    64-bit integers packed into bytes: a stack's key. The instruction is cheaper to read than f_lineno; it is
    turned into a line once, for a new key. Bytes, not a tuple of ints: a lookup compares the key with the
    stored one, one memcmp instead of an int object (and its cache miss) per element."""
    key = array("Q")
    app = key.append
    f = frame
    depth = MAX_STACK_DEPTH
    while f is not None and depth:
        app(f.f_lasti & _U64)
        app(id(f.f_code))
        f = f.f_back
        depth -= 1
    return key.tobytes()


class StackTable:
    """The stacks of one recording: ids by key, their frames, and those first seen this step."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self._stack_ids: dict[bytes, int] = {}  # packed stack key -> stack id
        self._stack_keys: dict[tuple, int] = {}  # (file, line, function) of each user frame -> stack id
        # The frame of the last recorded API call and its stack ids by instruction. While a function's frame
        # runs, its ancestors cannot change, so calls from the same frame only differ by where in it they
        # are (not so for generators: excluded). Held (not by id: ids of dead frames are reused) until
        # another frame records an API call or the step ends; module calls (walked_id) leave it alone, so a
        # forward's API calls around a submodule call keep the shortcut.
        self._last_frame: FrameType | None = None
        self._last_frame_sids: dict[int, int] = {}
        self._codes: dict[int, Any] = {}
        self._new_stacks: dict[int, list[tuple[str, int, str]]] = {}
        if _stack_key is not None and _Ids is not None:  # the C walk's ids, without a Python frame per call
            ids = _Ids(self, MAX_STACK_DEPTH)
            self.stack_id = ids.stack_id  # type: ignore[method-assign]
            self.walked_id = ids.walked_id  # type: ignore[method-assign]

    def stack_id(self, frame: FrameType | None) -> int:
        """Id of the deduplicated stack above ``frame`` (kit frames left out); -1 when stacks are off.

        The key packs (instruction offset, id(code)) of every frame into bytes, kit frames included:
        hashing code objects is slow, and the walk is on every call. A new key is described once
        by the (file, line, function) of its user frames, and keys described alike share one id. The code
        objects of every key are kept alive in ``_codes``, so their ids cannot be reused by other code.
        """
        if not self.enabled or frame is None:
            return -1
        if frame is self._last_frame:  # another call from the frame of the last one: same ancestors
            sid = self._last_frame_sids.get(frame.f_lasti)
            if sid is not None:
                return sid
        elif frame.f_code.co_flags & _RESUMABLE:  # a generator is resumed from anywhere: no shortcut
            self._last_frame = None
        else:
            self._last_frame = frame
            self._last_frame_sids = {}
        sid = self.walked_id(frame)
        if self._last_frame is frame:
            self._last_frame_sids[frame.f_lasti] = sid
        return sid

    def walked_id(self, frame) -> int:
        """Id of the stack above ``frame`` from a walk, without the same-frame shortcut: for calls made
        from a frame that records nothing else (a module call's frame is torch's, one per call), where
        holding that frame would only cost freeing it and its locals at the next call."""
        if not self.enabled or frame is None:
            return -1
        key = _stack_key(frame, MAX_STACK_DEPTH) if _stack_key is not None else _walk_key(frame)
        sid = self._stack_ids.get(key)
        if sid is None:
            sid = self._stack_ids[key] = self._new_stack(frame)
        return sid

    def _new_stack(self, frame) -> int:
        """Id of the stack above ``frame``, deduplicated by (file, line, function) of its user frames; the
        source text is read at the step's end (:meth:`render_new`)."""
        frames = []
        f = frame
        depth = MAX_STACK_DEPTH
        while f is not None and depth:
            code = f.f_code
            self._codes[id(code)] = code
            if not code.co_filename.startswith(_KIT_FILES):
                frames.append((code.co_filename, f.f_lineno or code.co_firstlineno, code.co_name))
            f = f.f_back
            depth -= 1
        key = tuple(frames)
        sid = self._stack_keys.get(key)
        if sid is None:
            sid = self._stack_keys[key] = len(self._stack_keys)
            self._new_stacks[sid] = frames
        return sid

    def render_new(self) -> dict[int, list[str]]:
        """msprobe's stack.json text of the stacks first seen this step."""
        if not self._new_stacks:
            return {}
        wanted: dict[str, set[int]] = {}
        for frames in self._new_stacks.values():
            for filename, ln, _ in frames:
                wanted.setdefault(filename, set()).add(ln)
        text = _source_lines(wanted)
        shown = _cell_names(wanted)
        return {sid: [f"File {shown.get(fn, fn)}, line {ln}, in {name}, \n {text.get((fn, ln), '')}"
                      for fn, ln, name in frames]
                for sid, frames in self._new_stacks.items()}

    def flushed(self) -> None:
        """The new stacks are written: the next step's new stacks start empty."""
        self._new_stacks.clear()

    def release_frame(self) -> None:
        """Let the last frame and its locals go (at the step's end)."""
        self._last_frame = None
        self._last_frame_sids = {}


def _source_lines(wanted: dict[str, set[int]]) -> dict[tuple[str, int], str]:
    """Stripped source text of each wanted (file, line), reading each file once up to its last wanted line.

    Why not ``linecache.getline`` alone: it keeps every file it reads for the rest of the process, and the
    torch sources a training step's stacks pass through (functional.py, module.py, ...) held about 4 MB,
    which counts against peak memory. Files linecache already holds (notebook cells, tracebacks) are read
    from it; other sources it alone can load (zip imports) are read through it and dropped again.
    """
    out: dict[tuple[str, int], str] = {}
    for filename, lines in wanted.items():
        if filename in linecache.cache:
            for ln in lines:
                out[filename, ln] = linecache.getline(filename, ln).strip()
            continue
        try:
            last = max(lines)
            with tokenize.open(filename) as fh:  # honours the file's coding declaration, as linecache does
                for i, text in enumerate(fh, 1):
                    if i in lines:
                        out[filename, i] = text.strip()
                    if i >= last:
                        break
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
            for ln in lines:
                out[filename, ln] = linecache.getline(filename, ln).strip()
            linecache.cache.pop(filename, None)
    return out


def _cell_names(filenames) -> dict[str, str]:
    """``Cell In[3]`` for the files IPython compiled notebook cells into (``/tmp/ipykernel_21711/37...py``),
    as IPython's own tracebacks name them; {} outside IPython."""
    ipython = sys.modules.get("IPython")
    get = getattr(ipython, "get_ipython", None) if ipython is not None else None
    shell = get() if get is not None else None
    name_of = getattr(getattr(shell, "compile", None), "format_code_name", None)
    if name_of is None:
        return {}
    out = {}
    for fn in filenames:
        try:
            named = name_of(fn)
        except Exception:  # noqa: BLE001 - a nicer name is optional
            named = None
        if named:
            out[fn] = " ".join(named)
    return out


def caller_frame(depth: int = 2):
    """The first frame outside msprobe_nb, ``depth`` frames up."""
    f: FrameType | None = sys._getframe(depth)
    while f is not None and f.f_code.co_filename.startswith(_KIT_FILES):
        f = f.f_back
    return f
