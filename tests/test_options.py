"""One description of the recording options drives DumpConfig, the magics and the command line."""
from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from msprobe_nb.config import ConfigError, DumpConfig, load_config
from msprobe_nb.options import OPTIONS, argument_specs

REPO = Path(__file__).resolve().parents[1]


def test_the_table_and_the_config_hold_the_same_options():
    fields = [f.name for f in dataclasses.fields(DumpConfig) if f.name != "extra"]
    assert [o.name for o in OPTIONS] == fields


def test_every_option_is_documented():
    text = (REPO / "docs" / "config.md").read_text(encoding="utf-8")
    missing = [o.name for o in OPTIONS if f"`{o.name}`" not in text]
    assert missing == []


@pytest.mark.parametrize("o", [o for o in OPTIONS if o.choices], ids=lambda o: o.name)
def test_every_allowed_value_is_validated_and_offered(o):
    specs = {kw["dest"]: kw for _, kw in argument_specs()}
    for value in o.choices:
        if o.name == "summary_mode" and value == "crc32":
            load_config(summary_mode=value)
        elif o.name != "data_mode" or value == "all":
            load_config(**{o.name: value})
    with pytest.raises(ConfigError, match=o.name):
        load_config(**{o.name: "not-a-choice"})
    if o.shell:
        assert all(v in specs[o.name]["help"] for v in o.choices)  # the magics' and CLI's help lists them all


def test_magics_and_cli_take_the_same_flags():
    from msprobe_nb.cli import build_parser
    from msprobe_nb.magics import MsprobeMagics
    doc = MsprobeMagics.msprobe_start.__doc__
    sub = build_parser()._subparsers._group_actions[0].choices["config"]
    cli_flags = {f for a in sub._actions for f in a.option_strings}
    for flags, _ in argument_specs():
        for f in flags:
            assert f in doc and f in cli_flags, f


def test_cli_config_reads_file_and_options(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text('{"task": "statistics", "level": "L1", "statistics": {"summary_mode": "md5"}}')
    run = lambda *a: subprocess.run([sys.executable, "-m", "msprobe_nb.cli", "config", *a],  # noqa: E731
                                    capture_output=True, text=True, cwd=tmp_path)
    ok = run(str(cfg), "--level", "mix", "--no-stack", "--json")
    assert ok.returncode == 0, ok.stderr
    assert "statistics (md5) mix" in ok.stdout and "no stack" in ok.stdout and '"stack": false' in ok.stdout
    bad = run("--level", "L9")
    assert bad.returncode == 2 and "level: invalid value 'L9'" in bad.stderr and "Traceback" not in bad.stderr
