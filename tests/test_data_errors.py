"""Every bad data input fails with one actionable line (the message text is asserted)."""
from __future__ import annotations

import gzip

import pytest

from outlierlab.datamodules.corpus import load_hub_texts, load_texts_from_files, read_text_file
from outlierlab.datamodules.mlm_datamodule import MLMDataModule
from outlierlab.datamodules.token_blocks import TokenBlocks
from outlierlab.datamodules.tokenizer import load_tokenizer, mlm_special_ids, train_bpe_tokenizer


def _one_line(excinfo) -> str:
    msg = str(excinfo.value)
    assert "\n" not in msg
    return msg


@pytest.mark.parametrize("kwargs, message", [
    ({"block_size": 1}, r"data\.block_size must be an integer >= 2 \(<s> plus at least one text token\), got 1"),
    ({"block_size": 0}, r"data\.block_size must be an integer >= 2"),
    ({"source": "s3"}, r"unknown data\.source 's3'; choose one of embedded, files, hub"),
    ({"source": "files"}, r"data\.source=files needs data\.files=\[a\.txt,b\.txt\.gz\]"),
    ({"source": "hub"}, r"data\.source=hub streams the dataset: set data\.max_documents"),
    ({"batch_size": 0}, r"data\.batch_size must be an integer >= 1, got 0"),
    ({"val_fraction": 1.0}, r"data\.val_fraction must be in \[0, 1\), got 1\.0"),
    ({"mlm_probability": 0.0}, r"data\.mlm_probability must be in \(0, 1\), got 0\.0"),
    ({"max_documents": 0}, r"data\.max_documents must be >= 1 or null, got 0"),
    ({"tokenizer": {"vocab_size": 100}}, r"data\.tokenizer\.vocab_size must be >= 261 for byte-level BPE"),
    ({"tokenizer": {"vocab": 100}}, r"unknown data\.tokenizer option\(s\) \['vocab'\]; allowed:"),
    ({"source": "hub", "max_documents": 5, "hub": {"pth": "x"}}, r"unknown data\.hub option\(s\) \['pth'\]"),
])
def test_bad_config_values(kwargs, message, tmp_path):
    with pytest.raises(ValueError, match=message) as e:
        MLMDataModule(cache_dir=str(tmp_path), **kwargs)
    _one_line(e)


def test_missing_file_is_named(tmp_path):
    (tmp_path / "ok.txt").write_text("fine\n")
    missing = tmp_path / "nope.txt"
    dm = MLMDataModule(source="files", files=[str(tmp_path / "ok.txt"), str(missing)], cache_dir=str(tmp_path))
    with pytest.raises(FileNotFoundError, match=f"text file not found: {missing}") as e:
        dm.prepare_data()
    _one_line(e)
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        load_texts_from_files([missing])


def test_empty_file_is_named(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n   \n\n")
    with pytest.raises(ValueError, match=f"text file {empty} contains no text") as e:
        MLMDataModule(source="files", files=[str(empty)], cache_dir=str(tmp_path)).prepare_data()
    _one_line(e)


def test_file_with_only_undecodable_lines(tmp_path):
    bad = tmp_path / "binary.txt"
    bad.write_bytes(b"\xff\xfe\x00\n\xc3\x28\n")
    with pytest.warns(UnicodeWarning, match="skipped 2 line"), \
            pytest.raises(ValueError, match="binary.txt contains no text"):
        read_text_file(bad)


def test_gz_that_is_not_gzip(tmp_path):
    fake = tmp_path / "fake.txt.gz"
    fake.write_text("plain text\n")
    with pytest.raises(ValueError, match=r"fake\.txt\.gz is not a valid gzip file .*use \.txt for plain text") as e:
        read_text_file(fake)
    _one_line(e)


def test_too_few_blocks_for_a_validation_split(tmp_path):
    f = tmp_path / "short.txt.gz"
    with gzip.open(f, "wt") as g:
        g.write("Only a few words here, far fewer than one block of tokens.\n" * 3)
    dm = MLMDataModule(source="files", files=[str(f)], tokenizer={"vocab_size": 300}, block_size=512,
                       val_blocks=1, cache_dir=str(tmp_path))
    with pytest.warns(UserWarning, match="corpus too small"), \
            pytest.raises(ValueError, match=r"the corpus gives only 1 block\(s\) of block_size=512, too few for 1 "
                                            r"validation block\(s\) plus training; add text, lower data\.block_size") as e:
        dm.setup("fit")
    _one_line(e)


def test_tokenizer_read_before_setup(tmp_path):
    with pytest.raises(RuntimeError, match=r"call datamodule\.prepare_data\(\) and setup\('fit'\) before"):
        MLMDataModule(cache_dir=str(tmp_path)).vocab_size


def test_blocks_reject_block_size_one(tmp_path):
    with pytest.raises(ValueError, match="block_size must be >= 2"):
        TokenBlocks(tmp_path, {"tokens": 3}, block_size=1, bos_id=0, pad_id=1)


def test_tokenizer_hub_id_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConnectionError, match=r"tokenizer 'outlierlab-test/no-such-tokenizer' is not a local folder "
                                              r"and the hub is unreachable \(offline\); set data\.tokenizer\.name_or_path") as e:
        load_tokenizer("outlierlab-test/no-such-tokenizer")
    _one_line(e)


def test_tokenizer_path_that_is_a_file_or_empty_folder(tmp_path):
    f = tmp_path / "vocab.json"
    f.write_text("{}")
    with pytest.raises(ValueError, match="is a file; give the tokenizer's folder"):
        load_tokenizer(str(f))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"cannot load a tokenizer from .*empty .*save_pretrained writes them") as e:
        load_tokenizer(str(tmp_path / "empty"))
    _one_line(e)


def test_tokenizer_without_mask_or_pad_is_rejected():
    from transformers import PreTrainedTokenizerFast

    with pytest.warns(UserWarning, match="corpus too small"):
        bpe = train_bpe_tokenizer(["a tiny corpus", "for a test"], vocab_size=300)
    gpt_like = PreTrainedTokenizerFast(tokenizer_object=bpe.backend_tokenizer, bos_token="<s>", eos_token="</s>")
    with pytest.raises(ValueError, match=r"lacks token\(s\) needed for MLM: pad, mask"):
        mlm_special_ids(gpt_like)


def test_streaming_without_max_documents():
    with pytest.raises(ValueError, match=r"data\.max_documents must be set \(>0\) to stream wikimedia/wikipedia"):
        load_hub_texts("wikimedia/wikipedia", "20231101.en", max_documents=None)


def test_dataset_without_text(tmp_path):
    blank = tmp_path / "blank.txt"
    blank.write_text("\n\n  \n")
    with pytest.raises(ValueError, match=r"dataset text split 'train' gave no non-empty 'text' documents"):
        load_hub_texts("text", None, data_files=[str(blank)], max_documents=5, cache_dir=tmp_path / "hf")


def test_resuming_with_other_data_settings_warns(tmp_path):
    kw = dict(max_documents=100, tokenizer={"vocab_size": 400}, block_size=32, val_blocks=2, cache_dir=str(tmp_path))
    dm = MLMDataModule(batch_size=4, **kw)
    dm.setup("fit")
    dm.train_dataloader()
    state = dm.state_dict()
    assert state["batch_size"] == 4 and state["batches_consumed"] == 0
    with pytest.warns(UserWarning, match=r"the data differ from the checkpoint's \(batch_size: 4 -> 8\)"):
        MLMDataModule(batch_size=8, **kw).load_state_dict(state)
