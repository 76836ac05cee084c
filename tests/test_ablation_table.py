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


def test_a_folder_without_ablation_rows_is_one_line(tmp_path, capsys):
    _run(tmp_path / "b", ["intact,,0,,output,masked_lm,4.0,1,0.5,,,,1,10"])
    assert main([str(tmp_path)]) == 2 and "has ablation.csv with disabled dims" in capsys.readouterr().err
    assert main([str(tmp_path / "missing")]) == 2 and "not a folder" in capsys.readouterr().err
