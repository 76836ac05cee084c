"""Bad input to ol.evaluate / ol.probe_positions is refused in one line that names it, before any model runs --
never evaluated as something else (a bare string as its characters, 42 as the sentence "42")."""

from __future__ import annotations

import pytest

import outlierlab as ol
from outlierlab.api import check_texts


class _NoEncoder:
    """Stands where an encoder goes: every refusal below must come before the encoder is touched."""

    def __getattr__(self, name):
        raise AssertionError(f"the encoder was used ({name}) before the input was checked")


def _one_line(excinfo) -> str:
    msg = str(excinfo.value)
    assert "\n" not in msg
    return msg


@pytest.mark.parametrize("call", [ol.evaluate, ol.probe_positions])
def test_a_bare_string_is_refused_not_split_into_characters(call, tmp_path):
    with pytest.raises(TypeError) as e:
        call(_NoEncoder(), "A single sentence.", out_dir=tmp_path)
    assert "single str" in _one_line(e) and "texts=[text]" in str(e.value)


@pytest.mark.parametrize("call", [ol.evaluate, ol.probe_positions])
def test_items_that_are_not_strings_are_named_by_position(call, tmp_path):
    with pytest.raises(TypeError) as e:
        call(_NoEncoder(), ["A sentence.", "Another one.", 42, None, b"bytes"], out_dir=tmp_path)
    msg = _one_line(e)
    assert "3 item(s)" in msg and "[2] int" in msg and "[3] NoneType" in msg and "[4] bytes" in msg
    assert "[0]" not in msg and "[1]" not in msg


def test_empty_and_blank_texts_are_named_by_position():
    with pytest.raises(ValueError) as e:
        check_texts(["fine", "", "also fine", " \t\n "])
    msg = _one_line(e)
    assert "2 empty or blank" in msg and "[1], [3]" in msg
    with pytest.raises(ValueError, match="texts is empty"):
        check_texts([])
    with pytest.raises(ValueError, match=r"\[0\], .*\[7\] and 2 more"):
        check_texts([""] * 10)


@pytest.mark.parametrize("texts", [{"A sentence.": 1, "Another.": 2}, {"A sentence.", "Another."},
                                   frozenset({"A sentence.", "Another."})])
def test_a_dict_or_a_set_of_texts_is_refused(texts):
    # a dict's keys were evaluated; a set's order (str hashes are salted per process) changed which sentences were
    # used and what the seeded samples drew from run to run
    with pytest.raises(TypeError) as e:
        check_texts(texts)
    assert _one_line(e) == (f"texts is a {type(texts).__name__}: pass a list of sentences (their order decides which "
                            "are used and what the seeded samples draw)")
    from outlierlab.monitoring.arguments import texts as monitor_texts

    with pytest.raises(TypeError) as e:  # the monitors' sentences: the same check, under their own name
        monitor_texts("sentences", texts)
    assert _one_line(e) == f"sentences is a {type(texts).__name__}: pass a list of sentences (their order decides " \
                           "which are used and what the seeded samples draw)"


@pytest.mark.parametrize("call", [ol.evaluate, ol.probe_positions])
def test_a_dataframe_is_refused_naming_the_column_to_pass_not_read_as_its_column_names(call, tmp_path):
    import pandas as pd

    # iterating a DataFrame gives its column names: ["id", "text"] were evaluated as two sentences
    frame = pd.DataFrame({"id": [1, 2, 3], "text": ["A sentence.", "Another one.", "A third."]})
    with pytest.raises(TypeError) as e:
        call(_NoEncoder(), frame, out_dir=tmp_path)
    assert _one_line(e) == ("texts is a DataFrame (columns 'id', 'text'): pass the sentences of one column as a "
                            "list, e.g. texts=df['text'].tolist()")
    with pytest.raises(TypeError) as e:  # one column: still a table, refused the same way, naming that column
        call(_NoEncoder(), frame[["text"]].rename(columns={"text": "sent"}), out_dir=tmp_path)
    assert _one_line(e).endswith("e.g. texts=df['sent'].tolist()")
    from outlierlab.monitoring.arguments import texts as monitor_texts

    with pytest.raises(TypeError, match=r"^sentences is a DataFrame .*sentences=df\['text'\]\.tolist\(\)$"):
        monitor_texts("sentences", frame)
    # a column (a Series) is a sequence of sentences: its values, in order, whatever its index
    assert check_texts(frame["text"].set_axis([9, 4, 7])) == ["A sentence.", "Another one.", "A third."]


def test_a_mapping_of_another_type_is_refused_as_a_dict_is():
    from types import MappingProxyType

    with pytest.raises(TypeError, match=r"^texts is a mappingproxy: pass a list of sentences"):
        check_texts(MappingProxyType({"A sentence.": 1, "Another.": 2}))


def test_good_texts_pass_folded_and_none_means_the_shipped_ones():
    assert check_texts(("A  b\tc", "d\ne")) == ["A b c", "d e"]
    assert check_texts(t for t in ["x"]) == ["x"]  # any iterable of str
    assert check_texts(None) is None


@pytest.mark.parametrize("call", [ol.evaluate, ol.probe_positions])
def test_an_unknown_transform_is_one_line_listing_the_valid_ones(call, tmp_path):
    with pytest.raises(ValueError) as e:
        call(_NoEncoder(), ["A sentence."], transforms=["whitening"], out_dir=tmp_path)
    assert _one_line(e) == "unknown transform 'whitening'; valid: abtt, center, clip, none, standardize, whiten"
    with pytest.raises(TypeError, match=r"transforms='whiten' is a single string: pass a list"):
        call(_NoEncoder(), ["A sentence."], transforms="whiten", out_dir=tmp_path)


def test_an_unknown_analysis_or_group_choice_is_one_line(tmp_path):
    with pytest.raises(ValueError) as e:
        ol.evaluate(_NoEncoder(), ["A sentence."], analyses=["outliers", "anisotropi"], out_dir=tmp_path)
    assert _one_line(e).startswith("unknown analysis 'anisotropi'; valid: outliers, anisotropy")
    with pytest.raises(ValueError) as e:
        ol.evaluate(_NoEncoder(), ["A sentence."], overrides=["wic=nope"], out_dir=tmp_path)
    assert _one_line(e).startswith("unknown wic 'nope'; valid:")


@pytest.mark.parametrize("call, key, close", [(ol.evaluate, "outliers.treshold", "outliers.threshold"),
                                              (ol.probe_positions, "probe.epoch", "probe.epochs")])
def test_an_unknown_setting_is_one_line_with_the_closest_keys(call, key, close, tmp_path):
    # as evaluate.py and probe.py say it; Hydra's own message is several lines advising +key=, which adds a key
    # that nothing reads
    with pytest.raises(ValueError) as e:
        call(_NoEncoder(), ["A sentence."], overrides=[f"{key}=0.3"], out_dir=tmp_path)
    assert _one_line(e).startswith(f"unknown setting {key!r}; did you mean {close}")


@pytest.mark.parametrize("call", [ol.evaluate, ol.probe_positions])
@pytest.mark.parametrize("seed", [1.5, "abc", True])
def test_a_seed_that_is_not_an_integer_is_refused(call, seed, tmp_path):
    # int(seed) ran seed 1.5 as seed 1 without a word, and said "invalid literal for int()" for 'abc'
    with pytest.raises(TypeError) as e:
        call(_NoEncoder(), ["A sentence."], seed=seed, out_dir=tmp_path)
    assert _one_line(e) == f"seed must be an integer, got {seed!r} ({type(seed).__name__})"


@pytest.mark.parametrize("call", [ol.evaluate, ol.probe_positions])
@pytest.mark.parametrize("override, argument", [("transform=[none]", "transforms"), ("seed=5", "seed")])
def test_an_override_of_what_an_argument_sets_is_refused(call, override, argument, tmp_path):
    # composed after the argument, it replaced it: transforms=["none", "clip"] ran none alone, without a word
    with pytest.raises(ValueError) as e:
        call(_NoEncoder(), ["A sentence."], transforms=["none", "clip"], overrides=[override], out_dir=tmp_path)
    assert _one_line(e) == f"overrides={override!r} sets what the argument {argument}= sets: pass it there"
    with pytest.raises(ValueError, match=r"sets what the argument analyses= sets"):
        ol.evaluate(_NoEncoder(), ["A sentence."], analyses=["outliers"], overrides=["analyses=[anisotropy]"])


def test_figures_without_a_directory_are_refused(tmp_path):
    with pytest.raises(ValueError, match="plots=True draws PNG files: give out_dir="):
        ol.evaluate(_NoEncoder(), ["A sentence."], plots=True)


def test_help_lists_every_analysis_and_transform():
    """The lists in help(ol.evaluate) are read from the registry and configs/transform/, so a new analysis or
    transform shows there without editing the docstring."""
    from outlierlab.evaluation.registry import ANALYSIS_MODULES
    from outlierlab.metrics.transforms import TRANSFORMS
    from outlierlab.configuration.overrides import CONFIG_DIR

    doc = ol.evaluate.__doc__
    analyses = doc.split("Valid analyses: ", 1)[1].split(" (default")[0]
    transforms = doc.split("Valid transforms: ", 1)[1].split(".")[0]
    assert analyses.split(", ") == list(ANALYSIS_MODULES) and "order_use" in analyses
    assert sorted(transforms.split(", ")) == sorted(p.stem for p in (CONFIG_DIR / "transform").glob("*.yaml"))
    assert set(transforms.split(", ")) == set(TRANSFORMS)


def test_bad_settings_are_refused_in_one_line_before_the_encoder():
    with pytest.raises(TypeError) as e:
        ol.evaluate(_NoEncoder(), ["A sentence."], settings=[42])
    assert _one_line(e).startswith("settings: 42 is not a section's settings; expected one of AblationSettings")
    with pytest.raises(TypeError, match=r"expected a list of settings objects"):
        ol.evaluate(_NoEncoder(), ["A sentence."], settings=ol.OutliersSettings())
    from outlierlab.configuration.run_settings import EncoderSettings

    with pytest.raises(TypeError, match=r"the encoder is the first argument, the transforms are transforms="):
        ol.evaluate(_NoEncoder(), ["A sentence."], settings=[EncoderSettings()])
    with pytest.raises(ValueError) as e:
        ol.evaluate(_NoEncoder(), ["A sentence."], settings=[ol.OutliersSettings(), ol.OutliersSettings(k=2.0)])
    assert _one_line(e) == "settings: two OutliersSettings given; give each section once"



def test_an_override_of_a_section_that_settings_gives_is_refused_not_dropped(tmp_path):
    # the settings object replaces its whole section after the overrides are composed: outliers.k=1.0 was silently
    # not used (the sigma rule ran with k=3)
    with pytest.raises(ValueError) as e:
        ol.evaluate(_NoEncoder(), ["A sentence."], settings=[ol.OutliersSettings(method="sigma")],
                    overrides=["outliers.k=1.0"], out_dir=tmp_path)
    assert _one_line(e) == ("overrides='outliers.k=1.0' sets a key of the section settings= gives whole "
                            "(OutliersSettings): set it there, e.g. OutliersSettings(k=...)")


def _tiny_bert():
    from transformers import AutoTokenizer, BertConfig, BertModel

    from probe_fixtures import minilm_path

    tok = AutoTokenizer.from_pretrained(minilm_path())
    return BertModel(BertConfig(vocab_size=tok.vocab_size, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                intermediate_size=32, max_position_embeddings=32)), tok


def test_a_model_in_memory_named_on_another_device_or_dtype_is_refused_not_ignored():
    """A model in memory is used where and as it is: device='cuda' or dtype='bfloat16' for a float32 model on the CPU
    was accepted and the float32 CPU model measured, without a word."""
    import torch

    model, tok = _tiny_bert()
    with pytest.raises(TypeError) as e:
        ol.load_encoder(model, tokenizer=tok, device="cuda")
    assert _one_line(e) == ("device='cuda': the model in memory is on cpu and is used where it is; move it first "
                            "(model.to('cuda'))")
    with pytest.raises(TypeError) as e:
        ol.load_encoder(model, tokenizer=tok, dtype="bfloat16")
    assert _one_line(e) == ("dtype='bfloat16': the model in memory is in float32 and is used as it is; convert it "
                            "first (model.to(torch.bfloat16))")
    # what agrees with the model, or says nothing, is used as before
    assert ol.load_encoder(model, tokenizer=tok, device="cpu", dtype="auto").model is model
    half = ol.load_encoder(model.to(torch.bfloat16), tokenizer=tok, dtype="bfloat16")
    assert half.model.dtype == torch.bfloat16


def test_an_analysis_object_named_as_a_built_in_or_as_another_is_refused():
    # {"outliers": obj} replaced the built-in outliers analysis the same call asked for, and returned obj's rows
    from types import SimpleNamespace

    def run(ctx):
        return ol.AnalysisResult("outliers", [{"layer": 0}], "")

    with pytest.raises(ValueError) as e:
        ol.evaluate(_NoEncoder(), ["A sentence."], analyses=["outliers", SimpleNamespace(NAME="outliers", run=run)])
    assert _one_line(e).endswith("is named 'outliers', as a built-in analysis: give it a NAME of its own (its table "
                                 "comes back by that name)")
    with pytest.raises(ValueError) as e:
        ol.evaluate(_NoEncoder(), ["A sentence."], analyses=[SimpleNamespace(NAME="mine", run=run),
                                                              SimpleNamespace(NAME="mine", run=run)])
    assert _one_line(e) == "two analysis objects are named 'mine': give each a NAME of its own"


@pytest.mark.parametrize("returned, got", [(lambda: ol.AnalysisResult("other", [{"layer": 0}], ""),
                                            "AnalysisResult named 'other'"),
                                           (lambda: [{"layer": 0}], "list")])
def test_an_analysis_whose_run_returns_something_else_is_told_what_to_return(returned, got):
    # was a KeyError ('other', from the table lookup by name) or an AttributeError ('list' has no summary)
    from types import SimpleNamespace

    model, tok = _tiny_bert()
    enc = ol.load_encoder(model, tokenizer=tok)
    mine = SimpleNamespace(NAME="mine", run=lambda ctx: returned())
    with pytest.raises(ValueError) as e:
        ol.evaluate(enc, ["A sentence.", "Another one."], analyses=[mine], transforms=["none"], progress=False)
    assert _one_line(e) == f"analysis 'mine': run(ctx) returned {got}; return ol.AnalysisResult('mine', rows, markdown)"
    ok = SimpleNamespace(NAME="mine", run=lambda ctx: ol.AnalysisResult("mine", [{"layer": 0, "x": 1.5}], ""))
    assert ol.evaluate(enc, ["A sentence.", "Another one."], analyses=[ok], transforms=["none"],
                       progress=False)["mine"]["x"].tolist() == [1.5]


def test_probe_positions_refuses_another_task():
    # task=sst2 ran a sentence classifier and returned no position_probe table (a KeyError after the training)
    with pytest.raises(ValueError) as e:
        ol.probe_positions(_NoEncoder(), ["A sentence."], overrides=["task=sst2"])
    assert _one_line(e).startswith("overrides='task=sst2': probe_positions runs the position task")


def test_probe_positions_takes_only_its_own_settings_sections():
    with pytest.raises(TypeError) as e:
        ol.probe_positions(_NoEncoder(), ["A sentence."], settings=[ol.WicSettings()])
    assert "expected one of OutliersSettings, ProbeSettings" in _one_line(e)
    # an override of a key of a section given whole would be dropped: refused
    with pytest.raises(ValueError) as e:
        ol.probe_positions(_NoEncoder(), ["A sentence."], settings=[ol.ProbeSettings(epochs=2)],
                           overrides=["probe.lr=0.01"])
    assert _one_line(e).startswith("overrides='probe.lr=0.01' sets a key of the section settings= gives whole "
                                   "(ProbeSettings)")


# ------------------------------------------------------------------ the rest of a notebook's usual mistakes
@pytest.mark.parametrize("call", [ol.evaluate, ol.probe_positions])
@pytest.mark.parametrize("kwargs, error, message", [
    (dict(transforms=None), TypeError, "transforms=None: pass a list, e.g. transforms=['none']"),
    (dict(transforms=["none", None]), TypeError, "transforms must be a list of strings; not a string: [1] None"),
    (dict(overrides=[42]), TypeError, "overrides must be a list of strings; not a string: [0] 42"),
    (dict(overrides=["outliers.k"]), ValueError, "overrides='outliers.k': expected key=value, e.g. 'outliers.k=2.5'"),
    (dict(overrides=["encoder.max_length=10000"]), ValueError,
     "overrides='encoder.max_length=10000': the encoder (the first argument) is loaded already; pass max_length= "
     "to ol.load_encoder"),
    (dict(overrides=["encoder.name_or_path=bert-base-uncased"]), ValueError,
     "overrides='encoder.name_or_path=bert-base-uncased': the encoder (the first argument) is loaded already; load "
     "that encoder with ol.load_encoder"),
    (dict(progress="no"), TypeError, "progress must be True or False, got 'no' (str)"),
    (dict(out_dir=42), TypeError, "out_dir=42: pass a directory path (str or pathlib.Path), or None to write nothing"),
])
def test_list_flag_and_directory_arguments_are_refused_in_one_line_naming_them(call, kwargs, error, message):
    # each was a deep error (str.join on None, 'int' has no 'split', Hydra's 3-line parse error, pathlib's TypeError)
    # or ran as something else (progress="no" showed the bar; encoder.max_length was ignored for the given encoder)
    with pytest.raises(error) as e:
        call(_NoEncoder(), ["A sentence."], **kwargs)
    assert _one_line(e) == message


def test_evaluate_refuses_none_analyses_a_non_bool_plots_and_a_file_as_out_dir(tmp_path):
    with pytest.raises(TypeError) as e:
        ol.evaluate(_NoEncoder(), ["A sentence."], analyses=None)
    assert _one_line(e) == "analyses=None: pass a list, e.g. analyses=['outliers']"
    with pytest.raises(TypeError) as e:  # bool("no") is true: it drew the figures
        ol.evaluate(_NoEncoder(), ["A sentence."], plots="no", out_dir=tmp_path)
    assert _one_line(e) == "plots must be True or False, got 'no' (str)"
    (tmp_path / "results").write_text("a file")
    with pytest.raises(ValueError) as e:  # was "[Errno 17] File exists" after the analyses ran
        ol.evaluate(_NoEncoder(), ["A sentence."], out_dir=tmp_path / "results")
    assert _one_line(e) == f"out_dir={str(tmp_path / 'results')!r} is a file: pass a directory (it is made if missing)"
    with pytest.raises(TypeError, match=r"^tables must be True or False, got 'yes' \(str\)$"):
        ol.probe_positions(_NoEncoder(), ["A sentence."], tables="yes")


@pytest.mark.parametrize("call", [ol.evaluate, ol.probe_positions])
def test_an_encoder_that_is_not_loaded_is_refused_saying_how_to_load_it(call):
    """A model, a hub id or None as the first argument failed as "AttributeError: ... has no attribute 'source'"."""
    import torch

    model, tok = _tiny_bert()
    with pytest.raises(TypeError) as e:
        call(model, ["A sentence."])
    assert _one_line(e) == ("encoder is a BertModel: pass the encoder ol.load_encoder(...) returns (a model in memory: "
                            "ol.load_encoder(model, tokenizer=tokenizer))")
    with pytest.raises(TypeError, match=r"^encoder is a Linear: pass the encoder ol.load_encoder"):
        call(torch.nn.Linear(4, 4), ["A sentence."])
    with pytest.raises(TypeError) as e:
        call("org/model", ["A sentence."])
    assert _one_line(e) == "encoder='org/model' is a name: pass the loaded encoder, ol.load_encoder('org/model')"


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(device="gpu"), ValueError, "device='gpu' is not a device: pass 'auto', 'cpu', 'cuda', 'cuda:1', 'mps', ..."),
    (dict(batch_size=0), ValueError, "batch_size must be an integer >= 1, got 0 (int)"),
    (dict(batch_size="8"), TypeError, "batch_size must be an integer >= 1, got '8' (str)"),
    (dict(batch_size=2.5), TypeError, "batch_size must be an integer >= 1, got 2.5 (float)"),
    (dict(batchsize=8), TypeError, "load_encoder got unknown argument(s) batchsize; valid: name_or_path, dtype, device, "
                                   "max_length, tokenizer, device_map, revision, batch_size, on_overflow, "
                                   "offload_folder"),
    (dict(tokenizer="bert-base-uncased"), TypeError, "tokenizer='bert-base-uncased' is a name: pass the tokenizer "
                                                     "itself, e.g. tokenizer=AutoTokenizer.from_pretrained("
                                                     "'bert-base-uncased')"),
])
def test_load_encoder_refuses_bad_loading_arguments_in_one_line(kwargs, error, message):
    # device='gpu' was torch's "Expected one of cpu, cuda, ... device type" naming no argument; batch_size=0 and "8"
    # were taken (failing at the first forward); an unknown keyword was said to "apply to a model that is loaded"
    model, tok = _tiny_bert()
    with pytest.raises(error) as e:
        ol.load_encoder(model, **{"tokenizer": tok, **kwargs})
    assert _one_line(e) == message
    if "tokenizer" not in kwargs:  # a path's loading arguments are checked before anything is looked up
        with pytest.raises(error) as e:
            ol.load_encoder("no/such/model", **kwargs)
        assert _one_line(e) == message


def test_dim_identity_and_history_frame_refuse_what_is_not_a_history(tmp_path):
    import pandas as pd

    with pytest.raises(TypeError) as e:  # was pathlib's "expected str, bytes or os.PathLike object, not int"
        ol.dim_identity(42)
    assert _one_line(e).startswith("history is a int: pass a DataFrame of a monitor history")
    with pytest.raises(ValueError) as e:  # was KeyError: 'statistic'
        ol.dim_identity(pd.DataFrame({"layer": [0], "dim": [3]}))
    assert _one_line(e).startswith("history has no column(s) step, name, statistic, value: a monitor history")
    with pytest.raises(TypeError, match=r"^path=42: pass the path of a history file"):
        ol.history_frame(42)
    csv = tmp_path / "hidden_states.csv"
    csv.write_text("step,name,statistic,dim,value\n0,layer_1,abs_argmax_share,5,0.5\n")
    with pytest.raises(TypeError) as e:  # its characters were the statistics kept: an empty frame, no error
        ol.history_frame(csv, statistics="abs_argmax_share")
    assert _one_line(e) == ("statistics='abs_argmax_share' is a single string: pass a list, e.g. "
                            "statistics=['abs_argmax_share']")
    assert ol.history_frame(csv, statistics=["abs_argmax_share"])["dim"].tolist() == [5]
    assert ol.dim_identity(csv)["dim"].tolist() == [5]
    with pytest.raises(IsADirectoryError) as e:  # was "not found (was the run trained with the monitors on?)"
        ol.history_frame(tmp_path)
    assert _one_line(e) == f"{tmp_path} is a directory: pass one history file in it, e.g. hidden_states.csv"


@pytest.mark.parametrize("kwargs, message", [
    (dict(analyses=["frequency"], settings=[ol.FrequencySettings(plot_layers=[5], counts_from="eval")]),
     "frequency.plot_layers [5] outside 0..2 (0 = the embeddings, 2 = the last layer)"),
    (dict(analyses=["frequency"], settings=[ol.FrequencySettings(plot_layers=[-1], counts_from="eval")]),
     "frequency.plot_layers [-1] outside 0..2 (0 = the embeddings, 2 = the last layer)"),
    (dict(analyses=["frequency"], settings=[ol.FrequencySettings(dims=[3, 999], counts_from="eval")]),
     "frequency.dims [3, 999] outside 0..15"),
    (dict(transforms=["none", "clip"], overrides=["transform.dims=[999]"]),
     "clip dims [999] out of range for hidden size 16"),
])
def test_layers_and_dims_the_encoder_lacks_are_refused_before_its_first_forward(kwargs, message):
    # plot_layers was found after the sentence pass (minutes on a large model); the dims were checked in time already
    model, tok = _tiny_bert_layers(2)
    enc = ol.load_encoder(model, tokenizer=tok)
    with pytest.raises(ValueError) as e:
        ol.evaluate(enc, ["A sentence.", "Another one.", "A third."], **{"analyses": ["outliers"], "progress": False,
                                                                         **kwargs})
    assert _one_line(e) == message
    assert enc.n_forward_calls == 0


def _tiny_bert_layers(layers: int):
    from transformers import AutoTokenizer, BertConfig, BertModel

    from probe_fixtures import minilm_path

    tok = AutoTokenizer.from_pretrained(minilm_path())
    return BertModel(BertConfig(vocab_size=tok.vocab_size, hidden_size=16, num_hidden_layers=layers,
                                num_attention_heads=2, intermediate_size=32, max_position_embeddings=32)), tok


def test_layer_stream_refuses_a_bare_string_items_that_are_not_strings_and_a_model():
    import torch

    model, tok = _tiny_bert()
    enc = ol.load_encoder(model, tokenizer=tok)
    with pytest.raises(TypeError) as e:  # its characters were encoded as eleven one-letter sentences
        ol.LayerStream(enc, "A sentence.")
    assert _one_line(e) == "texts is a single string: pass a list of sentences, e.g. texts=[text]"
    with pytest.raises(TypeError) as e:
        ol.LayerStream(enc, ["A sentence.", 7])
    assert _one_line(e) == "texts has items that are not strings: [1] int; pass sentences (str)"
    with pytest.raises(TypeError) as e:  # was AttributeError: 'Linear' object has no attribute 'num_layers'
        ol.LayerStream(torch.nn.Linear(4, 4), ["A sentence."])
    assert _one_line(e) == "encoder is a Linear: pass the encoder ol.load_encoder(...) returns"
    assert ol.LayerStream(enc, (t for t in ["A sentence.", "Two."])).texts == ["A sentence.", "Two."]
    import pandas as pd

    with pytest.raises(TypeError) as e:  # its column names were encoded as the sentences
        ol.LayerStream(enc, pd.DataFrame({"text": ["A sentence.", "Two."]}))
    assert _one_line(e) == "texts is a DataFrame: pass the sentences of one column as a list, e.g. " \
                           "texts=df['text'].tolist()"


def test_study_histories_names_a_missing_or_wrong_table(tmp_path):
    with pytest.raises(FileNotFoundError) as e:  # pyarrow said the bare path
        ol.study_histories(tmp_path / "cells.parquet")
    assert _one_line(e).startswith(f"no packed study at {tmp_path / 'cells.parquet'}: pass a cells.parquet written by")
    with pytest.raises(TypeError) as e:  # pyarrow: "cannot construct a FileSource from 42"
        ol.study_histories(42)
    assert _one_line(e) == "table=42: pass the path of a packed study (a cells.parquet)"


@pytest.mark.parametrize("args, message", [
    ((42, [], ""), "AnalysisResult name must be a non-empty string (its table's name), got 42"),
    (("mine", "abc", ""), "AnalysisResult 'mine': rows must be a list of dicts (column -> value), got a str"),
    (("mine", [{"layer": 0}, 1, None], ""),
     "AnalysisResult 'mine': rows must be dicts (column -> value); not a dict: [1] int, [2] NoneType"),
    (("mine", [{"layer": 0}], None),
     "AnalysisResult 'mine': markdown must be a string (its report section, '' for none), got a NoneType"),
])
def test_an_analysis_result_of_the_wrong_parts_is_refused_where_it_is_made(args, message):
    # returned from a notebook analysis' run(ctx), each failed after the run, in the writers: "'str' object has no
    # attribute 'get'", "argument of type 'int' is not iterable", "'NoneType' object has no attribute 'strip'"
    with pytest.raises(TypeError) as e:
        ol.AnalysisResult(*args)
    assert _one_line(e) == message
    assert ol.AnalysisResult("mine", ({"layer": 0},), "").rows == [{"layer": 0}]  # a tuple of rows is a list of them


def test_a_section_given_as_one_dict_is_told_to_pass_keywords():
    # it was "outliers.method must be 'share' or 'sigma', got {'k': 2.0}": the dict read as the first key's value
    with pytest.raises(TypeError) as e:
        ol.OutliersSettings({"k": 2.0})
    assert _one_line(e) == "OutliersSettings takes the keys as keywords, not a dict: OutliersSettings(**{'k': 2.0})"
    assert ol.OutliersSettings(**{"k": 2.0}).k == 2.0
    with pytest.raises(ValueError, match=r"^outliers\.method must be 'share' or 'sigma', got \{'x': 1\}$"):
        ol.OutliersSettings({"x": 1})  # not its keys: a wrong value of the first, as before


@pytest.mark.parametrize("name", ["", "  "])
def test_an_empty_name_is_refused_not_read_as_the_working_directory(name):
    with pytest.raises(ValueError, match=r"^encoder\.name_or_path is empty: give a train\.py run directory"):
        ol.load_encoder(name)
