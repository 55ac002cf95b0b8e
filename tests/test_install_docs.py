"""The install instructions hold together: README's set-up commands, pyproject's extras and environment.yml.

Nothing here installs anything (no conda channel is reachable from the test machines); the commands
themselves were run by hand in a fresh virtual environment. These tests catch the drift between the three
files: an extra the README names that pyproject lacks, an environment.yml that installs other extras than
the README, or one that would pull PyPI's CUDA build of torch.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _setup_block() -> str:
    """The README's opening ```bash block: the set-up commands."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    m = re.search(r"```bash\n(.*?)```", text, re.S)
    assert m, "README.md has no ```bash block of set-up commands"
    return m.group(1)


def _pip_installs(block: str) -> list[str]:
    """The argument lists of the `pip install` commands in ``block`` (each up to `&&` or the line's end)."""
    return [m.group(1).strip() for m in re.finditer(r"pip install ([^&\n]+)", block)]


def _extras(spec: str) -> set[str]:
    """The extras of the package's own requirement in ``spec``: `.[a,b]` or `".[a,b]"` -> {a, b}."""
    m = re.search(r"""(?:^|\s)["']?\.\[([A-Za-z0-9_,\s-]+)\]["']?""", spec)
    return {e.strip() for e in m.group(1).split(",")} if m else set()


def _optional_dependencies() -> dict[str, list[str]]:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]


def _environment() -> dict:
    env = yaml.safe_load((REPO / "environment.yml").read_text(encoding="utf-8"))
    assert isinstance(env, dict), "environment.yml is not a mapping"
    return env


def _conda_and_pip(env: dict) -> tuple[list[str], list[str]]:
    deps = env.get("dependencies")
    assert isinstance(deps, list) and deps, "environment.yml has no dependencies list"
    conda = [d for d in deps if isinstance(d, str)]
    pips = [d for d in deps if isinstance(d, dict)]
    assert len(pips) == 1 and list(pips[0]) == ["pip"], f"expected one `pip:` section, found {pips}"
    pip = pips[0]["pip"]
    assert isinstance(pip, list) and all(isinstance(x, str) for x in pip), "the pip section is not a list of lines"
    assert len(conda) + 1 == len(deps), "a dependency is neither a conda spec nor the pip section"
    return conda, pip


def _conda_name(spec: str) -> str:
    """`python=3.11` / `ipywidgets>=8` / `conda-forge::pkg` -> the package name."""
    return re.split(r"[=<>!~ ]", spec.split("::")[-1], maxsplit=1)[0].strip().lower()


def test_readme_has_three_setup_commands_the_third_opens_the_tutorials():
    block = _setup_block()
    steps = re.findall(r"^# (\d)\. ", block, re.M)
    assert steps == ["1", "2", "3"], f"README's set-up block has steps {steps}, expected 1, 2, 3"
    third = block[block.index("# 3. "):]
    assert "jupyter lab notebooks/" in third, "step 3 does not open the tutorials with `jupyter lab notebooks/`"
    assert "notebook" in _extras(" ".join(_pip_installs(third))), "step 3 does not install the [notebook] extra"


def _step(block: str, n: int) -> str:
    start = block.index(f"# {n}. ")
    nxt = block.find(f"# {n + 1}. ", start)
    return block[start:nxt if nxt >= 0 else len(block)]


def _labelled_commands(step: str) -> list[tuple[str, str]]:
    """(label, command) for each command line of a step: the comment line just above it is its label."""
    out, label = [], ""
    for line in step.splitlines():
        if line.startswith("#"):
            label = line.lstrip("# ").strip()
        elif line.strip():
            out.append((label, line.strip()))
    return out


def test_readme_first_command_is_the_cpu_one_ci_runs():
    """The first command is the one this machine and CI run (.ci/run installs the same pin and extras): its pip
    finds the CPU wheel without PyTorch's index, so the command runs as written."""
    label, first = _labelled_commands(_step(_setup_block(), 1))[0]
    assert "CPU" in label and "CI" in label, f"the first command's label {label!r} does not say CPU / CI"
    assert "index-url" not in first and "python -m msprobe_nb.demo" in first, first
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    ci_installs = _pip_installs(ci)
    assert any("torch==2.13.0" in line for line in ci_installs), ci_installs
    ci_extras = set().union(*(_extras(line) for line in ci_installs))
    assert _extras(" ".join(_pip_installs(first))) <= ci_extras, (first, ci_extras)
    assert "index-url" not in ci, ".ci/run should not reach PyTorch's own index (it cannot from CI's machines)"


def test_readme_labels_a_cpu_linux_and_a_cuda_npu_command():
    """Two more labelled commands: CPU on Linux (PyTorch's CPU index) and CUDA / NPU. The CPU-index line is NOT
    run by CI or by any test: download.pytorch.org cannot be reached from CI's machines, so only its form is
    checked here (the index URL, the torch pin, the same extras as the first command)."""
    commands = _labelled_commands(_step(_setup_block(), 1))
    assert len(commands) == 3, commands
    (_, first), (cpu_label, cpu_linux), (gpu_label, gpu) = commands
    assert "CPU" in cpu_label and "Linux" in cpu_label, cpu_label
    assert f"--extra-index-url {CPU_INDEX}" in cpu_linux, cpu_linux
    assert _extras(" ".join(_pip_installs(cpu_linux))) == _extras(" ".join(_pip_installs(first)))
    assert "CUDA" in gpu_label and "NPU" in gpu_label, gpu_label
    assert "index-url" not in gpu and "npu" in _extras(" ".join(_pip_installs(gpu))), gpu


def test_readme_says_allow_root_for_jupyterlab():
    third = _step(_setup_block(), 3)
    assert "--allow-root" in third and "root" in third, third


def test_readme_warns_of_the_clone_s_parent_folder():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert "has no attribute 'record'" in text and "namespace package" in text


def test_readme_pins_torch_on_every_install_line():
    """An unpinned torch on the same pip line would pull the newest (on Linux a multi-GB CUDA) build."""
    for spec in _pip_installs(_setup_block()):
        assert re.search(r"(?:^|\s)torch==\d", spec), f"`pip install {spec}` does not pin torch"


def test_readme_extras_exist_in_pyproject():
    extras = _optional_dependencies()
    named = set().union(*(_extras(s) for s in _pip_installs(_setup_block())))
    assert named, "README's set-up commands install no extras"
    missing = named - set(extras)
    assert not missing, f"README installs extras {sorted(missing)} that pyproject.toml does not define"


def test_notebook_extra_brings_jupyterlab_and_a_kernel():
    names = {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower() for r in _optional_dependencies()["notebook"]}
    assert {"jupyterlab", "ipykernel"} <= names, f"the [notebook] extra has {sorted(names)}"


def test_environment_yml_parses_and_names_python_311():
    env = _environment()
    assert env.get("name") == "msprobe_nb"
    assert env.get("channels"), "environment.yml names no channel"
    conda, _ = _conda_and_pip(env)
    assert "python=3.11" in [c.replace(" ", "") for c in conda], f"python 3.11 not pinned in {conda}"
    assert "pip" in [_conda_name(c) for c in conda], "environment.yml uses a pip section without conda's pip"


def test_environment_yml_gets_a_cpu_torch():
    """PyPI's Linux torch is the CUDA build: the file must take torch from PyTorch's CPU index, or cpuonly."""
    conda, pip = _conda_and_pip(_environment())
    cpu_index = any(re.fullmatch(rf"--(?:extra-)?index-url[ =]{re.escape(CPU_INDEX)}/?", line.strip())
                    for line in pip)
    cpuonly = "cpuonly" in [_conda_name(c) for c in conda]
    assert cpu_index or cpuonly, f"environment.yml has neither pip's {CPU_INDEX} index nor conda's cpuonly"
    if cpu_index:
        torch = [line for line in pip if re.match(r"torch\b", line.strip())]
        assert torch == ["torch==2.13.0"], f"torch under pip: {torch} (expected the README's torch==2.13.0)"


def test_environment_yml_brings_jupyterlab():
    conda, pip = _conda_and_pip(_environment())
    assert "jupyterlab" in [_conda_name(c) for c in conda] or any("jupyterlab" in line for line in pip)


def test_environment_yml_installs_the_package_with_the_readme_extras():
    _, pip = _conda_and_pip(_environment())
    own = [line for line in pip if re.match(r"-e\s+\.(\[|$)", line.strip())]
    assert len(own) == 1, f"environment.yml should install the package once, editable (`-e .[...]`): {own}"
    block = _setup_block()  # the first (CPU) command and the tutorials' command: the NPU line adds [npu]
    first = _labelled_commands(_step(block, 1))[0][1]
    readme = set().union(*(_extras(s) for s in _pip_installs(first + "\n" + _step(block, 3))))
    assert _extras(own[0]) == readme, (f"environment.yml installs extras {sorted(_extras(own[0]))}, "
                                       f"the README {sorted(readme)}")


def test_quickstart_next_list_names_every_other_tutorial():
    import json

    nb = json.loads((REPO / "notebooks" / "01_quickstart.ipynb").read_text(encoding="utf-8"))
    nxt = next("".join(c["source"]) for c in nb["cells"]
               if c["cell_type"] == "markdown" and "".join(c["source"]).startswith("## Next"))
    others = sorted(p.name for p in (REPO / "notebooks").glob("[0-9][0-9]_*.ipynb") if not p.name.startswith("01"))
    missing = [name for name in others if f"`{name}`" not in nxt]
    assert not missing, f"notebook 01's Next list does not name {missing}"


def _names(reqs: list[str]) -> set[str]:
    return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower() for r in reqs}


def _self_extras(reqs: list[str]) -> set[str]:
    """`msprobe_nb[record,viewers]` in an extra's list -> {record, viewers}."""
    return set().union(*({e.strip() for e in m.group(1).split(",")}
                         for r in reqs if (m := re.match(r"msprobe_nb\[([^\]]+)\]", r))))


def test_the_core_install_is_the_analysis_layer_s_needs():
    """Loading and comparing dumps needs neither torch nor the viewers' packages: the core must not force them."""
    tomllib = pytest.importorskip("tomllib")
    core = _names(tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"])
    assert {"numpy", "pandas", "h5py", "hdf5plugin", "zlib-ng", "tqdm"} <= core, core  # the dumps' codec, checksum
    heavy = core & {"torch", "ipywidgets", "anywidget", "matplotlib", "ipython", "dask", "jupyterlab"}
    assert not heavy, f"the core install requires {sorted(heavy)}"


def test_each_layer_s_extra_and_the_readme_s_extras_bring_what_they_need():
    extras = _optional_dependencies()
    assert "torch" in _names(extras["record"])
    assert {"ipywidgets", "anywidget", "matplotlib", "ipython"} <= _names(extras["viewers"])
    # the README's `.[test]` and `.[notebook]` commands record and show: they pull those layers in
    assert {"record", "viewers", "dask"} <= _self_extras(extras["test"]), extras["test"]
    assert {"record", "viewers"} <= _self_extras(extras["notebook"]), extras["notebook"]
    for name in ("models", "bench", "npu"):
        assert "record" in _self_extras(extras[name]), (name, extras[name])


def test_ci_runs_the_core_install_alone_and_fails_when_its_tests_skip():
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert "python3 -m venv .venv-core" in ci and ".venv-core/bin/python -m pip install -q -e . pytest" in ci
    assert "tests/test_msprobe_sample.py" in ci and "skipped" in ci
    assert "\npython -m pytest -q\n" in ci, "the main path's test command is gone"
