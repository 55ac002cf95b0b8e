"""Layering: comparing msprobe dumps needs neither torch nor h5py, and the analysis layer imports no capture
module that needs torch (each is checked in a fresh interpreter, since this test process has both loaded)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "data" / "samples"
#: capture modules the analysis layer may import: they hold plain data and import no torch
TORCH_FREE_CAPTURE = {"msprobe_nb.capture", "msprobe_nb.capture.random_apis", "msprobe_nb.capture.setup_env"}


def _run(code: str) -> dict:
    """Run ``code`` in a fresh interpreter; it prints one JSON object as its last line."""
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_loading_and_comparing_msprobe_dumps_imports_neither_torch_nor_h5py(tmp_path: Path):
    bad = tmp_path / "rank0"
    bad.mkdir()
    (bad / "dump.json").write_text('{"data": {"Torch.add.0.forward": ')  # truncated: refused
    out = _run(f"""
import json, sys
import msprobe_nb as mp
a, b = mp.load({str(SAMPLES / "denoiser_npu")!r}), mp.load({str(SAMPLES / "denoiser_bench")!r})
result = mp.compare(a, b, progress=False)
by_path = mp.compare({str(SAMPLES / "denoiser_npu")!r}, {str(SAMPLES / "denoiser_bench")!r}, progress=False)
try:
    mp.load({str(bad)!r})
    refused = False
except mp.DumpFormatError:
    refused = True
print(json.dumps({{"rows": len(result),
                  "same": result.counts() == by_path.counts(), "refused": refused,
                  "heavy": sorted(m for m in ("torch", "h5py") if m in sys.modules)}}))
""")
    assert out["heavy"] == [], f"imported {out['heavy']} to load and compare msprobe dumps"
    assert out["same"] and out["refused"] and out["rows"] > 0


def test_analysis_modules_import_no_torch():
    modules = sorted(f"msprobe_nb.analysis.{p.stem}" for p in (REPO / "msprobe_nb" / "analysis").glob("*.py")
                     if p.stem != "__init__")
    out = _run(f"""
import importlib, json, sys
found = {{}}
for name in {modules!r}:
    before = set(sys.modules)
    importlib.import_module(name)
    new = set(sys.modules) - before
    found[name] = sorted(m for m in new if m == "torch" or m.startswith("msprobe_nb.capture"))
print(json.dumps(found))
""")
    assert set(out) == set(modules)
    for name, imported in out.items():
        assert "torch" not in imported, f"import {name} imports torch"
        assert set(imported) <= TORCH_FREE_CAPTURE, f"import {name} imports {imported}"


def test_dump_format_error_is_one_light_class():
    out = _run("""
import json, sys
import msprobe_nb.store.errors as errors
light = sorted(m for m in ("torch", "h5py", "numpy", "pandas") if m in sys.modules)
import msprobe_nb as mp
from msprobe_nb.store import hdf5_reader, msprobe_reader
print(json.dumps({"light": light, "same": mp.DumpFormatError is errors.DumpFormatError
                  is hdf5_reader.DumpFormatError is msprobe_reader.DumpFormatError,
                  "value_error": issubclass(errors.DumpFormatError, ValueError)}))
""")
    assert out == {"light": [], "same": True, "value_error": True}


def test_ci_lints_after_installing_and_before_testing():
    """.ci/run runs ruff over the package, the tests and the benchmarks once ruff is installed, before pytest."""
    lines = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    install = max(i for i, line in enumerate(lines) if line.startswith("python -m pip install") and ".[test" in line)
    lint = [i for i, line in enumerate(lines) if line == "ruff check msprobe_nb tests benchmarks"]
    tests = [i for i, line in enumerate(lines) if line.startswith("python -m pytest")]
    assert lint and tests and install < lint[0] < tests[0]


# -------------------------------------------------------------------------------------- the import rules
#: what each layer may import from the package (docs/architecture.md, "Rules between the layers")
ALLOWED = {
    "capture": ("msprobe_nb.capture", "msprobe_nb.store.schema",  # the calls-table contract it fills
                "msprobe_nb.store.monitor_schema", "msprobe_nb.store.monitor_rules",  # the monitor's, its rules
                "msprobe_nb.store.checksums"),  # the one crc32, of the hash task's tensors as of the dumps
    "store": ("msprobe_nb.store", "msprobe_nb", "msprobe_nb.progress"),  # "msprobe_nb" alone: the version
    "analysis": ("msprobe_nb.analysis", "msprobe_nb.store", "msprobe_nb.capture.random_apis",
                 "msprobe_nb.capture.setup_env", "msprobe_nb.progress"),  # torch-free tables
    "precheck": ("msprobe_nb.precheck", "msprobe_nb.capture", "msprobe_nb.store", "msprobe_nb.analysis",
                 "msprobe_nb.progress"),  # replays calls from dumps: torch, the capture's leaf walk
    "viewers": ("msprobe_nb.viewers", "msprobe_nb.analysis", "msprobe_nb.store", "msprobe_nb.progress",
                "msprobe_nb.precheck.result"),  # the pre-check's table, torch-free
    "progress": (),
    "config": ("msprobe_nb.options",),  # the option table it validates by
    "options": (),
    # shells over the public API for other frameworks' loops (the Trainer callback): they drive the shells
    "integrations": ("msprobe_nb.integrations", "msprobe_nb.debugger", "msprobe_nb.monitor"),
}


def _package_imports() -> dict[str, set[str]]:
    """module -> the msprobe_nb modules it imports (statically, relative imports resolved)."""
    import ast
    out: dict[str, set[str]] = {}
    for p in (REPO / "msprobe_nb").rglob("*.py"):
        parts = p.relative_to(REPO).with_suffix("").parts
        mod = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        pkg = mod if parts[-1] == "__init__" else mod.rpartition(".")[0]
        found = out.setdefault(mod, set())
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1] if node.level else []
                name = ".".join(base + [node.module] if node.module else base) if node.level else node.module or ""
                names = [name] + [f"{name}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            found.update(n for n in names if n == "msprobe_nb" or n.startswith("msprobe_nb."))
    return out


def _known(name: str, modules: set[str]) -> str | None:
    """The module an imported name refers to (``from pkg import mod`` names a module; ``from mod import X``
    names something in mod)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def test_each_layer_imports_only_what_it_may():
    imports = _package_imports()
    modules = set(imports)
    bad = []
    for mod, names in sorted(imports.items()):
        layer = mod.split(".")[1] if mod.count(".") else ""
        layer = {"msprobe_nb.config": "config", "msprobe_nb.options": "options",
                 "msprobe_nb.progress": "progress"}.get(mod, layer)
        if layer not in ALLOWED:
            continue  # the shells: debugger, magics, cli, demo, seeding and the package itself
        for name in names:
            target = _known(name, modules)
            if target is None or target == mod:
                continue
            if not any(target == a or target.startswith(a + ".") for a in ALLOWED[layer]) \
                    or (target == "msprobe_nb" and layer != "store"):
                bad.append(f"{mod} imports {target}")
    assert bad == [], "layer rule broken (docs/architecture.md):\n" + "\n".join(bad)


def test_no_layer_imports_the_shells():
    shells = {"msprobe_nb.debugger", "msprobe_nb.magics", "msprobe_nb.cli", "msprobe_nb.demo"}
    imports = _package_imports()
    bad = [f"{m} imports {n}" for m, names in imports.items() if m.count(".") >= 2
           and not m.startswith("msprobe_nb.integrations.")  # a shell itself, over the other shells
           for n in names if _known(n, set(imports)) in shells]
    assert bad == []


# -------------------------------------------------------------------------------------- one job per module
#: "~600 lines": a module past this has grown more than one job (docs/architecture.md, "Adding a capability")
MAX_MODULE_LINES = 620


def test_no_module_outgrows_one_job():
    long = {str(p.relative_to(REPO)): n for p in (REPO / "msprobe_nb").rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert long == {}, f"split these by job (at most ~600 lines each): {long}"


def test_every_subpackage_is_a_declared_layer():
    """A new folder of the package is a layer with import rules, not a place the rules do not look."""
    folders = {p.name for p in (REPO / "msprobe_nb").iterdir() if (p / "__init__.py").is_file()}
    assert folders - set(ALLOWED) == set(), "declare the layer in ALLOWED and docs/architecture.md"


def test_the_docs_name_every_module_and_the_readme_every_folder():
    """docs/architecture.md's module table lists each module of each layer; README's layout table lists each
    layer's folder and names no path that does not exist."""
    arch = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    missing = [str(p.relative_to(REPO)) for layer in ALLOWED if (REPO / "msprobe_nb" / layer).is_dir()
               for p in sorted((REPO / "msprobe_nb" / layer).glob("*.py"))
               if p.name != "__init__.py" and f"`{p.name}`" not in arch and f"`{p.stem}`" not in arch]
    assert missing == [], f"docs/architecture.md does not say what lives in {missing}"
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    layout = readme[readme.index("## Layout"):]
    rows = [line.split("|")[1].strip() for line in layout.splitlines()[4:] if line.startswith("| `")]
    paths = [q for row in rows for q in row.replace("`", "").split(", ")]
    gone = [q for q in paths if "/" in q and not (REPO / q).exists()]
    assert gone == [], f"README's layout table names paths that do not exist: {gone}"
    folders = sorted(p.name for p in (REPO / "msprobe_nb").iterdir() if (p / "__init__.py").is_file())
    unlisted = [f for f in folders if f"msprobe_nb/{f}/" not in paths]
    assert unlisted == [], f"README's layout table does not list msprobe_nb/{unlisted}"


def test_architecture_doc_names_every_top_level_module_and_draws_precheck_and_the_monitor():
    """docs/architecture.md is the map: each module of the package's top level is named there (as `name.py`), and
    its diagram (the first code block) draws the precheck/ layer and the monitor."""
    import re

    doc = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    modules = [p.name for p in sorted((REPO / "msprobe_nb").glob("*.py")) if p.name != "__init__.py"]
    missing = [m for m in modules if f"`{m}`" not in doc]
    assert not missing, f"docs/architecture.md does not name {missing}"
    diagram = re.search(r"```\n(.*?)```", doc, re.S).group(1)
    assert "precheck/" in diagram and "monitor" in diagram, diagram
