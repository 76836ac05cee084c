"""The repository's own generators of docs/ (tables, studies, reproduction): run from the repository root
as ``python -m lab.<name>``; not part of the installed package."""
