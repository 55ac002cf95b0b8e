"""The package's public names are declared once and seen alike by users and by type checkers.

``msprobe_nb/__init__.py`` loads most names lazily (``_LAZY``); type checkers cannot run ``__getattr__``, so a
``TYPE_CHECKING`` block imports the same names. These tests hold ``__all__``, ``_LAZY``, that block and the
package docstring to one another, reading the file's syntax tree (nothing heavy is imported).
"""
from __future__ import annotations

import ast
from pathlib import Path

import msprobe_nb

INIT = Path(msprobe_nb.__file__)


def _tree() -> ast.Module:
    return ast.parse(INIT.read_text(encoding="utf-8"))


def _type_checking_imports(tree: ast.Module) -> dict[str, str]:
    """name -> module of every ``from M import N`` under the module-level ``if TYPE_CHECKING:``."""
    out: dict[str, str] = {}
    blocks = [n for n in tree.body if isinstance(n, ast.If) and isinstance(n.test, ast.Name)
              and n.test.id == "TYPE_CHECKING"]
    assert len(blocks) == 1, "msprobe_nb/__init__.py needs one module-level `if TYPE_CHECKING:` block"
    for node in ast.walk(blocks[0]):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                name = alias.asname or alias.name
                assert name not in out, f"{name} is imported twice under TYPE_CHECKING"
                assert alias.asname in (None, alias.name), f"{alias.name} is imported as {alias.asname}"
                out[name] = str(node.module)
    return out


def _eager_names(tree: ast.Module) -> set[str]:
    """The names the module binds at import time (outside the TYPE_CHECKING block), private ones left out."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module != "__future__":
            names.update(a.asname or a.name for a in node.names)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
    return {n for n in names if not n.startswith("_") or n == "__version__"} - {"__all__"}


def test_all_is_the_lazy_names_and_the_eager_ones():
    tree = _tree()
    public = set(msprobe_nb.__all__)
    eager = _eager_names(tree) & public
    assert len(msprobe_nb.__all__) == len(public), "a name is listed twice in __all__"
    assert set(msprobe_nb._LAZY) | eager == public
    assert not set(msprobe_nb._LAZY) & eager, "a name is both lazy and eager"


def test_type_checking_block_mirrors_the_lazy_names():
    assert _type_checking_imports(_tree()) == msprobe_nb._LAZY


def test_every_lazy_name_resolves_to_its_module():
    """What __getattr__ would load exists there (checked on the module's source: no heavy import)."""
    root = INIT.parent.parent
    for name, module in msprobe_nb._LAZY.items():
        base = root / Path(*module.split("."))
        path = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
        tree = ast.parse(path.read_text(encoding="utf-8"))
        bound = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        for node in tree.body:
            if isinstance(node, ast.ImportFrom):
                bound.update(a.asname or a.name for a in node.names)
            elif isinstance(node, ast.Assign):
                bound.update(t.id for t in node.targets if isinstance(t, ast.Name))
        assert name in bound, f"{module} does not define {name}"


def test_docstring_names_every_public_name():
    doc = msprobe_nb.__doc__ or ""
    missing = [n for n in msprobe_nb.__all__ if n != "__version__" and f"``{n}``" not in doc]
    assert not missing, f"the package docstring does not name {missing}"


def test_ci_type_checks_the_package_before_testing():
    """.ci/run runs mypy over the package (with the [test] extra installed, before pytest), so a type error
    fails CI."""
    repo = INIT.parent.parent
    lines = [line.strip() for line in (repo / ".ci" / "run").read_text().splitlines()]
    install = max(i for i, line in enumerate(lines) if line.startswith("python -m pip install") and ".[test" in line)
    check = [i for i, line in enumerate(lines) if line == "mypy msprobe_nb"]
    tests = [i for i, line in enumerate(lines) if line.startswith("python -m pytest")]
    assert check and tests and install < check[0] < tests[0]
    assert '"mypy' in (repo / "pyproject.toml").read_text(), "the [test] extra must install mypy"
