"""Will what a pass writes to disk fit there?  Checked before the pass, so a run that would fill ``$TMPDIR`` fails in
one line at the start, not with ``No space left on device`` hours into a 70B model's pass.

The one-pass evaluation stores every valid token of every layer (``features.LayerTokenStore``, model dtype: 84 GB for
63k tokens of a 70B model), the fitted maps and Σ (``disk_layers.DiskLayers``, (L+1)·2d²·4 B), and WiC/STS vectors
(``layer_rows.LayerRows``).  The token count is bounded without tokenizing (any tokenizer in use covers at least one
UTF-8 byte per token) and counted exactly only when that bound does not fit.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence

import torch

#: Leave this share of the free space unused (other writers, file-system overhead).
HEADROOM = 0.9


def model_itemsize(encoder) -> int:
    """Bytes per hidden-state value: the model's dtype (bf16/fp16 2, float32 4)."""
    dtype = getattr(getattr(encoder, "model", None), "dtype", None)
    return torch.empty((), dtype=dtype if isinstance(dtype, torch.dtype) else torch.float32).element_size()


def token_bound(encoder, texts: Sequence[str], exact: bool = False) -> int:
    """Valid (non-special) tokens of ``texts`` after truncation: an upper bound from their UTF-8 bytes, or
    (``exact``) counted with the encoder's tokenizer."""
    cap = max(1, int(getattr(encoder, "max_length", 0) or 10 ** 9))
    if not exact:
        return sum(min(len(t.encode("utf-8")), cap) for t in texts)
    ids = encoder.tokenizer(list(texts), add_special_tokens=False, truncation=True, max_length=cap,
                            verbose=False)["input_ids"]
    return sum(len(i) for i in ids)


def check_room(encoder, texts: Sequence[str], what: str, fix: str, per_token_bytes: int | None = None,
               extra_bytes: int = 0, directory: str | None = None) -> None:
    """Raise ``OSError`` (one line: what needs how much where, what is free, ``fix``) when ``N_tokens × per_token_bytes
    + extra_bytes`` (default per token: ``(L+1)·d·itemsize``) does not fit in ``directory``."""
    directory = directory or tempfile.gettempdir()
    free = shutil.disk_usage(directory).free * HEADROOM
    if per_token_bytes is None:
        per_token_bytes = (encoder.num_layers + 1) * encoder.hidden_size * model_itemsize(encoder)
    if token_bound(encoder, texts) * per_token_bytes + extra_bytes <= free:
        return  # fits even at one token per byte: no tokenizing
    if texts and getattr(encoder, "tokenizer", None) is None:
        return  # nothing to count with (a stand-in encoder): let the writes tell
    n = token_bound(encoder, texts, exact=True) if texts else 0
    need = n * per_token_bytes + extra_bytes
    if need > free:
        raise OSError(f"{what} needs {_size(need)} in {directory} ({n} tokens × {per_token_bytes} B"
                      + (f" + {_size(extra_bytes)}" if extra_bytes else "") + f"), "
                      f"{_size(shutil.disk_usage(directory).free)} free there; {fix}")


def _size(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"
