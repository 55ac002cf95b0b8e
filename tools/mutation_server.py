"""A fork server for tools/mutation.py (issue 36): it imports the heavy third-party libraries (numpy, pandas,
pytest, torch) once, then runs each mutant's tests in a forked child that imports msprobe_nb afresh from the
mutated copy. A mutant then costs its tests, not an interpreter's start-up and imports (about 1.5-3 s each).
The server never imports msprobe_nb itself, so no child can see an unmutated module.

    python tools/mutation_server.py serve SOCKET [--preload numpy pandas ...]   # started by tools/mutation.py
    python tools/mutation_server.py run SOCKET TIMEOUT PYTEST_ARGS...          # cosmic-ray's test command

``run`` runs the test files in order, each in a fresh child, up to the first that fails, prints their output and
exits with pytest's status; a file's run past TIMEOUT is killed and prints just ``timeout`` (what
tools/mutation.py counts as a timed-out mutant).
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import select
import signal
import socket
import sys
import tempfile

#: torch._inductor.config: what torch.use_deterministic_algorithms() imports on its first call (seconds; seed_all
#: makes it)
PRELOAD = ["numpy", "pandas", "pytest", "h5py", "torch", "torch._inductor.config"]
#: the package's parts whose modules may be preloaded (those that do not import the mutated module)
PACKAGE_PRELOAD = ["msprobe_nb", "msprobe_nb.config", "msprobe_nb.store.*", "msprobe_nb.analysis.*"]


def _child(args: list[str], cwd: str, out_fd: int, path: str | None = None) -> None:
    """In the forked child: its own process group, output to ``out_fd``, pytest in process, then exit.
    ``path``: a folder put first on ``sys.path`` (the copy of the package to import; tests/test_mutants.py)."""
    os.setpgid(0, 0)
    try:  # Linux: die with the server, so that a stopped run leaves no test behind
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(out_fd, 1)
    os.dup2(out_fd, 2)
    rc = 3
    try:
        os.chdir(cwd)
        if path:
            sys.path.insert(0, path)
        import pytest

        rc = int(pytest.main(args))
    except BaseException as e:  # noqa: B036 - whatever happens, the child must exit with a status, not return
        print(f"mutation_server: {type(e).__name__}: {e}", flush=True)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)


def _wait(pid: int, timeout: float) -> int | None:
    """The child's exit status, or None (after killing its group) when it runs past ``timeout``."""
    fd = os.pidfd_open(pid)
    try:
        ready, _, _ = select.select([fd], [], [], timeout)
    finally:
        os.close(fd)
    if not ready:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(pid, 0)
        return None
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def _imports_cleanly(name: str, mutated: str) -> bool:
    """Whether importing ``name`` works and leaves ``mutated`` unimported, tried in a throwaway child."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        ok = False
        try:
            importlib.import_module(name)
            ok = mutated not in sys.modules
        except BaseException:  # noqa: B036 - any failure: not preloaded
            pass
        os.write(w, b"1" if ok else b"0")
        os._exit(0)
    os.close(w)
    ok = os.read(r, 1) == b"1"
    os.close(r)
    os.waitpid(pid, 0)
    return ok


def _preload_package(mutated: str, tests_dir: str) -> None:
    """Import the package's modules that do not import the mutated one when imported (``PACKAGE_PRELOAD``),
    and the tests' helpers: a module importing the mutated one would hold its unmutated names, so it is
    left to each child. A module that imports the mutated one only inside a function gets the mutant."""
    names = []
    for sub in PACKAGE_PRELOAD:
        if sub.endswith(".*"):  # a subpackage and all its modules
            sub = sub[:-2]
            base = os.path.join(os.getcwd(), *sub.split("."))
            names += [sub] + [f"{sub}.{f[:-3]}" for f in sorted(os.listdir(base))
                              if f.endswith(".py") and f != "__init__.py"]
        else:
            names.append(sub)
    sys.path.insert(0, tests_dir)
    for name in [*names, "helpers"]:
        if name != mutated and _imports_cleanly(name, mutated):
            importlib.import_module(name)
    sys.path.remove(tests_dir)


def serve(path: str, preload: list[str], mutated: str | None = None, tests_dir: str | None = None) -> None:
    sys.dont_write_bytecode = True
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # no entry-point scan per run; the tests use no plugin
    for name in preload:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    if mutated:
        _preload_package(mutated, tests_dir or os.getcwd())
    assert mutated is None or mutated not in sys.modules, f"{mutated} preloaded"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path + ".tmp")
    os.rename(path + ".tmp", path)  # the socket appears only once the server is ready
    srv.listen(4)
    while True:
        conn, _ = srv.accept()
        with conn:
            req = json.loads(conn.makefile("r").readline())
            with tempfile.TemporaryFile() as out:
                pid = os.fork()
                if pid == 0:
                    srv.close()
                    _child(req["args"], req["cwd"], out.fileno(), req.get("path"))
                rc = _wait(pid, float(req["timeout"]))
                out.seek(0)
                text = "timeout" if rc is None else out.read().decode("utf-8", "replace")
            try:
                conn.sendall(json.dumps({"rc": 1 if rc is None else rc, "output": text}).encode() + b"\n")
            except OSError:
                pass  # the client was killed meanwhile


def ask(path: str, timeout: float, args: list[str], cwd: str | None = None,
        package: str | None = None) -> tuple[int, str]:
    """Run pytest ``args`` in a child of the server at ``path``, in ``cwd`` (default: ours), with ``package``
    first on its ``sys.path``; (pytest's status, its output)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(path)
        s.sendall(json.dumps({"args": args, "cwd": cwd or os.getcwd(), "path": package,
                              "timeout": timeout}).encode() + b"\n")
        res = json.loads(s.makefile("r").readline())
    return int(res["rc"]), res["output"]


def run(path: str, timeout: float, args: list[str]) -> int:
    """The test files one after the other, each in its own child, up to the first that fails: a mutant the
    first (fast) file kills costs neither the import nor the collection of the others."""
    files = [a for a in args if a.endswith(".py") or ".py::" in a]
    opts = [a for a in args if a not in files]
    rc = 0
    for f in files or [None]:
        rc, text = ask(path, timeout, opts + ([f] if f else []))
        sys.stdout.write(text)
        if rc != 0:
            break
    return rc


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve")
    s.add_argument("socket")
    s.add_argument("--preload", nargs="*", default=PRELOAD)
    s.add_argument("--mutated", help="the mutated module (msprobe_nb.analysis.x): the package is preloaded without it")
    s.add_argument("--tests-dir", help="where the tests' helpers.py is")
    r = sub.add_parser("run")
    r.add_argument("socket")
    r.add_argument("timeout", type=float)
    r.add_argument("pytest_args", nargs=argparse.REMAINDER)
    a = p.parse_args()
    if a.cmd == "serve":
        serve(a.socket, a.preload, a.mutated, a.tests_dir)
    else:
        sys.exit(run(a.socket, a.timeout, a.pytest_args))


if __name__ == "__main__":
    main()
