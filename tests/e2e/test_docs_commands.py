"""What the docs and help texts promise, checked against the code: the README's marking example
runs on files the repository ships, each tool's --help example is a key of that tool's config,
the data report has plots and folding sections, the training curve has a legend, and the
LlamaFactory registrations that docs/data.md describes find every image."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from data_gen.config import DataGenConfig
from data_gen.run import parse_args, run
from data_gen.sample_corpus import SampleConfig, make_sample
from hivig.config import load_config
from hivig.taxonomy import DIMENSIONS
from serve.config import ServeConfig

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "configs" / "data_gen" / "demo.yaml"


def _fenced_blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


# --------------------------------------------------------------------------------------------
# README


def test_readme_mark_example_runs_on_shipped_files(tmp_path):
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Command-line tools", 1)[1]
    lines = [
        line
        for line in _fenced_blocks(section, "bash")[0].splitlines()
        if line.startswith(("hivig action", "hivig mark"))
    ]
    assert [line.split()[1] for line in lines] == ["action", "mark"]
    # In a fresh folder holding only the repository's docs/: what the commands read is shipped,
    # or written by the command before.
    (tmp_path / "docs").symlink_to(ROOT / "docs")
    code = "import sys; from hivig.cli import main; sys.exit(main(sys.argv[1:]))"
    entry = f"{sys.executable} -c '{code}'"
    script = f'hivig() {{ {entry} "$@"; }}\nset -e\n' + "\n".join(lines)
    done = subprocess.run(
        ["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "2 marker(s)" in done.stdout  # the drag's arrow and the pointer's move
    assert (tmp_path / "marked.png").stat().st_size > 0


# --------------------------------------------------------------------------------------------
# --help examples


def _overrides(text: str) -> list[str]:
    """Every ``dotted.key=value`` a help text shows."""
    return re.findall(r"\b([a-z_]+(?:\.[a-z_0-9]+)+=[\w.-]*\w)", text)


def test_help_examples_are_keys_of_each_tools_config(capsys):
    from serve.__main__ import _parser

    serve_help = _parser().format_help()
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    data_gen_help = capsys.readouterr().out
    for schema, text in ((ServeConfig, serve_help), (DataGenConfig, data_gen_help)):
        examples = _overrides(text)
        assert examples, text
        for override in examples:
            load_config(schema, None, [override])  # a key of another config raises ConfigError


# --------------------------------------------------------------------------------------------
# A small data_gen run: the report and the LlamaFactory export


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("docs_run")
    make_sample(root / "corpus", SampleConfig(trajectories=8, seed=3), progress=False)
    out = root / "out"
    cfg = load_config(DataGenConfig, DEMO, [f"corpus={root / 'corpus'}", f"out={out}"])
    stats = run(cfg, None)
    return out, stats


def _svgs(page: str) -> list[ET.Element]:
    return [ET.fromstring(s) for s in re.findall(r"<svg.*?</svg>", page, flags=re.S)]


def _texts(svg: ET.Element) -> list[str]:
    return [t.text or "" for t in svg.iter("{http://www.w3.org/2000/svg}text")]


def test_report_has_plots_and_folding_sections(small_run):
    out, stats = small_run
    page = (out / "dataset" / "report.html").read_text(encoding="utf-8")
    # Every contents entry leads to a section that folds under its heading.
    links = re.findall(r"<li><a href='#(\w+)'>", page)
    assert len(links) >= 6
    for key in links:
        assert f"<section id='{key}'><details open><summary><h2>" in page, key
    # Plots: well-formed SVG, the dimension plot's bars carrying the exported totals.
    svgs = _svgs(page)
    assert len(svgs) >= 4
    dims = next(s for s in svgs if DIMENSIONS[0].name in _texts(s))
    texts = _texts(dims)
    platforms = sorted({p for row in stats["dimension_by_platform"].values() for p in row})
    assert set(platforms) <= set(texts)  # the legend names every platform
    for name, total in stats["dimension_totals"].items():
        i = texts.index(name)
        assert texts[i + 1] == str(total), name
    stages = next(s for s in svgs if "rationale" in _texts(s))
    kept = stats["stages"]["rationale"]["kept"]
    dropped = sum(v for k, v in stats["stages"]["rationale"].items() if k.startswith("dropped_"))
    assert str(kept + dropped) in _texts(stages)
    # Cards fold their prompt and target away (open, each is a page of text).
    cards = page.count("<div class='card'>")
    assert cards > 0
    assert page.count("<details><summary>Prompt (user turn)</summary>") == cards
    assert page.count("<details><summary>Target</summary>") == cards


def _lf_images(dataset_dir: Path, names: list[str], media_dir: Path | None, cwd: Path):
    """The image files LlamaFactory (0.9.5) opens for ``names``: ``parser.get_dataset_list``
    reads ``dataset_dir/dataset_info.json``, ``loader`` opens ``os.path.join(dataset_dir,
    file_name)``, and ``converter._find_medias`` takes ``os.path.join(media_dir, path)`` when
    that is a file, else the path as written (relative to the working directory). ``media_dir``
    defaults to ``dataset_dir``."""
    media_dir = media_dir or dataset_dir
    info = json.loads((dataset_dir / "dataset_info.json").read_text())
    found = []
    for name in names:
        entry = info[name]
        rows = json.loads(Path(os.path.join(dataset_dir, entry["file_name"])).read_text())
        for row in rows:
            for image in row[entry["columns"]["images"]]:
                joined = Path(os.path.join(media_dir, image))
                found.append(joined if joined.is_file() else cwd / image)
    return found


def test_llamafactory_export_as_its_own_dataset_dir(small_run, tmp_path):
    out, _ = small_run
    images = _lf_images(out / "dataset", ["hivig_train", "hivig_val"], None, tmp_path)
    assert images and all(p.is_file() for p in images)


def test_llamafactory_registration_next_to_the_authors_data(small_run, tmp_path):
    """docs/data.md's second way, as written there: the entry with an absolute file_name in
    LlamaFactory's data/dataset_info.json, next to an authors'-style dataset (absolute image
    paths), and media_dir pointing at the export."""
    out, _ = small_run
    doc = (ROOT / "docs" / "data.md").read_text()
    section = doc.split("### Training on the export with LlamaFactory", 1)[1].split("\n## ", 1)[0]
    placeholder, real = "/path/to/OUT", str(out)
    entry = json.loads(_fenced_blocks(section, "json")[0].replace(placeholder, real))
    yaml_lines = _fenced_blocks(section, "yaml")[0].replace(placeholder, real).splitlines()
    settings = dict(line.split(": ", 1) for line in yaml_lines if ": " in line)
    # The documented entry is the export's own, but for its absolute file name.
    exported = json.loads((out / "dataset" / "dataset_info.json").read_text())["hivig_train"]
    assert {**entry["hivig_train"], "file_name": exported["file_name"]} == exported
    assert "hivig_train" in settings["dataset"].split(",")

    lf = tmp_path / "LlamaFactory"
    (lf / "data").mkdir(parents=True)
    shot = tmp_path / "authors" / "marked_0.png"  # the authors' preprocessing: absolute paths
    shot.parent.mkdir()
    shot.write_bytes((ROOT / "docs" / "demo_flywheel.png").read_bytes())
    row = {"conversations": [], "system": "", "images": [str(shot)]}
    (lf / "data" / "authors.json").write_text(json.dumps([row]))
    authors = {**exported, "file_name": "authors.json"}
    info = {"qwen_gui_critic_train": authors, **entry}
    (lf / "data" / "dataset_info.json").write_text(json.dumps(info))
    names = ["qwen_gui_critic_train", "hivig_train"]

    media = Path(settings["media_dir"])
    images = _lf_images(lf / "data", names, media, lf)
    assert len(images) > 1 and all(p.is_file() for p in images)
    # Negative control: left at its default (data/), media_dir finds only the authors' image.
    default = _lf_images(lf / "data", names, None, lf)
    assert [p for p in default if p.is_file()] == [shot]


# --------------------------------------------------------------------------------------------
# The demo's training curve


def test_training_curve_has_a_legend_for_both_lines(tmp_path):
    from serve.demo.pages import curve_figure, training_curve

    rows = [
        {"step": 1, "loss": 11.95, "lr": 0.001, "grad_norm": 1.62},
        {"step": 2, "loss": 11.82, "lr": 0.000775, "grad_norm": 1.29},
        {"step": 3, "loss": 11.74, "lr": 0.000325, "grad_norm": 1.13},
    ]
    fig = curve_figure(rows)
    legend = fig.axes[0].get_legend()
    assert legend is not None
    assert [t.get_text() for t in legend.get_texts()] == ["train loss", "lr"]
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = training_curve(metrics, tmp_path / "curve.png")
    assert summary["steps"] == 3 and (tmp_path / "curve.png").stat().st_size > 0
