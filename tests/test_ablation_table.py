"""The ablation study table: the rise of each disabled set against the random draws, computed by hand."""

from outlierlab.studies.ablation_table import main

HEADER = "condition,draw,n_dims,dims,layernorms,objective,loss,ppl,top1,loss_std,ppl_std,top1_std,n_draws,n_masked\n"


def _run(folder, rows):
    folder.mkdir()
    (folder / "ablation.csv").write_text(HEADER + "".join(f"{r}\n" for r in rows))


def test_each_disabled_set_is_ranked_against_draws_of_as_many_dims(tmp_path, capsys):
    _run(tmp_path / "a", ["intact,,0,,output,masked_lm,5.0,1,0.50,,,,1,10",
                          "outliers,,1,7,output,masked_lm,5.3,1,0.40,,,,1,10",
                          "random,,1,1|2|3,output,masked_lm,5.1,1,0.5,0.1,,,3,10",
                          "random_draw,0,1,1,output,masked_lm,5.0,1,0.5,,,,1,10",
                          "random_draw,1,1,2,output,masked_lm,5.1,1,0.5,,,,1,10",
                          "random_draw,2,1,3,output,masked_lm,5.5,1,0.5,,,,1,10",
                          "user,,2,4;5,output,masked_lm,6.0,1,0.25,,,,1,10"])
    _run(tmp_path / "b", ["intact,,0,,output,masked_lm,4.0,1,0.5,,,,1,10"])  # nothing disabled: no row
    (tmp_path / "c").mkdir()  # no ablation.csv
    assert main([str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2:] == [
        # 5.3 - 5.0 = +0.3 exceeds the draws' rises 0.0 and 0.1, not 0.5; their mean is 0.2
        "| a | 5.000 | 7 | +0.300 | -0.100 | +0.200 (+0.000 to +0.500) | 2 of 3 |",
        "| a | 5.000 | 4 5 | +1.000 | -0.250 | – | – |",  # two dims against one-dim draws: not compared
    ]


def test_the_norms_and_layers_a_set_was_zeroed_in_are_named(tmp_path, capsys):
    header = HEADER.replace("layernorms,", "layernorms,layers,")
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "ablation.csv").write_text(header + "".join(f"{r}\n" for r in [
        "intact,,0,,output,1;2,masked_lm,5.0,1,0.5,,,,1,10", "outliers,,1,7,output,1;2,masked_lm,5.3,1,0.4,,,,1,10",
        "user,,1,4,output,1;2,masked_lm,5.1,1,0.5,,,,1,10"]))
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "ablation.csv").write_text(header + "".join(f"{r}\n" for r in [
        "intact,,0,,output,,masked_lm,5.0,1,0.5,,,,1,10", "outliers,,1,7,output,,masked_lm,5.3,1,0.4,,,,1,10"]))
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "ablation.csv").write_text(header + "".join(f"{r}\n" for r in [
        "intact,,0,,attention_output;embeddings,1,masked_lm,5.0,1,0.5,,,,1,10",
        "outliers,,1,7,attention_output;embeddings,1,masked_lm,5.3,1,0.4,,,,1,10"]))
    assert main([str(tmp_path)]) == 0
    cells = [line.split(" | ")[2] for line in capsys.readouterr().out.splitlines()[2:]]
    # b: every layer's output LayerNorm (Kovaleva et al.'s), nothing added; c: other norms, named
    assert cells == ["7 (layers 1, 2)", "4 (layers 1, 2)", "7", "7 (attention_output, embeddings; layer 1)"]


def test_a_folder_without_ablation_rows_is_one_line(tmp_path, capsys):
    _run(tmp_path / "b", ["intact,,0,,output,masked_lm,4.0,1,0.5,,,,1,10"])
    assert main([str(tmp_path)]) == 2 and "has ablation.csv with disabled dims" in capsys.readouterr().err
    assert main([str(tmp_path / "missing")]) == 2 and "not a folder" in capsys.readouterr().err


POSITION_HEADER = "condition,draw,dims,positions,first_position,last_position,n_masked,loss,top1\n"


def test_by_position_ranks_each_set_against_the_draws_in_each_bucket(tmp_path, capsys):
    def run(name, rows):
        (tmp_path / name).mkdir()
        (tmp_path / name / "ablation_by_position.csv").write_text(POSITION_HEADER + "".join(f"{r}\n" for r in rows))

    run("a", ["intact,,,1,1,1,5,5.0,0.5", "intact,,,2-3,2,3,9,4.0,0.5",
              "outliers,,7,1,1,1,5,5.5,0.5", "outliers,,7,2-3,2,3,9,4.1,0.5",
              "random,,,1,1,1,5,5.4,0.5", "random,,,2-3,2,3,9,3.95,0.5",
              "random_draw,0,1,1,1,1,5,5.2,0.5", "random_draw,0,1,2-3,2,3,9,3.9,0.5",
              "random_draw,1,2,1,1,1,5,5.6,0.5", "random_draw,1,2,2-3,2,3,9,4.0,0.5",
              "user,,4;5,1,1,1,5,6.0,0.5", "user,,4;5,2-3,2,3,9,4.5,0.5"])
    run("b", ["intact,,,1,1,1,5,3.0,0.5", "user,,9,1,1,1,5,3.25,0.5"])  # no bucket 2-3 scored, no random draws
    assert main([str(tmp_path), "--by-position"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "| run | dims zeroed | pos. 1 | pos. 2-3 |"
    # bucket 1: dim 7's rise 0.5 against the draws' 0.2 and 0.6 (mean 0.4), above one; bucket 2-3: 0.1 against -0.1
    # and 0.0, above both.  The two-dim user set is not compared with one-dim draws; run b has no draws.
    assert lines[2:] == ["| a | 7 | +0.500 (+0.400, 1/2) | +0.100 (-0.050, 2/2) |", "| a | 4 5 | +1.000 | +0.500 |",
                         "| b | 9 | +0.250 | – |"]
