"""Write generated episodes as a corpus in the exact ScaleCUA-Data layout.

Layout (relative to the output folder)::

    meta.json                                   one entry per annotation file
    annotations/data_<date>_<platform>_<family>_<anno>[_boost_instruction].jsonl
    data/data_<date>/<platform>/images/<source folder>/images/<screenshot>.png
    elements.jsonl                              sidecar: element boxes per screenshot (not in
                                                the real data; used by tests and generators
                                                that have an equivalent real source)

A share of the navigation and planning_cot episodes (``copies``) is also written to the other
family's file of the same platform, as the real data repeats episodes across files;
ingest keeps one copy of each.

An existing output folder must be empty or hold a corpus this module wrote (``meta.json`` and
``elements.jsonl``); the generated paths of the old corpus (``meta.json``, ``elements.jsonl``,
``annotations/``, ``data/``) are removed first, so no stale screenshot or annotation file of an
earlier, larger corpus survives. Anything else in the folder makes ``make_sample`` refuse.

Every value (dates, clock times, folder names) derives from the seed, PNGs use fixed encoder
settings, and JSON is written with sorted-free but fixed key order, so the same seed gives a
byte-identical corpus.
"""

from __future__ import annotations

import io
import json
import os
import random
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from data_gen.sample_corpus.scenarios import SCENARIOS, Ctx, Episode
from hivig.actions import PLATFORMS
from hivig.files import write_atomic

# Families per platform file: navigation (direct action), planning_cot (reasoned action, with
# <think>) and planning_cot_boost_instruction (several instruction variants, step-major).
FAMILIES = ("navigation", "planning_cot", "planning_cot_boost_instruction")
BATCH_DATES = ("20250612", "20250616", "20250623", "20250630", "20250707")
ANNOTATION_DATE = "20250720"
PROMPT_HEAD = (
    "Please generate the next move according to the UI screenshot, task and previous operations."
)
CONV_PLATFORM = {
    "windows": "windows",
    "mac": "macos",
    "ubuntu": "ubuntu",
    "web": "web",
    "android": "mobile",
}
# PNG encoder settings are fixed so the bytes depend only on the pixels.
PNG_COMPRESS_LEVEL = 1


@dataclass(frozen=True)
class SampleConfig:
    """What ``make_sample`` generates."""

    trajectories: int = 60
    """Number of episodes; boost-instruction files add variants on top of these."""
    seed: int = 0
    """Every random choice, date and clock time derives from it."""
    platforms: tuple[str, ...] = PLATFORMS
    """Platforms to cycle through (windows, mac, ubuntu, web, android)."""
    desktop_size: tuple[int, int] = (1280, 720)
    """Desktop screenshot width, height in pixels."""
    web_size: tuple[int, int] = (1280, 800)
    """Browser screenshot width, height in pixels."""
    phone_size: tuple[int, int] = (540, 1200)
    """Phone screenshot width, height in pixels."""
    boost_variants: int = 3
    """Instruction variants per episode in boost-instruction files (capped by the scenario)."""
    copies: float = 0.15
    """Share of navigation/planning_cot episodes also written to the other family's file."""

    def __post_init__(self) -> None:
        if self.trajectories < 0:
            raise ValueError("`trajectories` must be >= 0")
        unknown = set(self.platforms) - set(PLATFORMS)
        if unknown or not self.platforms:
            raise ValueError(f"`platforms` must be a non-empty subset of {PLATFORMS}")
        if self.boost_variants < 1:
            raise ValueError("`boost_variants` must be >= 1")
        if not 0 <= self.copies <= 1:
            raise ValueError("`copies` must be in [0, 1]")

    def size(self, platform: str) -> tuple[int, int]:
        """Screenshot size for ``platform``."""
        if platform == "web":
            return self.web_size
        if platform == "android":
            return self.phone_size
        return self.desktop_size


@dataclass
class GeneratedEpisode:
    """What the generator wrote for one episode (the ground truth tests compare against)."""

    meta_key: str
    annotation: str
    platform: str
    scenario: str
    source_folder: str
    instructions: list[str]
    screenshots: list[str]
    """Corpus-relative screenshot paths, in step order."""
    raw_actions: list[str]
    outcome: str
    copy_annotation: str | None = None
    """Annotation file holding a cross-file copy of the episode (the other family), if any."""
    copy_lines: int = 0


@dataclass
class SampleCorpus:
    """Summary of a generated corpus."""

    root: Path
    episodes: list[GeneratedEpisode] = field(default_factory=list)
    lines: int = 0
    images: int = 0
    copies: int = 0
    """Episodes written to a second file (their lines are counted in ``lines``)."""

    @property
    def trajectories(self) -> int:
        """Trajectories an ingest must recover: one per instruction variant."""
        return sum(len(e.instructions) for e in self.episodes)


# ------------------------------------------------------------------------ naming


def _source_folder(ep: Episode, rng: random.Random, date: str, n: int) -> str:
    """A source folder in the style the real data uses on each platform."""
    if ep.platform == "android":
        return f"android_lab_data_{ep.app}/{ep.app.lower()}_{n}"
    if ep.platform == "web":
        return f"{ep.app.lower()}/task_{n:05d}"
    if ep.platform == "ubuntu":
        return f"files/files_{rng.getrandbits(64):016x}"
    stamp = f"{rng.randint(8, 19):02d}{rng.randint(0, 59):02d}{rng.randint(0, 59):02d}"
    return f"{ep.scenario}/free_task_{date}_{stamp}_{n}"


def _screenshot_names(platform: str, date: str, n: int, rng: random.Random) -> list[str]:
    """Screenshot file names in each platform's style; their time stamps grow with the step."""
    if platform == "android":
        t0 = 1749700000000 + rng.randint(0, 10**8)
        return [f"{k + 1:03d}_{t0 + 4000 * k}.png" for k in range(n)]
    if platform in ("windows", "mac"):
        t0 = rng.randint(8 * 3600, 18 * 3600)
        stamps = [t0 + 5 * k for k in range(n)]
        return [
            f"{date}_{t // 3600:02d}{t // 60 % 60:02d}{t % 60:02d}_{k + 1}.png"
            for k, t in enumerate(stamps)
        ]
    return [f"step_{k}.png" for k in range(n)]


# ------------------------------------------------------------------------ records


def human_value(task: str, history: list[str], quoted: bool) -> str:
    """The user turn of a step record (training wording)."""
    if history:
        fmt = '"{}"' if quoted else "{}"
        prev = "\n".join(f"Step {i}: {fmt.format(op)}" for i, op in enumerate(history, 1))
    else:
        prev = "None"
    return f"<image>\n{PROMPT_HEAD}\n\nTask: {task}\n\nPrevious operations:\n{prev}"


def gpt_value(think: str | None, operation: str, calls: list[str]) -> str:
    """The assistant turn: optional <think>, then <operation> and one call per <action> line."""
    head = f"<think>\n{think}\n</think>\n" if think is not None else ""
    return (
        f"{head}<operation>\n{operation}\n</operation>\n<action>\n"
        + "\n".join(calls)
        + "\n</action>"
    )


def _record(image: str, human: str, gpt: str, size: tuple[int, int]) -> str:
    obj = {
        "image": image,
        "conversations": [{"from": "human", "value": human}, {"from": "gpt", "value": gpt}],
        "width": size[0],
        "height": size[1],
    }
    return json.dumps(obj, ensure_ascii=False)


def episode_lines(
    ep: Episode, images: list[str], family: str, variants: int, quoted: bool
) -> Iterator[str]:
    """The JSONL lines of one episode; boost files interleave variants step-major."""
    tasks = ep.instructions[:variants]
    think = family.startswith("planning_cot")
    for k, st in enumerate(ep.steps):
        history = [s.operation for s in ep.steps[:k]]
        gpt = gpt_value(st.think if think else None, st.operation, st.calls)
        for task in tasks:
            yield _record(images[k], human_value(task, history, quoted), gpt, st.screen.image.size)


# ------------------------------------------------------------------------ writing


def _png_bytes(image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG", compress_level=PNG_COMPRESS_LEVEL, optimize=False)
    return buf.getvalue()


GENERATED = ("meta.json", "elements.jsonl", "annotations", "data")
"""Paths of a corpus that ``make_sample`` writes (and removes before writing a new one)."""


def _prepare(root: Path) -> None:
    """Empty ``root`` of an earlier generated corpus; refuse a folder holding anything else."""
    if root.exists() and not root.is_dir():
        raise ValueError(f"{root} exists and is not a folder")
    if not root.exists() or not any(root.iterdir()):
        return
    names = {p.name for p in root.iterdir()}
    if not {"meta.json", "elements.jsonl"} <= names or names - set(GENERATED):
        raise ValueError(
            f"{root} is neither empty nor a corpus written by make-sample "
            f"(unexpected: {sorted(names - set(GENERATED))[:5] or 'no elements.jsonl'})"
        )
    for name in GENERATED:
        path = root / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()


def _copy_family(cfg: SampleConfig, i: int, family: str) -> str | None:
    """The family a cross-file copy of episode ``i`` goes to, if it gets one."""
    if family.endswith("boost_instruction"):
        return None
    # Own stream, so the share changes which episodes are copied but never their content.
    if random.Random(f"copy:{cfg.seed}:{i}").random() >= cfg.copies:
        return None
    return "planning_cot" if family == "navigation" else "navigation"


def _plan(cfg: SampleConfig) -> list[tuple[int, str, str]]:
    """(episode index, platform, family) for every episode, from the seed alone."""
    rng = random.Random(f"plan:{cfg.seed}")
    out = []
    for i in range(cfg.trajectories):
        platform = cfg.platforms[i % len(cfg.platforms)]
        family = FAMILIES[rng.randrange(len(FAMILIES))]
        out.append((i, platform, family))
    return out


def make_sample(out: str | os.PathLike, cfg: SampleConfig, progress: bool = True) -> SampleCorpus:
    """Generate a ScaleCUA-format corpus under ``out``; same config ⇒ byte-identical files.

    Args:
        out: Output folder: created, or empty, or an earlier generated corpus (replaced).
        cfg: What to generate.
        progress: Show a tqdm bar on stderr.

    Returns:
        The summary, including the ground truth per episode.

    Raises:
        ValueError: ``out`` holds files that ``make_sample`` did not write.
    """
    root = Path(out)
    _prepare(root)
    dates = random.Random(f"dates:{cfg.seed}")
    batch = {p: dates.choice(BATCH_DATES) for p in PLATFORMS}
    files: dict[tuple[str, str], list[str]] = {}
    sidecar: list[str] = []
    corpus = SampleCorpus(root)
    for i, platform, family in tqdm(
        _plan(cfg), desc="make-sample", unit="traj", disable=not progress
    ):
        rng = random.Random(f"episode:{cfg.seed}:{i}")
        ctx = Ctx(rng, platform, cfg.size(platform), start_minute=rng.randrange(24 * 60))
        # Scenarios rotate per platform so even a small corpus covers every action family.
        options = SCENARIOS[platform]
        scenario = options[(i // len(cfg.platforms)) % len(options)]
        ep = scenario(ctx)
        date = batch[platform]
        image_root = f"data/data_{date}/{platform}/images"
        folder = _source_folder(ep, rng, date, i)
        images = [
            f"{folder}/images/{name}"
            for name in _screenshot_names(platform, date, len(ep.steps), rng)
        ]
        for k, st in enumerate(ep.steps):
            write_atomic(root / image_root / images[k], _png_bytes(st.screen.image), durable=False)
            sidecar.append(
                json.dumps(
                    {
                        "screenshot": f"{image_root}/{images[k]}",
                        "width": st.screen.width,
                        "height": st.screen.height,
                        "elements": st.screen.grid_elements(),
                        "targets": st.targets,
                    },
                    ensure_ascii=False,
                )
            )
        variants = cfg.boost_variants if family.endswith("boost_instruction") else 1
        # Planning files quote history lines (as the published example does); navigation files not.
        lines = list(episode_lines(ep, images, family, variants, quoted=family != "navigation"))
        files.setdefault((platform, family), []).extend(lines)
        corpus.lines += len(lines)
        corpus.images += len(images)
        key, anno = _names(platform, family, date)
        copy_family, copy_anno, copy_lines = _copy_family(cfg, i, family), None, []
        if copy_family is not None:
            copy_lines = list(
                episode_lines(ep, images, copy_family, 1, quoted=copy_family != "navigation")
            )
            files.setdefault((platform, copy_family), []).extend(copy_lines)
            corpus.lines += len(copy_lines)
            corpus.copies += 1
            copy_anno = _names(platform, copy_family, date)[1]
        corpus.episodes.append(
            GeneratedEpisode(
                key,
                anno,
                platform,
                ep.scenario,
                folder,
                ep.instructions[:variants],
                [f"{image_root}/{p}" for p in images],
                ["\n".join(s.calls) for s in ep.steps],
                ep.outcome,
                copy_anno,
                len(copy_lines),
            )
        )
    meta = {}
    for (platform, family), lines in sorted(files.items()):
        key, anno = _names(platform, family, batch[platform])
        write_atomic(root / anno, ("\n".join(lines) + "\n").encode("utf-8"), durable=False)
        meta[key] = _meta_entry(platform, family, batch[platform], anno)
    write_atomic(
        root / "elements.jsonl", ("\n".join(sidecar) + "\n").encode("utf-8"), durable=False
    )
    write_atomic(
        root / "meta.json", (json.dumps(meta, indent=2) + "\n").encode("utf-8"), durable=False
    )
    return corpus


def _names(platform: str, family: str, date: str) -> tuple[str, str]:
    """(meta.json key, annotation path) in the published naming scheme."""
    boost = family.endswith("boost_instruction")
    base = "planning" if family.startswith("planning") else "navigation"
    anno = f"annotations/data_{date}_{platform}_{base}_{ANNOTATION_DATE}"
    anno += "_boost_instruction.jsonl" if boost else ".jsonl"
    return f"internal_{platform}_{family}_{date}", anno


def _meta_entry(platform: str, family: str, date: str, anno: str) -> dict:
    style = "planning_cot" if family.startswith("planning") else "navigation"
    return {
        "root": f"data/data_{date}/{platform}/images",
        "annotation": anno,
        "conv_style": f"internvl2_5_{CONV_PLATFORM[platform]}_{style}_v1",
        "repeat_time": 1,
        "split_anno_by_rank": True,
        "data_augment": False,
        "language": "en",
        "task": f"{platform}_{style}",
    }
