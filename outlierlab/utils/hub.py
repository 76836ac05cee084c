"""Whether the Hugging Face hub can be reached, decided in seconds.

Used by every loader that takes a hub name (encoders in ``outlierlab.models.encoder_source``, data sets in
``datamodules``), so that an offline machine gets a one-line error instead of a 30-50 s retry loop.
"""

from __future__ import annotations

import os
import socket
import threading

from huggingface_hub import constants


def hub_is_offline(endpoint: str | None = None, timeout: float = 3.0) -> bool:
    """True if ``HF_HUB_OFFLINE`` is set or the hub host cannot be reached within ``timeout`` seconds (a hub call
    without network otherwise retries for ~30-50 s)."""
    if constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE", "").upper() in {"1", "ON", "YES", "TRUE"}:
        return True
    host = (endpoint or constants.ENDPOINT).split("://")[-1].split("/")[0].split(":")[0]
    ok: list[bool] = []

    def probe() -> None:  # in a thread: getaddrinfo ignores socket timeouts
        try:
            socket.create_connection((host, 443), timeout=timeout).close()
            ok.append(True)
        except OSError:
            pass

    t = threading.Thread(target=probe, daemon=True)
    t.start()
    t.join(timeout + 0.5)
    return not ok
