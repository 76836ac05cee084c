"""The evaluation report's own drawing and linking (outlierlab/reports/evaluation_report.py)."""

from __future__ import annotations

import numpy as np
import pytest


def _pixels(draw) -> tuple[np.ndarray, tuple]:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(3.2, 2.2))
    draw(ax)
    ax.set_title("layer 3", fontsize=8)
    fig.tight_layout()
    fig.canvas.draw()
    out = np.asarray(fig.canvas.buffer_rgba()).copy(), (ax.get_xlim(), ax.get_ylim())
    plt.close(fig)
    return out


@pytest.mark.parametrize("values", [np.random.default_rng(0).standard_normal(384).tolist(),  # both signs
                                    (np.random.default_rng(1).random(50) + 0.5).tolist(),   # all above 0
                                    (-np.random.default_rng(2).random(20)).tolist(),        # all below 0
                                    [0.0] * 8])                                             # flat
def test_the_step_bars_are_the_pixels_matplotlib_stairs_draws(values):
    """``_bars`` skips stairs' per-segment extent walks (minutes over a series of 7B figures); the figure must
    not change: the same axis limits (margins, the sticky baseline) and the same pixels."""
    from outlierlab.reports.evaluation_report import _bars

    edges = [k - 0.5 for k in range(len(values) + 1)]
    ref, ref_lims = _pixels(lambda ax: ax.stairs(values, edges, fill=True, baseline=0.0, color="tab:blue"))
    got, got_lims = _pixels(lambda ax: _bars(ax, values))
    assert got_lims == ref_lims
    assert (got == ref).all()


def test_the_report_links_only_the_figures_drawn(tmp_path):
    from outlierlab.reports.evaluation_report import write_report

    (tmp_path / "old.png").write_bytes(b"an earlier run's figure")
    sections = ["## A\n\n![a](a.png)\n\ntext after", "## B\n\n![old](old.png)", "## C\n\n![c](c.png)"]
    text = write_report(tmp_path, "# head", sections, drawn=["a.png"]).read_text()
    assert "![a](a.png)" in text and "text after" in text
    assert "old.png" not in text and "c.png" not in text and "## B" in text and "## C" in text
    assert write_report(tmp_path, "# head", sections).read_text().count("![") == 3  # no list: nothing removed


def test_layer_axes_tick_whole_layers(tmp_path, monkeypatch):
    """Per-layer figures (evaluate's, probe.py's) put ticks on layers only: 5 layers once gave 0.5, 1.5, ..."""
    from matplotlib.figure import Figure

    from outlierlab.reports import evaluation_report, probe_report

    figs, savefig = [], Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: (figs.append(fig), savefig(fig, *a, **k)))
    evaluation_report.plot_layers(tmp_path / "a.png", {"none": [0.1, 0.2, 0.3, 0.25, 0.2]}, "y", "t")
    rows = [{"layer": i, "transform": "none", "accuracy": 0.1 * i, "chance": 0.03, "contribution_outlier": 0.1,
             "contribution_mean": 0.05} for i in range(5)]
    probe_report.write_plots(rows, tmp_path, "position_probe")
    assert len(figs) == 3
    for fig in figs:
        ax = fig.axes[0]
        lo, hi = ax.get_xlim()
        ticks = [t for t in ax.get_xticks() if lo <= t <= hi]
        assert len(ticks) >= 3 and all(float(t).is_integer() for t in ticks), ticks


@pytest.mark.parametrize("n_panels", [1, 7, 13])
def test_fixed_margins_keep_every_label_on_the_figure(tmp_path, monkeypatch, n_panels):
    """The per-layer figures are laid out with fixed margins instead of tight_layout (half of each figure's cost):
    every title, tick label and axis label must still lie inside the figure and no two panels' texts overlap."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from outlierlab.reports.evaluation_report import plot_layers, plot_vectors

    figs, savefig = [], Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: (figs.append(fig), savefig(fig, *a, **k)))
    rng = np.random.default_rng(n_panels)
    vectors = [(rng.standard_normal(384) * 1e3).tolist() for _ in range(n_panels)]  # wide tick labels: -3000
    plot_vectors(tmp_path / "v.png", vectors, [f"layer {i}" for i in range(n_panels)], [[0, 1, 2]] * n_panels,
                 "average token vector per layer (Luo et al. Figs. 1–2)")
    plot_layers(tmp_path / "l.png", {"none": (rng.random(n_panels + 1) * 1e-4).tolist()}, "share of the top 3 dims",
                "Anisotropy per layer")
    for fig in figs:
        canvas = FigureCanvasAgg(fig)
        canvas.draw()
        renderer = canvas.get_renderer()
        box = fig.bbox
        panels = [ax.get_tightbbox(renderer) for ax in fig.axes if ax.get_visible() and ax.axison]
        title = fig._suptitle  # noqa: SLF001 -- matplotlib keeps the suptitle there (no public getter)
        for e in panels + ([title.get_window_extent(renderer)] if title is not None else []):
            assert box.x0 - 1 <= e.x0 and e.x1 <= box.x1 + 1 and box.y0 - 1 <= e.y0 and e.y1 <= box.y1 + 1, e
        if title is not None:  # the suptitle above every panel's title
            assert all(title.get_window_extent(renderer).y0 >= p.y1 - 1 for p in panels)
        for i, a in enumerate(panels):
            for b in panels[i + 1:]:
                assert not a.overlaps(b), (a, b)


@pytest.mark.parametrize("name", ["results.json", "report.md"])
def test_a_full_disk_while_results_json_or_report_md_is_written_leaves_no_torn_file(tmp_path, monkeypatch, name):
    """ENOSPC 100 bytes into results.json (or report.md): the file is absent, never cut short under its own name
    (``Path.write_text`` left 100 bytes of JSON that no reader parses), and no staging file is left."""
    from outlierlab.evaluation.registry import AnalysisResult
    from outlierlab.reports.evaluation_report import write_outputs
    from tests.disk_helpers import fill_disk_for

    rows = [{"layer": i, "transform": "none", "anisotropy": 0.1 * i} for i in range(40)]
    result = AnalysisResult("anisotropy", rows, "## Anisotropy\n\n" + "text " * 200)
    fill_disk_for(monkeypatch, name, left=100)
    with pytest.raises(OSError, match="No space left"):
        write_outputs(tmp_path, [result], {"seed": 0}, "# head")
    assert not (tmp_path / name).exists()
    assert not [p.name for p in tmp_path.iterdir() if "partial" in p.name]


def _geometry_rows(ks, layers=2):
    rows = []
    for layer in range(layers):
        row = {"layer": layer, "transform": "none", "anisotropy": 0.5 + 0.1 * layer}
        row.update({f"top{k}_share": 0.01 * k + 0.1 * layer for k in ks})  # top1 0.01/0.11, top5 0.05/0.15
        rows.append(row)
    return rows


@pytest.mark.parametrize("ks, shown, first", [((1, 5), 5, "0.050"), ((1, 3, 5), 3, "0.030"), ((2,), 2, "0.020"),
                                              ((7, 1, 2), 7, "0.070")])
def test_the_geometry_table_shows_the_share_of_a_k_that_was_computed(ks, shown, first):
    """anisotropy.rogue_k=[1,5] computes no top-3 share: the column was headed "top-3 share" and blank ("–") in every
    row; it is named after the k shown (3 when computed, else the largest), with its values."""
    from outlierlab.evaluation.registry import AnalysisResult
    from outlierlab.reports.evaluation_report import geometry_table, share_k

    assert share_k(ks) == shown
    table = geometry_table([AnalysisResult("anisotropy", _geometry_rows(ks), ""),
                            AnalysisResult("isotropy", [{"layer": 0, "transform": "none", "isoscore": 0.25}], "")])
    lines = table.splitlines()
    header = next(line for line in lines if line.startswith("| layer"))
    assert header == f"| layer | none: anisotropy | none: top-{shown} share | none: IsoScore |"
    assert f"top-{shown} share = the part of it the {shown} dims" in table
    assert lines[-2] == f"| 0 | 0.500 | {first} | 0.250 |"
    assert lines[-1].startswith("| 1 | 0.600 | ") and lines[-1].endswith(" | – |")  # no IsoScore row for layer 1
    assert "top-3" not in table or shown == 3


def test_the_report_of_a_run_with_rogue_k_1_5_names_the_top_5_share(tmp_path):
    """End to end: the anisotropy analysis with rogue_k=[1,5] on a tiny model; report.md's geometry table and the
    anisotropy section both show the top-5 share, and no column of the geometry table is blank."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    import outlierlab as ol
    from probe_fixtures import minilm_path

    tok = AutoTokenizer.from_pretrained(minilm_path())
    model = BertModel(BertConfig(vocab_size=tok.vocab_size, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                 intermediate_size=32, max_position_embeddings=32))
    texts = [f"Sentence number {i} says something about {w}." for i, w in enumerate("abcdefghijkl")]
    tables = ol.evaluate(ol.load_encoder(model, tokenizer=tok), texts, analyses=["anisotropy"], transforms=["none"],
                         settings=[ol.AnisotropySettings(n_sentences=12, rogue_k=[1, 5], rogue_list=2)],
                         out_dir=tmp_path, progress=False)
    rows = tables["anisotropy"]
    assert "top3_share" not in rows.columns and rows["top5_share"].notna().all()
    report = (tmp_path / "report.md").read_text()
    geometry = report.split("## Geometry per layer and transform", 1)[1].split("\n## ", 1)[0]
    assert "| layer | none: anisotropy | none: top-5 share |" in geometry and "–" not in geometry
    first = geometry.split("\n| 0 | ", 1)[1].split(" |\n", 1)[0].split(" | ")
    assert float(first[1]) == pytest.approx(rows.loc[rows["layer"] == 0, "top5_share"].item(), abs=5e-4)
    section = report.split("\n## Anisotropy", 1)[1]
    assert "none: top-5 share" in section and "share of the top 5 dims" in section
