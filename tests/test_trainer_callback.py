"""MsprobeCallback on a Hugging Face Trainer: the named optimizer steps recorded, training bitwise unchanged,
gradient accumulation, and the monitor at every step."""
from __future__ import annotations

import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate", reason="the Trainer needs accelerate (extra: trainer)")

import msprobe_nb as mp  # noqa: E402
from msprobe_nb.integrations.transformers import MsprobeCallback  # noqa: E402


class _Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int = 16, length: int = 8):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, 64, (n, length), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _train(out, callback=None, accumulation: int = 1):
    """4 optimizer steps of a tiny GPT-2 (random weights, dropout on): (logged losses, final parameters)."""
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=2, n_head=2)
    model = transformers.GPT2LMHeadModel(cfg)
    args = transformers.TrainingArguments(
        output_dir=str(out), per_device_train_batch_size=4 // accumulation, gradient_accumulation_steps=accumulation,
        max_steps=4, learning_rate=1e-3, logging_steps=1, report_to=[], save_strategy="no", use_cpu=True,
        seed=0, data_seed=0, disable_tqdm=True, dataloader_num_workers=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = transformers.Trainer(model=model, args=args, train_dataset=_Tokens(),
                                       callbacks=[callback] if callback else None)
        trainer.train()
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


def _same(a, b) -> None:
    assert a[0] == b[0] and len(a[0]) == 4
    assert a[1].keys() == b[1].keys()
    for k in a[1]:
        assert torch.equal(a[1][k], b[1][k]), k


@pytest.mark.parametrize("accumulation", [1, 2])
def test_the_named_steps_are_recorded_and_training_is_bitwise_unchanged(tmp_path, accumulation):
    plain = _train(tmp_path / "plain", accumulation=accumulation)
    cb = MsprobeCallback(dump_path=str(tmp_path / "dump"), level="mix", task="statistics", steps=[1, 2])
    recorded = _train(tmp_path / "rec", cb, accumulation=accumulation)
    _same(plain, recorded)
    calls = mp.load(cb.debugger.dump_dir).calls
    assert sorted(set(calls["step"])) == [1, 2]
    names = set(calls["name"])
    assert any(n.startswith("Module.") for n in names) and any(n.startswith("Torch.") for n in names)
    forwards = calls.loc[calls["call"].str.startswith("Module.transformer.GPT2Model.forward."), ["step", "call"]]
    per_step = forwards.drop_duplicates().groupby("step").size().tolist()
    assert per_step == [accumulation] * 2  # each micro-batch's forward, inside its optimizer step



def test_monitor_true_writes_a_record_of_every_step(tmp_path):
    plain = _train(tmp_path / "plain")
    cb = MsprobeCallback(dump_path=str(tmp_path / "mon"), monitor=True)
    monitored = _train(tmp_path / "rec", cb)
    _same(plain, monitored)
    assert list((tmp_path / "mon").glob("monitor_rank*.h5"))
    frame = mp.load_monitor(str(tmp_path / "mon"))
    assert list(frame.steps) == [0, 1, 2, 3]
