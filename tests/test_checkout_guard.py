"""The test suite's own guard against writing into the checkout (tests/conftest.py)."""


def test_the_suite_s_checkout_check_sees_writes_at_any_depth(tmp_path):
    """conftest's session-end check must see a file written deep inside an existing folder, a tracked file
    changed and an ignored output, and must not count Python's caches."""
    import subprocess

    from conftest import checkout_entries

    def git(*a):
        subprocess.run(["git", "-C", str(tmp_path), *a], check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "pkg" / "deep").mkdir(parents=True)
    (tmp_path / "pkg" / "deep" / "kept.txt").write_text("a")
    (tmp_path / ".gitignore").write_text("outputs/\n")
    git("add", ".")
    git("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "init")
    before = checkout_entries(tmp_path)
    assert before == set()
    (tmp_path / "pkg" / "deep" / "new.ckpt").write_text("x")
    (tmp_path / "pkg" / "deep" / "kept.txt").write_text("b")
    (tmp_path / "outputs" / "run").mkdir(parents=True)
    (tmp_path / "outputs" / "run" / "events").write_text("x")
    (tmp_path / "pkg" / "__pycache__").mkdir()
    (tmp_path / "pkg" / "__pycache__" / "m.pyc").write_text("x")
    new = {e[3:] for e in checkout_entries(tmp_path) - before}
    assert new == {"pkg/deep/new.ckpt", "pkg/deep/kept.txt", "outputs/run/events"}
    assert checkout_entries(tmp_path / "nowhere") is None  # not a checkout: no check, no crash
