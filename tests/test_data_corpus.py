"""The embedded corpus (content, provenance, reproducible build) and the text readers."""
from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
from pathlib import Path

import pytest

from outlierlab.datamodules import corpus
from outlierlab.datamodules.corpus import (EMBEDDED_DIR, corpus_identity, embedded_files, hub_is_offline, load_embedded_texts,
                                load_hub_texts, load_texts_from_files, read_text_file)

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
needs_shared = pytest.mark.skipif(not (SHARED / "corpora").is_dir(), reason="shared raw data not available")


@pytest.fixture(scope="module")
def docs():
    return load_embedded_texts()


# --------------------------------------------------------------------------------------- embedded corpus
def test_manifest_matches_the_shipped_files():
    manifest = json.loads((EMBEDDED_DIR / "manifest.json").read_text())
    assert [p.name for p in embedded_files()] == [f["file"] for f in manifest["files"]]
    for entry, path in zip(manifest["files"], embedded_files()):
        raw = gzip.decompress(path.read_bytes())
        assert hashlib.sha256(raw).hexdigest() == entry["sha256_uncompressed"]
        assert raw.count(b"\n") == entry["lines"] and len(raw) == entry["bytes_uncompressed"]
    assert 5_000_000 < manifest["total_bytes_uncompressed"] < 6_000_000
    assert (EMBEDDED_DIR / "NOTICE.md").is_file()


def test_embedded_corpus_content(docs):
    assert len(docs) == json.loads((EMBEDDED_DIR / "manifest.json").read_text())["total_lines"]
    text = "\n".join(docs)
    assert docs[0].startswith("The family of Dashwood had long been settled in Sussex.")  # Sense and Sensibility
    assert "It is a truth universally acknowledged" in text and "Emma Woodhouse, handsome, clever" in text
    assert "Call me Ishmael." in text  # Moby Dick
    assert "In the beginning God created the heaven and the earth." in docs
    assert docs[-1].startswith("And in all that mighty hand, and in all the great terror")  # Deuteronomy 34:12
    assert "Now after the death of Moses the servant of the LORD" not in text  # Joshua 1:1: not included
    # held out / excluded
    assert "Kellynch" not in text and "Anne Elliot" not in text  # Persuasion
    assert "gutenberg" not in text.lower()
    assert all(d == d.strip() and d and "\ufeff" not in d for d in docs)


@needs_shared
def test_no_line_of_persuasion_or_wordnet_is_embedded(docs):
    lines = set(docs)
    for name in ("janeaustenr__persuasion.txt.gz", "wordnet_glosses_examples.txt.gz"):
        with gzip.open(SHARED / "corpora" / name, "rt", encoding="utf-8") as f:
            held_out = {line.strip() for line in f if len(line.strip()) > 40}
        assert not lines & held_out, name


@needs_shared
def test_build_script_is_deterministic_and_matches_the_shipped_corpus(tmp_path):
    spec = importlib.util.spec_from_file_location("build_corpus", ROOT / "scripts" / "build_corpus.py")
    build_corpus = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build_corpus)
    assert build_corpus.main(["--source", str(SHARED), "--out", str(tmp_path)]) == 0
    for name in [p.name for p in embedded_files()] + ["manifest.json", "NOTICE.md"]:
        assert (tmp_path / name).read_bytes() == (EMBEDDED_DIR / name).read_bytes(), name
    assert build_corpus.main(["--source", str(SHARED), "--out", str(EMBEDDED_DIR), "--check"]) == 0
    (tmp_path / "austen_emma.txt.gz").write_bytes(b"")
    assert build_corpus.main(["--source", str(SHARED), "--out", str(tmp_path), "--check"]) == 1


# ------------------------------------------------------------------------------------------- text files
def test_read_txt_and_gz_alike(tmp_path):
    content = "\ufefffirst line\n\n   second line  \n\nthird\n"
    (tmp_path / "a.txt").write_text(content, encoding="utf-8")
    with gzip.open(tmp_path / "a.txt.gz", "wt", encoding="utf-8") as f:
        f.write(content)
    expected = ["first line", "second line", "third"]
    assert read_text_file(tmp_path / "a.txt") == read_text_file(tmp_path / "a.txt.gz") == expected


def test_non_utf8_lines_are_skipped_with_a_warning(tmp_path):
    p = tmp_path / "latin1.txt"
    p.write_bytes("good one\n".encode() + "caf\xe9\n".encode("latin-1") + b"good two\n" + b"\xff\xfe bad\n")
    with pytest.warns(UnicodeWarning, match=r"latin1\.txt: skipped 2 line\(s\) that are not valid UTF-8"):
        assert read_text_file(p) == ["good one", "good two"]


def test_files_are_read_in_order_up_to_max_documents(tmp_path):
    (tmp_path / "a.txt").write_text("a1\na2\n")
    (tmp_path / "b.txt").write_text("b1\nb2\nb3\n")
    files = [tmp_path / "b.txt", tmp_path / "a.txt"]
    assert load_texts_from_files(files) == ["b1", "b2", "b3", "a1", "a2"]
    assert load_texts_from_files(files, max_documents=4) == ["b1", "b2", "b3", "a1"]


def test_identity_follows_content_not_path(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("same\n")
    b.write_text("same\n")
    assert corpus_identity("files", [str(a)]) == corpus_identity("files", [str(b)])
    assert corpus_identity("files", [str(a)]) != corpus_identity("files", [str(a)], max_documents=1)
    b.write_text("changed\n")
    assert corpus_identity("files", [str(a)]) != corpus_identity("files", [str(b)])
    assert corpus_identity("embedded") == corpus_identity("embedded")


# ---------------------------------------------------------------------------------- datasets / the hub
@pytest.mark.parametrize("streaming", [True, False])
def test_load_dataset_text_path(tmp_path, streaming):
    """The hub loader's real code path, run on local files with datasets' packaged "text" loader."""
    (tmp_path / "a.txt").write_text("alpha\n\nbeta\ngamma\n")
    with gzip.open(tmp_path / "b.txt.gz", "wt") as f:
        f.write("delta\nepsilon\n")
    files = [str(tmp_path / "a.txt"), str(tmp_path / "b.txt.gz")]
    got = load_hub_texts("text", None, data_files=files, max_documents=4, streaming=streaming,
                         cache_dir=tmp_path / "hf")
    assert got == ["alpha", "beta", "gamma", "delta"]
    with pytest.raises(ValueError, match="has no column 'body'"):
        load_hub_texts("text", None, data_files=files, text_column="body", max_documents=4,
                       streaming=streaming, cache_dir=tmp_path / "hf")


def test_datamodule_hub_source_with_local_text_files(tmp_path):
    from outlierlab.datamodules.mlm_datamodule import MLMDataModule

    src = tmp_path / "docs.txt"
    src.write_text("\n".join(load_embedded_texts(max_documents=120)) + "\n")
    dm = MLMDataModule(source="hub", hub={"path": "text", "name": None, "data_files": [str(src)]},
                       max_documents=100, tokenizer={"vocab_size": 500}, block_size=32, val_blocks=2,
                       cache_dir=str(tmp_path / "cache"))
    dm.prepare_data()
    dm.setup("fit")
    assert dm.stats["documents"] == 100 and dm.stats["source"] == "hub"


def test_hub_offline_fails_at_once_with_advice(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub_is_offline()
    with pytest.raises(ConnectionError, match=r"cannot stream hub dataset wikimedia/wikipedia \(20231101\.en\).*"
                                              r"data=files data\.files="):
        load_hub_texts("wikimedia/wikipedia", "20231101.en", max_documents=10)


def test_unreachable_hub_counts_as_offline(monkeypatch):
    import huggingface_hub.constants as c

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(c, "HF_HUB_OFFLINE", False)
    assert hub_is_offline("https://hub.invalid", timeout=2.0)  # .invalid never resolves


def test_failed_dataset_load_is_one_line(tmp_path):
    with pytest.raises(RuntimeError, match=r"loading text split 'train' failed \(.*\); check data\.hub") as e:
        load_hub_texts("text", None, data_files=[str(tmp_path / "missing.txt")], max_documents=3,
                       cache_dir=tmp_path / "hf")
    assert "\n" not in str(e.value)


def test_corpus_module_imports_no_heavy_libraries():
    import subprocess
    import sys

    code = "import sys, outlierlab.datamodules.corpus; print(sorted(m for m in ('torch', 'datasets', 'transformers', 'lightning') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ------------------------------------------------------------------------------------ english_large build
def _load_build_script():
    spec = importlib.util.spec_from_file_location("build_english_large", ROOT / "scripts" / "build_english_large.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _dictd_code(n: int) -> str:
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    out = ""
    while True:
        out = alphabet[n % 64] + out
        n //= 64
        if n == 0:
            return out


def test_dictd_numbers_decode_by_hand():
    b = _load_build_script()
    assert b.dictd_number("A") == 0 and b.dictd_number("/") == 63
    assert b.dictd_number("Fz") == 5 * 64 + 51        # F=5, z=51
    assert b.dictd_number("BAA") == 64 * 64


def test_gcide_entries_are_cleaned_and_wordnet_entries_dropped():
    b = _load_build_script()
    entries = [
        ("00-database-info", "00-database-info\n   This file was converted from the original database.\n"),
        ("Abdication", 'Abdication \\Ab`di*ca"tion\\, n. [L. abdicatio.]\n   The act of abdicating; the '
                       'renunciation of a high office.\n   [1913 Webster]\n'),
        ("Accipitridae", "Accipitridae \\Accipitridae\\ n.\n   1. a family of birds consisting of the hawks.\n\n"
                         "   Syn: family {Accipitridae}.\n        [WordNet 1.5]\n"),
        ("Abbe", "Abbe \\Ab`be\\, n.\n   An abbot; a title given in France to clergymen.\n   [Webster 1913 Suppl.]\n"),
        ("Ab", "Ab \\Ab\\\n"),  # a bare headword: no text
    ]
    data, index, offsets = b"", [], {}
    for head, text in entries:
        raw = text.encode("utf-8") + b"\n"
        offsets[head] = (len(data), len(raw))
        data += raw
    for head, (start, length) in offsets.items():
        index.append(f"{head}\t{_dictd_code(start)}\t{_dictd_code(length)}")
    index.append(f"abdication\t{_dictd_code(offsets['Abdication'][0])}\t{_dictd_code(offsets['Abdication'][1])}")
    docs = b.gcide_documents(data, "\n".join(index))
    assert docs == [
        "Abdication , n. [L. abdicatio.] The act of abdicating; the renunciation of a high office.",
        "Abbe , n. An abbot; a title given in France to clergymen.",
    ]


def test_corpus_folder_with_manifest_stands_for_its_files(tmp_path):
    (tmp_path / "b.txt").write_text("second file\n")
    with gzip.open(tmp_path / "a.txt.gz", "wt") as f:
        f.write("first file, line one\nline two\n")
    (tmp_path / "manifest.json").write_text(json.dumps({"files": [{"file": "a.txt.gz"}, {"file": "b.txt"}]}))
    assert load_texts_from_files([tmp_path]) == ["first file, line one", "line two", "second file"]
    assert corpus_identity("files", [str(tmp_path)]) == corpus_identity("files", [tmp_path / "a.txt.gz",
                                                                                 tmp_path / "b.txt"])
    with pytest.raises(FileNotFoundError, match="build it first.*build_english_large.py"):
        load_texts_from_files([tmp_path / "not_built"])
    (tmp_path / "bare").mkdir()
    with pytest.raises(ValueError, match="has no manifest.json"):
        load_texts_from_files([tmp_path / "bare"])
