"""``make demo`` end to end at a small size: every page the index links exists and is non-empty,
and the flywheel section shows samples made from the demo's own episode.

The same commands as the Makefile's ``demo`` target (a smaller corpus and one training step),
each as its own process, then the links of ``index.html`` and ``episode.html`` are followed and
the index is opened in headless Chromium (when installed) to check its images load.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from serve.demo.flywheel import write_run_folder
from serve.webenv import find_browser

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> str:
    proc = subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def _links(page: Path) -> list[Path]:
    targets = re.findall(r"""(?:href|src)=['"]([^'"#]+)['"]""", page.read_text())
    return [(page.parent / t).resolve() for t in targets if not t.startswith(("http", "data:"))]


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    """The demo's folder after the Makefile's commands: sample, data_gen, train, serve.demo."""
    demo = tmp_path_factory.mktemp("demo") / "demo_out"
    _run("-m", "data_gen", "make-sample", "--out", str(demo / "corpus"),
         "--trajectories", "12", "--seed", "0")  # fmt: skip
    _run("-m", "data_gen", "run", "--config", "configs/data_gen/demo.yaml",
         f"corpus={demo / 'corpus'}", f"out={demo / 'data'}")  # fmt: skip
    train_out = _run(
        "-m", "train", "--config", "configs/train/tiny_cpu.yaml", f"data={demo / 'data'}",
        f"out={demo / 'train'}", "dataset.max_samples=8", "optim.global_batch_samples=4",
        "loop.max_steps=2",
    )  # fmt: skip
    assert "loss" in train_out  # a loss line per step on stdout
    out = _run("-m", "serve.demo", "--data", str(demo / "data"), "--train", str(demo / "train"),
               "--out", str(demo))  # fmt: skip
    assert "open " in out and "index.html" in out
    return demo


@pytest.mark.slow
def test_demo_pages_and_everything_they_link(demo):
    index = demo / "index.html"
    links = _links(index)
    assert len(links) >= 4
    for path in links:
        assert path.is_file() and path.stat().st_size > 0, path
    episode = demo / "episode.html"
    assert episode in links
    shots = _links(episode)
    assert any(p.suffix == ".png" for p in shots)
    for path in shots:
        assert path.is_file() and path.stat().st_size > 0, path
    assert "R3 trigger" in episode.read_text()  # the no-effect repeat was caught
    assert "carries no meaning" in index.read_text()


@pytest.mark.slow
def test_the_demo_shows_the_scripted_critic_run_beside_the_random_model(demo):
    # Beside the random model's abstentions, the labelled scripted-critic run with its Bad.
    scripted = demo / "episode_scripted.html"
    assert scripted in _links(demo / "index.html")
    assert "<span class='tag bad'>" in scripted.read_text()
    assert "re-proposal after the Bad verdict" in scripted.read_text()


@pytest.mark.slow
def test_the_demo_episode_comes_back_as_training_data_in_the_flywheel_section(demo):
    # 5/5: the episode's trace back through ingest-runs and data_gen, shown on the index.
    index, fw = demo / "index.html", demo / "flywheel"
    _run("-m", "data_gen", "ingest-runs", "--format", "trace", "--root", str(fw / "state"),
         "--out", str(fw / "runs"))  # fmt: skip
    _run("-m", "data_gen", "run", "--config", "configs/data_gen/demo_flywheel.yaml",
         f"corpus={fw / 'runs'}", f"runs.corpus={fw / 'runs'}", f"out={fw / 'data'}")  # fmt: skip
    out = _run("-m", "serve.demo", "flywheel", "--runs", str(fw / "runs"), "--data",
               str(fw / "data"), "--out", str(demo))  # fmt: skip
    assert "flywheel section with" in out
    (side,) = [json.loads(p.read_text()) for p in (fw / "runs" / "episodes").rglob("*.json")]
    assert side["outcome"] == "success"  # the environment's score, reported on the close event
    html = index.read_text()
    assert "5. The flywheel: this episode as training data" in html
    section = html.split("5. The flywheel", 1)[1]
    cards = re.findall(r"<img src='(flywheel/cards/[^']+)'[^>]*data-marks='(\d+)'", section)
    assert cards, "no sample cards in the flywheel section"
    assert "source <b>run</b>" in section and "benchmark <b>gateway_trace</b>" in section
    marked = [src for src, n in cards if int(n) > 0]
    assert marked, "no sample with a marked screenshot"
    for path in _links(index):
        assert path.is_file() and path.stat().st_size > 0, path
    if find_browser() is not None:
        sizes = _image_sizes(index)
        assert all(sizes[src] > 0 for src in marked), sizes


def _image_sizes(page: Path) -> dict[str, int]:
    """``src -> naturalWidth`` of every image, as headless Chromium loads the page."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=find_browser(), headless=True)
        try:
            tab = browser.new_page()
            tab.goto(page.resolve().as_uri())
            tab.wait_for_load_state("load")
            got = tab.evaluate(
                "Array.from(document.images).map(i => [i.getAttribute('src'), i.naturalWidth])"
            )
        finally:
            browser.close()
    return dict(got)


def test_run_folder_carries_the_runners_outcome_and_ingest_runs_reads_it(tmp_path):
    from data_gen.runs import ingest_runs
    from serve.diagnose.synthetic import make_case, write_trace

    state = tmp_path / "state"
    trace = write_trace(make_case(3, "wrong_element"), state)
    before = trace.read_bytes()
    folder = tmp_path / "run"
    copy = write_run_folder(trace, state, folder, "success")
    assert trace.read_bytes() == before  # the gateway's own trace is left as written
    last = json.loads(copy.read_text().splitlines()[-1])
    assert last["event"] == "close" and last["outcome"] == "success"
    refs = {p.name for p in (state / "images").glob("*.png")}
    assert refs and {p.name for p in (folder / "images").glob("*.png")} <= refs
    stats = ingest_runs("trace", folder, tmp_path / "runs")
    assert stats["outcomes"] == {"success": 1} and stats["kept"] >= 2, stats
    # Without the runner's report the same trace's outcome is unknown (data_gen leaves it out).
    stats = ingest_runs("trace", state, tmp_path / "runs_plain")
    assert "success" not in stats["outcomes"], stats
    with pytest.raises(ValueError, match="outcome"):
        write_run_folder(trace, state, folder, "unknown")


def test_the_scripted_critic_run_shows_a_bad_verdict_and_its_reproposal(tmp_path):
    # The random model abstains at every step; the demo's second run, judged by a labelled
    # scripted rule, shows the path a trained critic drives: Bad, explanation, re-proposal.
    import argparse

    from serve.demo.__main__ import _scripted_run

    page, fact = _scripted_run(argparse.Namespace(env="synthetic"), tmp_path, "a drawn desk")
    html = page.read_text()
    assert page.name == "episode_scripted.html"
    assert "Scripted critic: a fixed rule, not a model." in html
    assert "<span class='tag bad'>bad" in html and "Procedural Prerequisite Neglect" in html
    assert "re-proposal after the Bad verdict" in html
    assert "rejected → accepted" in html  # the guard log: the re-proposal ran
    assert "R3 trigger" in html  # the no-effect repeat is still the recurrence detector's
    assert "1 proposal(s) rejected and re-proposed" in fact and "task done" in fact
    for path in _links(page):
        if path.name != "index.html" and path.name != "episode.html":
            assert path.is_file() and path.stat().st_size > 0, path


def test_the_index_says_what_the_served_critic_answered():
    from serve.demo.__main__ import _verdict_counts

    log = [
        {"proposals": [{"verdict": {"verdict": "abstain"}}, {"verdict": None}]},
        {"proposals": [{"verdict": {"verdict": "abstain"}}]},
    ]
    assert _verdict_counts(log) == "2 abstain, 1 none"
    assert _verdict_counts([]) == "none"


def test_the_scripted_critics_summary_claims_nothing_about_the_screen():
    from serve.demo.scripted import _SUMMARY

    assert "scripted" in _SUMMARY and "updated" not in _SUMMARY
