"""The model under test of ``evaluate_memory.py --llama``: a randomly initialised Llama of a given shape, saved in
bfloat16 once per ``--save-dir`` and built in a child process (so the benchmark's own process never holds it).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


TOKENIZER_VOCAB = 30522  # the bundled all-MiniLM-L6-v2 WordPiece vocabulary every random Llama is saved with


def save_random_llama(shape: str, directory: Path, device: str = "cpu") -> Path:
    """A randomly initialised LlamaModel of ``hidden,layers,intermediate,vocab`` saved in bfloat16 (reused when
    ``directory`` already holds it), with the MiniLM WordPiece tokenizer (its vocabulary fits any vocab >= 30522).
    ``device``: where it is initialised (``cuda``: the GPU draws the 6.6B random weights of the 7B shape)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaModel

    from outlierlab.models.encoder_source import bundled_model_path

    if (directory / "config.json").is_file():
        check_saved_shape(directory, shape)
        return directory
    hidden, layers, inter, vocab = (int(x) for x in shape.split(","))
    cfg = LlamaConfig(hidden_size=hidden, num_hidden_layers=layers, intermediate_size=inter, vocab_size=vocab,
                      num_attention_heads=max(1, hidden // 128), num_key_value_heads=max(1, hidden // 128),
                      max_position_embeddings=2048, dtype="bfloat16")
    torch.set_default_dtype(torch.bfloat16)  # initialise in bf16: never hold a float32 copy
    with torch.device(device):
        model = LlamaModel(cfg).eval()
    torch.set_default_dtype(torch.float32)
    model.save_pretrained(directory)
    del model
    if device != "cpu":
        torch.cuda.empty_cache()  # the child measures its own process; this one keeps only its CUDA context
    AutoTokenizer.from_pretrained(bundled_model_path()).save_pretrained(directory)
    return directory


def ensure_random_llama(shape: str, directory: Path, device: str = "cpu") -> Path:
    """:func:`save_random_llama` in a child process when ``directory`` does not hold the model yet.

    Linux copies a process's RSS high-water mark into every child it forks and keeps it across ``exec``
    (``ru_maxrss`` of a child is at least its parent's RSS at the fork): a benchmark process that had built the
    2 GB model itself reported 2.3 GiB "after the imports" for its children.  Built in a child, it never
    holds the weights."""
    vocab = int(shape.split(",")[-1])
    if vocab < TOKENIZER_VOCAB:  # the tokenizer's ids would index past the embedding, deep inside evaluate.py
        sys.exit(f"evaluate_memory.py: --llama {shape}: the vocabulary must hold the bundled MiniLM tokenizer's "
                 f"{TOKENIZER_VOCAB} ids; use a vocab >= {TOKENIZER_VOCAB} (e.g. 32000)")
    if not (directory / "config.json").is_file():
        code = (f"import sys; sys.path[:0] = [{str(ROOT)!r}, {str(ROOT / 'benchmarks')!r}]; import random_llama as m; "
                f"from pathlib import Path; m.save_random_llama({shape!r}, Path({str(directory)!r}), {device!r})")
        subprocess.run([sys.executable, "-c", code], check=True, cwd=str(ROOT))
    return save_random_llama(shape, directory, device)  # checks the saved shape


def check_saved_shape(directory: Path, shape: str) -> None:
    """A ``--save-dir`` that already holds a Llama of another shape (e.g. the CPU example's before a 7B run) is
    one line, not a benchmark of the wrong model."""
    cfg = json.loads((directory / "config.json").read_text())
    saved = ",".join(str(cfg.get(k)) for k in ("hidden_size", "num_hidden_layers", "intermediate_size", "vocab_size"))
    want = ",".join(str(int(x)) for x in shape.split(","))
    if saved != want:
        sys.exit(f"evaluate_memory.py: {directory} holds a random Llama of shape {saved}, not --llama {want}; "
                 "pass another --save-dir or delete that one")
