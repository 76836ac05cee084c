"""Leaf helpers with no project imports, usable from every layer (progress lines in logs)."""
