"""A pass whose on-disk stores cannot fit in $TMPDIR fails in one line before encoding anything."""

from __future__ import annotations

import shutil
from collections import namedtuple

import pytest
import torch

from llama_fixtures import save_tiny_llama, similarity_pass
from llama_fixtures import texts as _texts
from outlierlab.utils import disk_room
from outlierlab.configuration.run_settings import DataSettings
from outlierlab.models.loading import FrozenEncoder

Usage = namedtuple("Usage", "total used free")


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    return FrozenEncoder(str(save_tiny_llama(tmp_path_factory.mktemp("llama") / "m")), device="cpu", batch_size=8)


def _free(monkeypatch, free: int) -> None:
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10 ** 12, 10 ** 12 - free, free))


def _count_forwards(monkeypatch, enc) -> list:
    calls = []
    real = enc.forward_layers
    monkeypatch.setattr(enc, "forward_layers", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    return calls


def test_the_byte_bound_holds_and_the_exact_count_is_the_tokenizers(encoder):
    texts = ["Anne walked to the Cobb.", "Café naïveté — 東京 🙂", "x" * 500]
    exact = disk_room.token_bound(encoder, texts, exact=True)
    tok = encoder.tokenizer(texts, add_special_tokens=False, truncation=True, max_length=encoder.max_length)
    assert exact == sum(len(i) for i in tok["input_ids"])
    assert disk_room.token_bound(encoder, texts) >= exact
    assert disk_room.token_bound(encoder, ["ab"]) == 2 and disk_room.token_bound(encoder, ["é"]) == 2  # UTF-8 bytes
    assert disk_room.model_itemsize(encoder) == 4


def test_a_full_tmpdir_stops_the_one_pass_evaluation_before_the_first_forward(encoder, monkeypatch):
    texts = _texts(20)
    n_tok = disk_room.token_bound(encoder, texts, exact=True)
    per_token = (encoder.num_layers + 1) * encoder.hidden_size * 4
    need = n_tok * per_token + 2 * (encoder.num_layers + 1) * encoder.hidden_size ** 2 * 4
    _free(monkeypatch, int(need / disk_room.HEADROOM) - 1000)
    calls = _count_forwards(monkeypatch, encoder)
    with pytest.raises(OSError) as err:
        similarity_pass(encoder, texts, ["none", "clip", "whiten"])
    msg = str(err.value)
    assert "\n" not in msg and f"({n_tok} tokens × {per_token} B" in msg and "data.one_pass=false" in msg
    assert "TMPDIR" in msg and calls == []  # nothing encoded
    # the two-pass reference stores nothing on disk: it runs
    st, pairs, _ = similarity_pass(encoder, texts, ["none", "clip", "whiten"], data=DataSettings(one_pass=False))
    assert st.outliers["none"].count > 0 and torch.isfinite(pairs.anisotropy(st.transforms, "whiten")).all()


def test_enough_room_for_the_exact_count_runs(encoder, monkeypatch):
    """Between the exact need and the byte bound's: the tokens are counted, and the pass runs."""
    texts = _texts(20)
    per_token = (encoder.num_layers + 1) * encoder.hidden_size * 4
    extra = 2 * (encoder.num_layers + 1) * encoder.hidden_size ** 2 * 4
    exact = disk_room.token_bound(encoder, texts, exact=True) * per_token + extra
    bound = disk_room.token_bound(encoder, texts) * per_token + extra
    assert exact < bound
    _free(monkeypatch, int((exact + bound) / 2 / disk_room.HEADROOM))
    st, pairs, _ = similarity_pass(encoder, texts, ["none", "whiten"])
    assert torch.isfinite(pairs.anisotropy(st.transforms, "whiten")).all()


def test_wic_and_sts_say_which_setting_makes_room(encoder, monkeypatch):
    from outlierlab.evaluation.analyses.sts import sentence_vectors
    from outlierlab.metrics.transform_fit import WhitenSettings
    from outlierlab.evaluation.analyses.wic import target_vectors

    s = "The bank was closed."
    pairs = [{"sentence1": s, "sentence2": s, "start1": 4, "end1": 8, "start2": 4, "end2": 8, "label": True}]
    _free(monkeypatch, 100)
    with pytest.raises(OSError, match=r"WiC's target vectors, token store and fitted maps needs .*"
                                      r"\(transform\.fit_on=sentences\) or evaluate fewer pairs \(wic\.max_pairs=\)"):
        target_vectors(encoder, pairs, WhitenSettings())
    with pytest.raises(OSError, match=r"STS's sentence vectors needs .*sts\.max_pairs="):
        sentence_vectors(encoder, [s, "Another one."])


def test_a_killed_pass_leaves_no_stored_tokens_or_maps_behind(tmp_path):
    """The token store and the maps on disk are unnamed files: SIGKILL mid-pass (a scheduler's kill, an OOM kill)
    gives their space back — named, a killed 70B run left 84 GB in $TMPDIR."""
    import subprocess
    import sys

    code = f"""
import sys, tempfile, torch
from outlierlab.datamodules.features import LayerTokenStore
from outlierlab.utils.disk_layers import DiskLayers
store = LayerTokenStore(tempfile.mkdtemp(dir={str(tmp_path)!r}), 3, 64)
maps = DiskLayers(3, 64, 64, directory={str(tmp_path)!r})
for layer in range(3):
    store.append(layer, torch.randn(5000, 64))
    maps[layer] = torch.randn(64, 64)
store.close()
print("written", flush=True)
sys.stdin.read()
"""
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "written"
    proc.kill()
    proc.wait()
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []  # (the store's empty directory may stay)
