"""Plain progress lines for non-terminal runs: training callback and the encoding passes."""

from __future__ import annotations

import io
import re
import sys

import lightning as L
import pytest
import torch

import outlierlab.lightning_modules.callbacks.progress_lines as progress_mod
from outlierlab.lightning_modules.callbacks.progress_lines import ProgressLines
from outlierlab.utils import progress as plain


class Clock:
    """A fake clock the test advances explicitly (seconds)."""

    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class CountingModule(L.LightningModule):
    """Each step 'takes' 2 s on the fake clock and reports loss = batch index (hand-computable means)."""

    def __init__(self, clock: Clock):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.clock = clock

    def training_step(self, batch, batch_idx):
        self.clock.t += 2.0
        return (self.w * 0).sum() + float(batch_idx)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.zeros(64, 3), batch_size=4)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def fit(callback, clock, progress_bar=True, max_steps=10):
    trainer = L.Trainer(max_steps=max_steps, callbacks=[callback], logger=False, enable_checkpointing=False,
                        enable_progress_bar=progress_bar, enable_model_summary=False, accelerator="cpu")
    trainer.fit(CountingModule(clock))
    return trainer


def test_non_terminal_run_prints_hand_computed_lines(capsys):
    clock = Clock()
    cb = ProgressLines(every_n_steps=5, length_fn=lambda batch: 10, clock=clock)
    fit(cb, clock)
    out = capsys.readouterr().out
    step_lines = [l for l in out.splitlines() if l.startswith("[train] step")]
    # step 5: 5 steps x 2 s = 10 s, 5 batches x 10 tokens = 50 -> 5 tok/s, ETA (10-5) x 10 s / 5 = 10 s;
    # mean loss of batch indices 0..4 = 2.0, then of 5..9 = 7.0
    assert step_lines == [
        "[train] step 5/10 (50%) | loss 2.0000 | 5 tok/s | elapsed 0:00:10 | ETA 0:00:10",
        "[train] step 10/10 (100%) | loss 7.0000 | 5 tok/s | elapsed 0:00:20 | ETA 0:00:00",
    ]
    assert "[train] starting at step 0/10 on 1 CPU device(s)" in out


def test_last_step_prints_even_off_the_interval(capsys):
    clock = Clock()
    cb = ProgressLines(every_n_steps=4, length_fn=lambda batch: 1, clock=clock)
    fit(cb, clock, max_steps=6)
    steps = re.findall(r"\[train\] step (\d+)/6", capsys.readouterr().out)
    assert steps == ["4", "6"]


def test_terminal_with_a_bar_is_not_doubled(monkeypatch, capsys):
    monkeypatch.setattr(progress_mod, "is_terminal", lambda stream=None: True)
    clock = Clock()
    cb = ProgressLines(every_n_steps=2, clock=clock)
    fit(cb, clock, progress_bar=True)
    assert cb.lines == [] and "[train]" not in capsys.readouterr().out
    # the same terminal without a bar (enable_progress_bar=false) gets the lines
    cb = ProgressLines(every_n_steps=5, clock=clock)
    fit(cb, clock, progress_bar=False)
    assert [l.split(" |")[0] for l in cb.lines[1:]] == ["[train] step 5/10 (50%)", "[train] step 10/10 (100%)"]


def test_resumed_session_counts_only_its_own_steps():
    clock, trainer = Clock(), type("T", (), {"global_step": 40, "max_steps": 100})()
    cb = ProgressLines(every_n_steps=10, clock=clock)
    cb._reset(trainer)
    trainer.global_step, clock.t = 60, 30.0  # 20 steps in 30 s: 40 steps left -> 60 s
    assert cb.line(trainer).endswith("elapsed 0:00:30 | ETA 0:01:00")


def test_bad_settings_are_one_line():
    with pytest.raises(ValueError, match="when must be auto, always or never"):
        ProgressLines(when="sometimes")
    with pytest.raises(ValueError, match="every_n_steps must be an integer >= 1"):
        ProgressLines(every_n_steps=0)


def test_plain_lines_for_encoding_passes():
    clock, stream = Clock(), io.StringIO()
    bar = plain.PlainBar(1000, "[evaluate] pass 1/1", every_s=30, stream=stream, clock=clock)
    clock.t = 10.0
    bar.update(200)  # 10 s < 30 s since the start: no line yet
    clock.t = 40.0
    bar.update(200)  # 400 in 40 s = 10/s; 600 left -> 60 s
    clock.t = 50.0
    bar.close()
    bar.close()  # closing twice prints once
    assert stream.getvalue().splitlines() == [
        "[evaluate] pass 1/1: 400/1,000 sentences (40%) | 10 sentences/s | elapsed 0:00:40 | ETA 0:01:00",
        "[evaluate] pass 1/1: 400/1,000 sentences (40%) | 8 sentences/s | elapsed 0:00:50 | ETA 0:01:15",
    ]


def test_factory_gives_lines_off_a_terminal_and_tqdm_on_one(monkeypatch):
    assert plain.progress_bar(10, "x", enabled=False) is None
    assert isinstance(plain.progress_bar(10, "x"), plain.PlainBar)  # pytest's stderr is not a terminal
    monkeypatch.setattr(plain, "is_terminal", lambda stream=None: True)
    bar = plain.progress_bar(10, "x", stream=io.StringIO())
    assert type(bar).__module__.startswith("tqdm")
    bar.close()


@pytest.mark.parametrize("seconds, text", [(0, "0:00:00"), (59.6, "0:01:00"), (3661, "1:01:01"),
                                           (90000, "25:00:00"), (None, "?"), (float("inf"), "?")])
def test_format_duration(seconds, text):
    assert plain.format_duration(seconds) == text


@pytest.mark.slow
def test_train_py_under_nohup_prints_plan_and_progress(tmp_path):
    """`python train.py > log` (stdout not a terminal): the plan line, then progress lines, in the log."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    proc = subprocess.run(
        [sys.executable, "train.py", f"hydra.run.dir={tmp_path}", "trainer.max_steps=4", "trainer.val_check_interval=4",
         "trainer.limit_val_batches=1", "data.limit_blocks=200", "model.num_layers=1", "callbacks.progress.every_n_steps=2",
         "callbacks.model_checkpoint.every_n_train_steps=4", "export=false", "module.scheduler.num_warmup_steps=2"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("plan: 4 steps on auto x 1 device(s)")
    steps = [l.split(" |")[0] for l in lines if l.startswith("[train] step") and "validation" not in l]
    assert steps == ["[train] step 2/4 (50%)", "[train] step 4/4 (100%)"]
    assert any(l.startswith("[train] step 4/4 validation | val/loss ") for l in lines)
    # Rich renders its bar once at the end, even off a terminal: Lightning 2.6 labelled it "Epoch 0/-2"
    assert "Epoch 0 " in proc.stdout and "/-2" not in proc.stdout + proc.stderr
    # each Lightning log line once (Hydra's console handler), not a second time through Lightning's own
    assert (proc.stdout + proc.stderr).count("Seed set to") == 1
    # the last line says where the run went and what reads it
    assert lines[-1].startswith("[train] done at step 4, val/loss ") and f"run directory {tmp_path} (" in lines[-1]


@pytest.mark.parametrize("max_epochs, label", [(-1, "Epoch 3"), (5, "Epoch 3/4"), (None, "Epoch 3")])
def test_step_bar_has_no_negative_epoch_total(max_epochs, label):
    """train.py's bar (StepRichProgressBar): a run bounded by steps (max_epochs=-1) reads "Epoch 3", not Lightning
    2.6's "Epoch 3/-2"; a bounded epoch count keeps Lightning's "Epoch 3/4"."""
    from types import SimpleNamespace

    from outlierlab.lightning_modules.callbacks.progress_lines import StepRichProgressBar

    bar = StepRichProgressBar()
    bar._trainer = SimpleNamespace(max_epochs=max_epochs)
    assert bar._get_train_description(3).rstrip() == label


def test_lightning_lines_reach_the_root_handlers_once():
    """Under a configured root logger (Hydra's), the console handler ``import lightning`` adds is dropped; without
    one, Lightning keeps its own (nothing would print otherwise)."""
    import logging

    import lightning  # noqa: F401  (adds the handler)

    from outlierlab.lightning_modules.loggers import one_console_for_lightning

    lg, root = logging.getLogger("lightning"), logging.getLogger()
    saved_lg, saved_root = list(lg.handlers), list(root.handlers)
    stream = io.StringIO()
    try:
        lg.handlers = [logging.StreamHandler(io.StringIO())]  # what lightning/__init__.py adds
        root.handlers = []
        one_console_for_lightning()
        assert len(lg.handlers) == 1  # no root handlers: Lightning's own stays
        root.handlers = [logging.StreamHandler(stream)]
        one_console_for_lightning()
        assert lg.handlers == []
        child = logging.getLogger("lightning.outlierlab_test")  # its own level: other tests quiet lightning.pytorch
        child.setLevel(logging.INFO)
        child.info("GPU available: False")
        assert stream.getvalue().count("GPU available") == 1
    finally:
        lg.handlers, root.handlers = saved_lg, saved_root


def test_a_probe_leaves_lightning_logging_and_warnings_as_it_found_them(tmp_path, compose_cfg):
    """probe.py (and ol.probe_positions) quiets Lightning's per-Trainer banners while it trains its probes, and
    restores the levels and warning filters afterwards: a notebook's later training run logs as before."""
    import logging
    import warnings

    from probe_fixtures import save_tiny_bert

    from outlierlab.evaluation.probing import run

    bert = save_tiny_bert(tmp_path / "bert")
    levels = {n: logging.getLogger(n).level for n in ("lightning.pytorch", "lightning.fabric")}
    filters = list(warnings.filters)
    run(compose_cfg("probe", [f"encoder.name_or_path={bert}", "progress=false", "probe.epochs=1",
                              "data.max_sentences=40", "transform=[none]", f"features.cache_dir={tmp_path / 'c'}"]),
        tmp_path / "probe")
    assert {n: logging.getLogger(n).level for n in levels} == levels
    assert warnings.filters == filters


def test_lightning_advertisements_are_dropped_and_its_other_lines_kept():
    """A Trainer start logs "💡 Tip: ... litlogger" (and litmodels) at INFO: the jobs' console and log file drop
    those lines and keep every other Lightning line."""
    import logging

    from lightning.pytorch.utilities.rank_zero import rank_zero_info

    from outlierlab.lightning_modules.loggers import _drop_lightning_tips, one_console_for_lightning

    rank_zero = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    saved_level, stream = rank_zero.level, io.StringIO()
    handler = logging.StreamHandler(stream)
    rank_zero.addHandler(handler)
    rank_zero.setLevel(logging.INFO)
    rank_zero.removeFilter(_drop_lightning_tips)  # as a fresh process has it (an earlier test may have added it)
    try:
        rank_zero_info("💡 Tip: For seamless cloud logging and experiment tracking, try installing litlogger")
        assert "litlogger" in stream.getvalue()  # before: Lightning prints it
        stream.truncate(0)
        stream.seek(0)
        one_console_for_lightning()
        one_console_for_lightning()  # idempotent: one filter
        assert rank_zero.filters.count(_drop_lightning_tips) == 1
        rank_zero_info("💡 Tip: For seamless cloud uploads and versioning, try installing litmodels")
        rank_zero_info("GPU available: False, used: False")
        assert stream.getvalue() == "GPU available: False, used: False\n"
    finally:
        rank_zero.removeHandler(handler)
        rank_zero.removeFilter(_drop_lightning_tips)
        rank_zero.setLevel(saved_level)


def test_the_model_summary_in_a_log_file_names_every_type_in_full(monkeypatch):
    """A run whose console is a file (nohup, Slurm) got Rich's fallback width of 80: with FLOPs and in/out sizes the
    summary cut "RobertaMaskedLM" to "Robert…".  The jobs widen Rich's console there, unless COLUMNS says otherwise."""
    import rich
    from lightning.pytorch.callbacks import RichModelSummary
    from lightning.pytorch.utilities.model_summary import summarize
    from rich.console import Console

    from outlierlab.lightning_modules.loggers import LOG_COLUMNS, one_console_for_lightning

    class RobertaMaskedLanguageModel(torch.nn.Linear):  # a long type name, as ours
        pass

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = RobertaMaskedLanguageModel(4, 4)
            self.example_input_array = torch.zeros(1, 4)

        def forward(self, x):
            return self.model(x)

    def summary_text() -> str:
        s = summarize(Module(), max_depth=1)
        with rich.get_console().capture() as cap:
            RichModelSummary.summarize(s._get_summary_data(), s.total_parameters, s.trainable_parameters,
                                       s.model_size, s.total_training_modes, s.total_flops)
        return cap.get()

    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.setattr(sys, "stdout", io.StringIO())  # not a terminal: a log file
    monkeypatch.setattr(rich, "_console", Console(width=80, file=io.StringIO()))  # Rich's fallback for a file
    assert "RobertaMaskedLanguageModel" not in summary_text()  # cut at 80 columns
    one_console_for_lightning()
    assert rich.get_console().width == LOG_COLUMNS
    assert "RobertaMaskedLanguageModel" in summary_text()
    monkeypatch.setenv("COLUMNS", "70")  # the user's width wins
    monkeypatch.setattr(rich, "_console", Console(width=70, file=io.StringIO()))
    one_console_for_lightning()
    assert rich.get_console().width == 70
