"""The README's Python example runs as written on 40 of a user's own short sentences, and a whitening those cannot
support is refused from the API call in one line that says, in Python, what to pass."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import outlierlab as ol
from outlierlab.metrics.whitening import DegenerateWhiteningError

README = Path(__file__).resolve().parents[1] / "README.md"

# a user's own sentences: short and of few words, so 40 of them give far fewer distinct token vectors than the
# 2 x 384 a whitening of all MiniLM's dims needs
_WHO = ["The farmer", "My sister", "A small dog", "The old sailor", "Our teacher", "The nurse", "A tired child",
        "The baker"]
_WHAT = ["opened the window.", "sold the red bicycle.", "wrote a long letter home.", "missed the early train.",
         "painted the fence green."]
SENTENCES = [f"{who} {what}" for who in _WHO for what in _WHAT]


def _readme_python() -> str:
    text = README.read_text(encoding="utf-8")
    section = text.split("## From Python", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_readme_python_example_runs_as_written_on_40_sentences_of_ones_own(tmp_path, monkeypatch):
    assert len(SENTENCES) == 40 and len(set(SENTENCES)) == 40
    (tmp_path / "my_sentences.txt").write_text("\n".join(SENTENCES) + "\n\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(_readme_python(), str(README), "exec"), namespace)  # noqa: S102 - the README's own code
    assert namespace["texts"] == SENTENCES
    table = namespace["tables"]["anisotropy"]
    assert set(table["transform"]) == {"none", "clip"} and table["anisotropy"].notna().all()
    probe = ol.probe_positions(namespace["enc"], namespace["texts"], progress=False)
    assert len(probe) == namespace["enc"].num_layers + 1


def test_a_whitening_of_too_few_sentences_is_one_line_from_the_call_in_python_terms():
    enc = ol.load_encoder("all-minilm-l6-v2", device="cpu")
    with pytest.raises(DegenerateWhiteningError) as e:
        ol.evaluate(enc, SENTENCES, analyses=["anisotropy"], transforms=["none", "whiten"], progress=False)
    msg = str(e.value)
    assert "\n" not in msg
    # raised from the API call, not from ten frames inside the job
    assert Path(e.traceback[-1].path).name == "api.py" and e.value.__suppress_context__
    # what a whitening needs, and how many sentences like these that is
    assert "it needs 768 distinct vectors, about" in msg and "sentences like these: pass more texts" in msg
    fix = re.search(r'ol\.evaluate\(\.\.\., overrides=\["(transform\.k=\d+)"\]\)', msg)
    assert fix, msg
    assert 'overrides=["transform.allow_degenerate=true"]' in msg and 'leave "whiten" out of transforms=' in msg
    assert "transform.fit_on=sentences" not in msg  # the fit was on these sentences already
    # the remedy it names works as written
    table = ol.evaluate(enc, SENTENCES, analyses=["anisotropy"], transforms=["none", "whiten"], progress=False,
                        overrides=[fix.group(1)])["anisotropy"]
    assert not table.loc[table["transform"] == "whiten", "whiten_degenerate"].any()
