"""The set-up check (docs/setup_check.md): two GPT-2 runs that differ in one item each show exactly that item,
identical runs show nothing, each rank records its own set-up, and damaged records are named errors."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

import msprobe_nb as mp
from msprobe_nb.store.errors import DumpFormatError
from msprobe_nb.store.setup_store import read_setup

transformers = pytest.importorskip("transformers", reason="the set-up tests train a GPT-2 from a config")

VOCAB, SEQ = 96, 12


def _config(**over) -> transformers.GPT2Config:
    base = dict(n_layer=2, n_embd=32, n_head=4, vocab_size=VOCAB, n_positions=SEQ, bos_token_id=0, eos_token_id=0,
                resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return transformers.GPT2Config(**{**base, **over})


def _batches() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return [torch.randint(0, VOCAB, (2, SEQ), generator=g) for _ in range(2)]


def _train(folder: Path, *, config: dict | None = None, betas=(0.9, 0.999), order=(0, 1), init=False,
           level: str = "L0", clip=None, scaler=None) -> Path:
    """Two training steps of a tiny GPT-2 recorded by the Debugger at ``folder``; one item changed by the options."""
    mp.seed_all(0, verbose=False)
    model = transformers.GPT2LMHeadModel(_config(**(config or {})))
    if init:  # one parameter initialised otherwise (its own generator: the global draws stay the same)
        torch.nn.init.normal_(model.transformer.h[0].mlp.c_fc.weight, std=0.05,
                              generator=torch.Generator().manual_seed(1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=betas)
    batches = _batches()
    dbg = mp.Debugger(dump_path=str(folder), level=level, model=model)
    for i in order:
        dbg.start()
        loss = model(input_ids=batches[i], labels=batches[i]).loss
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            if clip is not None:
                clip(model.parameters())
            opt.step()
        opt.zero_grad()
        dbg.stop()
        dbg.step()
    dbg.close()
    return dbg.dump_dir


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return _train(tmp_path_factory.mktemp("setup") / "base")


def _causes(a, b) -> list[tuple[str, str, str, str]]:
    t = mp.compare_setups(a, b)
    return [tuple(r) for r in t.loc[~t["expected"], ["group", "item", "a", "b"]].itertuples(index=False)]


def test_identical_runs_have_no_difference(base: Path, tmp_path: Path):
    again = _train(tmp_path / "again")
    t = mp.compare_setups(base, again)
    assert t.empty, t.to_string()
    assert mp.compare_setups(base / "rank0.h5", again / "setup_rank0.json").empty  # a rank file: its folder's
    from msprobe_nb.analysis.setup_compare import load_setup
    rec = load_setup(base)
    assert {"environment", "versions", "determinism", "model", "optimizer", "data", "randomness"} <= set(rec)
    assert len(rec["data"]["batches"]) == 2 and rec["optimizer"]["class"] == "AdamW"
    assert rec["determinism"]["seed_all"]["seed"] == 0
    assert len(rec["model"]["parameters"]) == len(list(transformers.GPT2LMHeadModel(_config()).parameters()))


def test_adamw_betas(base: Path, tmp_path: Path):
    assert _causes(base, _train(tmp_path / "b", betas=(0.9, 0.99))) == [
        ("optimizer", "group 0 betas", "[0.9, 0.999]", "[0.9, 0.99]")]


def test_an_environment_variable(base: Path, tmp_path: Path, monkeypatch):
    monkeypatch.setenv("HCCL_DETERMINISTIC", "true")
    assert _causes(base, _train(tmp_path / "b")) == [("environment", "env HCCL_DETERMINISTIC", "<absent>", "true")]


def test_the_data_order(base: Path, tmp_path: Path):
    causes = _causes(base, _train(tmp_path / "b", order=(1, 0)))
    assert [(g, i) for g, i, _, _ in causes] == [("data", f"batch {i} hash kwargs.{k}") for i in (0, 1)
                                                 for k in ("input_ids", "labels")]
    assert causes[0][2] == causes[2][3] and causes[0][3] == causes[2][2]  # swapped


def test_one_parameters_initialisation(base: Path, tmp_path: Path):
    causes = _causes(base, _train(tmp_path / "b", init=True))
    assert [(g, i) for g, i, _, _ in causes] == [("model", "parameter hash transformer.h.0.mlp.c_fc.weight")]


def test_dropout_left_on(base: Path, tmp_path: Path):
    causes = _causes(base, _train(tmp_path / "b", config={"resid_pdrop": 0.1}))
    assert causes[0] == ("model", "config resid_pdrop", "0.0", "0.1")
    assert {g for g, *_ in causes} == {"model"} and len(causes) == 2, causes
    group, item, a, b = causes[1]
    assert item.startswith("module transformer.h.0.attn.resid_dropout (+") and "p=0.0" in a and "p=0.1" in b


def test_layer_norm_epsilon(base: Path, tmp_path: Path):
    causes = _causes(base, _train(tmp_path / "b", config={"layer_norm_epsilon": 1e-6}))
    assert causes[0] == ("model", "config layer_norm_epsilon", "1e-05", "1e-06")
    assert len(causes) == 2 and causes[1][1] == "module transformer.h.0.ln_1 (+4 more)", causes
    assert "eps=1e-05" in causes[1][2] and "eps=1e-06" in causes[1][3]


def test_expected_differences_are_listed_apart_and_never_causes(base: Path):
    from msprobe_nb.analysis.setup_compare import load_setup
    other = load_setup(base)
    other["environment"].update(hostname="npu-node-7", device="npu", device_name="Ascend910B")
    other["environment"]["env"]["ASCEND_TOOLKIT_HOME"] = "/usr/local/Ascend/ascend-toolkit/latest"
    other["versions"]["torch_npu"] = "2.1.0.post10"
    t = mp.compare_setups(base, other)
    assert set(t["item"]) == {"hostname", "device", "device_name", "env ASCEND_TOOLKIT_HOME", "torch_npu"}
    assert t["expected"].all()
    other["optimizer"]["groups"][0]["lr"] = 2e-3
    t = mp.compare_setups(base, other)
    assert list(t["expected"]) == [False] + [True] * 5 and t.loc[0, "item"] == "group 0 lr"  # causes first


def test_records_of_another_hash_scheme_are_not_compared_value_by_value(base: Path):
    """A record written by the first version of the kit (32-bit word hashes, no prefix) against today's: the
    hashes cannot be compared, which is one expected row, not a difference in every tensor."""
    import copy

    from msprobe_nb.analysis.setup_compare import load_setup
    new = load_setup(base)
    old = copy.deepcopy(new)
    for section, key in (("model", "parameters"), ("model", "buffers")):
        for v in old[section].get(key, {}).values():
            v["hash"] = "0123456789abcdef0123456789abcdef"
    for batch in old["data"]["batches"]:
        for v in batch.values():
            v["hash"] = "fedcba9876543210fedcba9876543210"
    t = mp.compare_setups(new, old)
    assert not (~t["expected"]).any(), t.to_string()
    assert {"parameter hash scheme", "batch 0 hash scheme"} <= set(t["item"]), t.to_string()
    assert t.loc[t["item"] == "parameter hash scheme", ["a", "b"]].values.tolist() == [["w64", "w32"]]


def test_randomness_sites_from_the_recorded_step(tmp_path: Path):
    a = _train(tmp_path / "a", config={"resid_pdrop": 0.1}, level="L1")
    rec = mp.compare_setups(a, a)
    assert rec.empty
    from msprobe_nb.analysis.setup_compare import load_setup
    sites = load_setup(a)["randomness"]["sites"]
    assert sites and all(s["api"] in ("Functional.dropout", "Torch.dropout") for s in sites), sites
    assert any(s["site"].startswith("modeling_gpt2.py:") for s in sites), sites
    b = dict(load_setup(a), randomness={"sites": [dict(s, count=s["count"] + 1) for s in sites]})
    t = mp.compare_setups(a, b)
    assert set(t["group"]) == {"randomness"} and len(t) == len(sites)


def test_gradient_clipping_seen_in_a_recorded_step(tmp_path: Path):
    """clip_grad_norm_ with another max_norm, clip_grad_value_ instead, or no clipping: each is exactly one
    optimizer row, read from the recorded step's calls; the same clipping gives none."""
    from msprobe_nb.analysis.setup_compare import load_setup

    def norm(bound):
        return lambda ps: torch.nn.utils.clip_grad_norm_(ps, bound)

    a = _train(tmp_path / "a", level="L1", clip=norm(1.0))
    got = load_setup(a)["optimizer"]["clipping"]
    assert got == {"clip_grad_norm_": {"site": got["clip_grad_norm_"]["site"], "max_norm": 1.0, "norm_type": 2.0,
                                       "count": 1}}, got
    assert got["clip_grad_norm_"]["site"].startswith("test_setup_check.py:"), got
    assert mp.compare_setups(a, _train(tmp_path / "same", level="L1", clip=norm(1.0))).empty
    assert _causes(a, _train(tmp_path / "b", level="L1", clip=norm(0.5))) == [
        ("optimizer", "clipping clip_grad_norm_ max_norm", "1.0", "0.5")]
    value = _train(tmp_path / "v", level="L1", clip=lambda ps: torch.nn.utils.clip_grad_value_(ps, 0.25))
    assert load_setup(value)["optimizer"]["clipping"]["clip_grad_value_"]["clip_value"] == 0.25
    causes = _causes(a, value)
    assert [(g, i) for g, i, _, _ in causes] == [("optimizer", "clipping clip_grad_norm_"),
                                                 ("optimizer", "clipping clip_grad_value_")], causes
    none = _train(tmp_path / "none", level="L1")
    assert [(g, i, b) for g, i, _, b in _causes(a, none)] == [("optimizer", "clipping clip_grad_norm_", "none")]
    assert "clipping" not in load_setup(_train(tmp_path / "l0", clip=norm(0.5)))["optimizer"]  # L0: not visible


def test_the_grad_scaler_that_steps_the_optimizer_is_recorded(base: Path, tmp_path: Path):
    """The Debugger is given no scaler: the one whose step() calls the optimizer's is found and recorded; a
    scaler with another growth interval is exactly that one row; a run without one lists it as absent."""
    from msprobe_nb.analysis.setup_compare import load_setup

    def scaler(**kw):
        return torch.amp.GradScaler("cpu", init_scale=2.0 ** 8, **kw)

    a = _train(tmp_path / "a", scaler=scaler())
    got = load_setup(a)["optimizer"]["grad_scaler"]
    assert got["class"] == "GradScaler" and got["enabled"] and got["scale"] == 256.0, got
    assert mp.compare_setups(a, _train(tmp_path / "same", scaler=scaler())).empty
    assert _causes(a, _train(tmp_path / "b", scaler=scaler(growth_interval=100))) == [
        ("optimizer", "grad_scaler growth_interval", "2000", "100")]
    assert _causes(a, base) == [("optimizer", "grad_scaler", "GradScaler", "none")]


def test_compare_and_compare_monitors_point_at_the_set_up(base: Path, tmp_path: Path, capsys):
    other = _train(tmp_path / "b", betas=(0.9, 0.99))
    capsys.readouterr()
    res = mp.compare(base, other, progress=False)
    line = "the runs differ in 1 set-up item: optimizer group 0 betas; see compare_setups (the viewer's Set-up tab)"
    assert line in res.notes and line in capsys.readouterr().out
    mons = []
    for name, betas in (("m1", (0.9, 0.999)), ("m2", (0.9, 0.999)), ("m3", (0.8, 0.999))):
        mp.seed_all(0, verbose=False)
        model = transformers.GPT2LMHeadModel(_config())
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=betas)
        with mp.Monitor(model, opt, dump_path=str(tmp_path / name), alerts=False) as mon:
            for x in _batches():
                model(input_ids=x, labels=x).loss.backward()
                opt.step()
                opt.zero_grad()
                mon.step()
        mons.append(mon.dump_path)
    assert mp.compare_monitors(mons[0], mons[1]).setup_note is None
    assert mp.compare_setups(mons[0], mons[1]).empty
    cmp = mp.compare_monitors(mons[0], mons[2])
    assert cmp.setup_note == ("the runs differ in 1 set-up item: optimizer group 0 betas; "
                              "see compare_setups (the viewer's Set-up tab)")
    assert cmp.setup_note in capsys.readouterr().out


def test_snapshot_setup_and_the_cli(tmp_path: Path, capsys):
    from msprobe_nb.cli import main
    records = []
    for name, lr in (("a", 1e-3), ("b", 3e-4)):
        mp.seed_all(0, verbose=False)
        model = transformers.GPT2LMHeadModel(_config())
        opt = torch.optim.AdamW(model.parameters(), lr=lr)
        sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.5, total_iters=10)
        records.append(mp.snapshot_setup(model=model, optimizer=opt, data=_batches(), path=tmp_path / name,
                                         scheduler=sched))
    assert Path(records[0]["path"]) == tmp_path / "a" / "setup_rank0.json"
    t = mp.compare_setups(records[0], tmp_path / "b")
    assert set(t["group"]) == {"optimizer"} and "group 0 lr" in set(t["item"]), t.to_string()
    assert "scheduler base_lrs" in set(t["item"])
    capsys.readouterr()
    assert main(["setup-check", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{len(t)} set-up difference(s), 0 expected") and "group 0 lr" in out
    assert main(["setup-check", str(tmp_path / "a"), str(tmp_path / "b"), "--fail"]) == 1
    assert main(["setup-check", str(tmp_path / "a"), str(tmp_path / "a"), "--fail"]) == 0


def test_each_gloo_rank_records_its_set_up(tmp_path: Path):
    sys.path.insert(0, str(Path(__file__).parent))
    from distributed_runs import run_ranks
    root = run_ranks(2, ["setup_ranks"], tmp_path) / "setup_ranks"
    for folder in (root / "dump", root / "mon"):
        r0, r1 = read_setup(folder, 0), read_setup(folder, 1)
        assert (r0["rank"], r1["rank"], r0["world_size"], r1["world_size"]) == (0, 1, 2, 2)
        assert r0["model"]["parameters"] == r1["model"]["parameters"]  # DDP: one initialisation
        t = mp.compare_setups(folder, folder, rank=0, rank_b=1)
        assert set(t.loc[~t["expected"], "group"]) == {"data"}, t.to_string()  # each rank its own batches
        assert list(t.loc[t["expected"], "item"]) == ["rank"]


# ------------------------------------------------------------------------------------------------ damaged
def _damaged(tmp_path: Path, text: str | bytes) -> Path:
    p = tmp_path / "setup_rank0.json"
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    return p


GOOD = {"format": "msprobe_nb.setup", "version": 1, "rank": 0, "world_size": 1}


@pytest.mark.parametrize(("text", "why"), [
    ('{"format": "msprobe_nb.setup", "version": 1, "model": {"parame', "not valid JSON"),
    (b'\xff\xfe{"format"', "not UTF-8"),
    ("[1, 2]", "not a record object"),
    (json.dumps({**GOOD, "format": "something"}), "format is"),
    (json.dumps({**GOOD, "version": 99}), "version 99"),
    (json.dumps({**GOOD, "rank": -1}), "rank is"),
    (json.dumps({**GOOD, "model": []}), "section 'model'"),
    (json.dumps({**GOOD, "environment": {"env": {"A": 1}}}), "environment.env"),
    (json.dumps({**GOOD, "model": {"parameters": {"w": {"shape": [-3], "dtype": "float32", "hash": "0"}}}}),
     r"model.parameters\['w'\].shape"),
    (json.dumps({**GOOD, "data": {"batches": [{"x": 5}]}}), r"data.batches\[0\]"),
    (json.dumps({**GOOD, "randomness": {"sites": [{"count": "many"}]}}), "randomness.sites"),
    ('{"format": "msprobe_nb.setup", "version": 1, "x": NaN}', "NaN"),
    ('{"format": "msprobe_nb.setup", "version": 1, "x": ' + "[" * 100000 + "]" * 100000 + "}", "not a record"),
    (json.dumps({**GOOD, "x": [[[[[[[[[[[[[[1]]]]]]]]]]]]]]}), "nested deeper"),
])
def test_damaged_and_hostile_records_are_named_errors(tmp_path: Path, text, why):
    p = _damaged(tmp_path, text)
    with pytest.raises(DumpFormatError, match=why) as err:
        read_setup(tmp_path)
    assert str(p) in str(err.value)
    with pytest.raises(DumpFormatError):
        mp.compare_setups(p, GOOD)


def test_oversized_record_is_refused_before_it_is_read(tmp_path: Path, monkeypatch):
    from msprobe_nb.store import setup_store
    monkeypatch.setattr(setup_store, "MAX_BYTES", 100)
    _damaged(tmp_path, json.dumps({**GOOD, "pad": "x" * 200}))
    with pytest.raises(DumpFormatError, match="over the 100"):
        read_setup(tmp_path)


def test_a_folder_without_a_record_says_so(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match="no set-up record"):
        mp.compare_setups(tmp_path, GOOD)


def test_msprobe_config_check_pack_is_read_where_its_format_allows(base: Path, tmp_path: Path):
    import zipfile
    pack = tmp_path / "config_check_pack.zip"
    with zipfile.ZipFile(pack, "w") as zf:
        zf.writestr("rank0/env.json", json.dumps({"HCCL_DETERMINISTIC": "false", "HOME": "/root"}))
        zf.writestr("rank0/pip", "torch==2.1.0\ntorch_npu==2.1.0.post3\n# a comment\n")
        zf.writestr("rank0/hyperparameters.json", json.dumps({"lr": 1e-4}))
        zf.writestr("rank0/weights.pt", b"\x80\x04not read")  # a pickle: never opened
    t = mp.compare_setups(base, pack)
    rows = {(g, i): e for g, i, e in zip(t["group"], t["item"], t["expected"], strict=True)}
    assert rows[("environment", "env HCCL_DETERMINISTIC")] is False and ("environment", "env HOME") not in rows
    assert rows[("versions", "torch_npu")] is True and rows[("versions", "torch")] is False
    assert rows[("optimizer", "hyperparameters lr")] is False
    bad = tmp_path / "broken.zip"
    bad.write_bytes(pack.read_bytes()[:40])
    with pytest.raises(DumpFormatError, match="broken.zip"):
        mp.compare_setups(base, bad)


def test_the_compare_viewer_shows_the_set_up_differences(base: Path, tmp_path: Path):
    pytest.importorskip("ipywidgets", reason="the viewer's widget needs ipywidgets")
    other = _train(tmp_path / "b", betas=(0.9, 0.99))
    result = mp.compare(base, other, progress=False)
    viewer = mp.CompareViewer(result)
    assert list(viewer.setup["item"]) == ["group 0 betas"]
    assert viewer.widget is not None
    tabs = viewer.widgets["tabs"]
    assert tabs.titles[0] == "Set-up" and "group 0 betas" in viewer.widgets["setup"].value  # the first tab
    # it opens on the table and its answer (a set-up difference is a lead); the header's note names the tab
    assert tabs.titles[tabs.selected_index] == "Table"
    tabs.selected_index = tabs.titles.index("Plots")  # the tabs after it keep their jobs: Plots draws its figures
    assert viewer.widgets["plots_drawn"]
    tabs.selected_index = 0
    viewer.widgets["goto_div"].click()  # the first-divergence button shows the table again, not the first tab
    assert tabs.titles[tabs.selected_index] == "Table"
    assert any("group 0 betas" in n and "Set-up tab" in n for n in result.notes)
    same = mp.CompareViewer(mp.compare(base, base, progress=False))
    assert same.widget is not None
    assert same.setup is not None and same.setup.empty and "Set-up" not in same.widgets["tabs"].titles


def test_the_hash_is_of_the_values_and_the_same_on_every_path():
    """Host (numpy) and device (torch) sums agree, so a CPU, GPU and NPU run hash alike; one changed value and a
    permutation each change the hash; views hash as their values."""
    from msprobe_nb.capture import tensor_hashes as s
    from msprobe_nb.capture.host_arrays import numpy_view
    g = torch.Generator().manual_seed(3)
    mask = (1 << 64) - 1
    for n in (1, 7, 2 * 65521, 3 * 2 * 65521 + 5):
        for dtype in (torch.float32, torch.bfloat16, torch.bool):
            words, tail = s._words((torch.randn(n, generator=g) > 0.3).to(dtype))
            host = s._with_tail(*s._sums_host(numpy_view(words)), words.numel(), numpy_view(tail))
            device = s._sums_device(torch.cat([words, tail]))
            assert tuple(v & mask for v in host) == tuple(v & mask for v in device.tolist()), (n, dtype)
    x = torch.randn(4, 300, generator=g)
    h = s.tensor_hashes([x])[0]
    y = x.clone()
    y[2, 17] = torch.nextafter(y[2, 17], torch.tensor(1e9))
    assert s.tensor_hashes([y, x.flip(1), x.t().contiguous().t(), x.clone()]) == [
        s.tensor_hashes([y])[0], s.tensor_hashes([x.flip(1)])[0], h, h]
    assert len({h, s.tensor_hashes([y])[0], s.tensor_hashes([x.flip(1)])[0]}) == 3
    assert s.tensor_hashes([torch.ones(3, dtype=torch.bfloat16), torch.ones(3, dtype=torch.float16)])[0] != \
        s.tensor_hashes([torch.ones(3, dtype=torch.float16)])[0]
