"""Reading an analysis' config node (omegaconf DictConfig, dict or object) with a fallback default."""

from __future__ import annotations


def setting(node, key: str, default=None):
    """``node.key``; ``default`` when the node or the key is missing or the value is null."""
    if node is None:
        return default
    value = node.get(key, default) if hasattr(node, "get") else getattr(node, key, default)
    return default if value is None and default is not None else value
