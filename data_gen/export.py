"""Stage 7: the deterministic final merge and export.

    out/dataset/records/<split>/part-*.parquet   SFT records (hivig.records; read with datasets)
    out/dataset/records/manifest.json            the corpus root image paths resolve against
    out/dataset/dataset_info.json                LlamaFactory dataset list (dataset_dir=out/dataset)
    out/dataset/sharegpt/<split>.json            LlamaFactory ShareGPT rows
    out/dataset/sharegpt/images/                 marked screenshots for LlamaFactory
    out/dataset/stats.json                       counters, distributions, rates
    out/dataset/report.html                      the report with sample cards (images: the
                                                 ShareGPT frames, else report_images/)
    out/dataset/exclusions.jsonl                 every dropped item with reason and raw answers

The export reads every shard's final stage output, sorts samples by id and writes the folder in a
temporary location that is renamed into place, so its bytes depend neither on the shard count nor
on crashes and resumes. ShareGPT image paths are relative to the dataset folder (LlamaFactory's
``media_dir``), corpus images included, so copying ``out/`` together with its corpus sibling keeps
them valid.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from data_gen.config import DataGenConfig
from data_gen.executor import StageStats, atomic_write_text, dumps_jsonl, merge_counts, stable_int
from data_gen.ingest import decode_check
from data_gen.report import ImageSizes, dataset_stats, estimated_tokens, pick_cards, render_report
from data_gen.steps._work import Work, messages_from_json, spec_to_record
from hivig.media import ImageRef, mark_to_json
from hivig.records import (
    SPLITS,
    RecordError,
    SFTRecord,
    records_dir,
    to_sharegpt,
    write_manifest,
    write_records,
)
from hivig.vision import canonical_frame, encode_png


def collect_specs(works: list[Work]) -> list[dict[str, Any]]:
    """Every sample of the merged work items, sorted by id."""
    specs: list[dict[str, Any]] = []
    for work in works:
        for unit in work.units:
            if unit.get("history") is not None:
                specs.append(unit["history"])
            specs.extend(unit.get("critique") or [])
    return sorted(specs, key=lambda s: s["id"])


DUPLICATE_BAD_STEP = "duplicate_bad_step"
"""Drop reason of a Bad sample whose screenshot and Bad step an earlier sample already has
(instruction variants of one episode share screenshots, so they can produce the same pair)."""


def duplicate_bad_samples(works: list[Work]) -> dict[str, str]:
    """``{sample id: id of the kept sample}`` for Bad samples repeating (screenshot, Bad step).

    The smallest sample id of each group is kept, so the choice does not depend on sharding.
    """
    first: dict[tuple[str, str, str], str] = {}
    dupes: dict[str, str] = {}
    rows = []
    for work in works:
        for k, unit in enumerate(work.units):
            bad = unit.get("bad")
            for spec in unit.get("critique") or []:
                if bad is not None and spec["labels"]["verdict"] == "Bad":
                    shot = work.trajectory.steps[k].screenshot
                    rows.append((spec["id"], (shot, bad["intent"], bad["text"])))
    for sid, key in sorted(rows):
        if key in first:
            dupes[sid] = first[key]
        else:
            first[key] = sid
    return dupes


class ExportError(RuntimeError):
    """The export cannot stand behind what it wrote: no records, a failed shortcut audit, or a
    target distribution it could not reach. The dataset folder is written for inspection, but
    no completion marker, so a rerun exports (and fails) again."""


CORRUPT_IMAGE = "corrupt_image"
"""Drop reason of a sample whose screenshot passed ingest's header check but does not decode
(a corrupt body, a decompression bomb); the offline annotator never decodes, so export is where
such an image is first opened."""


class ImageCheck:
    """Whether each screenshot decodes fully, decided once per path."""

    def __init__(self, corpus: Path) -> None:
        self.corpus = corpus
        self._seen: dict[str, str | None] = {}

    def problem(self, path: str) -> str | None:
        """Why the screenshot cannot be decoded, or ``None``."""
        if path not in self._seen:
            got = decode_check(self.corpus / path)
            self._seen[path] = got[1] if isinstance(got[0], str) else None  # type: ignore[assignment]
        return self._seen[path]


def _undecodable(spec: dict[str, Any], check: ImageCheck) -> str | None:
    for message in spec["messages"]:
        for part in message["content"]:
            if "image" in part and (why := check.problem(part["image"])) is not None:
                return f"{part['image']}: {why}"
    return None


def _json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, ensure_ascii=False, indent=1) + "\n"


def _sharegpt(
    records: list[SFTRecord], cfg: DataGenConfig, corpus: Path, tmp: Path
) -> dict[str, list[str]]:
    """Write the ShareGPT export; returns each record's image paths (relative to the dataset)."""
    folder = tmp / "sharegpt"
    folder.mkdir(parents=True, exist_ok=True)
    info: dict[str, Any] = {}
    images: dict[str, list[str]] = {}
    for split in SPLITS:
        chosen = [r for r in records if r.split == split]
        rows = to_sharegpt(
            chosen,
            corpus,
            folder / "images",
            min_pixels=cfg.frame.min_pixels,
            max_pixels=cfg.frame.max_pixels,
            factor=cfg.frame.factor,
        )
        for record, row in zip(chosen, rows, strict=True):
            # Relative to the dataset folder; tmp is renamed to it, at the same depth.
            row["images"] = [os.path.relpath(p, tmp) for p in row["images"]]
            images[record.id] = row["images"]
        atomic_write_text(folder / f"{split}.json", json.dumps(rows, ensure_ascii=False, indent=1))
        info[f"hivig_{split}"] = {
            "file_name": f"sharegpt/{split}.json",
            "formatting": "sharegpt",
            "columns": {"messages": "conversations", "system": "system", "images": "images"},
            "tags": {
                "role_tag": "from",
                "content_tag": "value",
                "user_tag": "human",
                "assistant_tag": "gpt",
            },
        }
    # LlamaFactory resolves `file_name` and (media_dir defaulting to dataset_dir) the image paths
    # against the folder holding dataset_info.json: the dataset folder, like the paths above.
    atomic_write_text(tmp / "dataset_info.json", _json(info))
    return images


def _cards(
    specs: list[dict[str, Any]],
    cfg: DataGenConfig,
    corpus: Path,
    tmp: Path,
    exported: dict[str, list[str]],
) -> list[tuple[dict[str, Any], list[str]]]:
    """Report cards with their images.

    A card whose sample is in the ShareGPT export links the frames written there (the same
    canonical frame with the same marks; rendering and encoding it again doubled the cost of
    those images). Otherwise each distinct (screenshot, marks, size class) is rendered once.
    """
    picked = pick_cards(specs, cfg.export.report_cards, lambda i: stable_int(cfg.seed, i, "card"))
    folder = tmp / "report_images"
    folder.mkdir(parents=True, exist_ok=True)
    rendered: dict[str, str] = {}
    out = []
    for spec in picked:
        if spec["id"] in exported:
            out.append((spec, list(exported[spec["id"]])))
            continue
        links = []
        for message in messages_from_json(spec["messages"]):
            for ref in message.images():
                key = json.dumps(
                    [ref.path, [mark_to_json(m) for m in ref.marks], ref.size_class],
                    sort_keys=True,
                )
                if key not in rendered:
                    rendered[key] = _render_card_image(ref, cfg, corpus, folder)
                links.append(rendered[key])
        out.append((spec, links))
    return out


def _render_card_image(ref: ImageRef, cfg: DataGenConfig, corpus: Path, folder: Path) -> str:
    frame = canonical_frame(
        corpus / ref.path,
        min_pixels=cfg.frame.min_pixels,
        max_pixels=cfg.frame.max_pixels,
        factor=cfg.frame.factor,
        marks=ref.marks,
        size_class=ref.size_class,
    )
    data = encode_png(frame)
    name = f"{hashlib.sha256(data).hexdigest()[:20]}.png"
    (folder / name).write_bytes(data)
    return f"report_images/{name}"


def export_dataset(
    cfg: DataGenConfig,
    works: list[Work],
    counters: dict[str, dict[str, int]],
    exclusions: list[dict[str, Any]],
    run: dict[str, Any],
) -> dict[str, Any]:
    """Write ``out/dataset`` from the merged work items; returns the stats.

    Args:
        cfg: The run config.
        works: Final stage output of every shard.
        counters: Per-stage counters merged over shards.
        exclusions: Merged exclusion rows of all stages.
        run: Run description recorded in the stats (annotator, configured rates).
    """
    corpus, out = Path(cfg.corpus).resolve(), Path(cfg.out)
    dest, tmp = out / "dataset", out / ".dataset.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    stats = StageStats("export")
    sizes, f, limit = ImageSizes(corpus), cfg.frame, cfg.export.max_tokens
    specs, records, tokens = [], [], {}
    dupes = duplicate_bad_samples(works)
    decodes = ImageCheck(corpus)
    for spec in collect_specs(works):
        stats.seen()
        if spec["id"] in dupes:
            stats.drop(spec["id"], DUPLICATE_BAD_STEP, f"same as {dupes[spec['id']]}")
            continue
        broken = _undecodable(spec, decodes)
        if broken is not None:
            stats.drop(spec["id"], CORRUPT_IMAGE, broken)
            continue
        n = estimated_tokens(spec, sizes, f.min_pixels, f.max_pixels, f.factor)
        if limit and n > limit:
            stats.drop(spec["id"], "too_long", f"about {n} tokens > export.max_tokens={limit}")
            continue
        try:
            records.append(spec_to_record(spec))
        except RecordError as e:
            stats.drop(spec["id"], "record_invalid", str(e))
            continue
        specs.append(spec)
        tokens[spec["id"]] = n
        stats.kept()
    stats.check()
    for split in SPLITS:
        write_records([r for r in records if r.split == split], tmp / "records" / split)
    # Training reads the corpus root from here (records hold corpus-relative image paths).
    write_manifest(tmp / "records", corpus, final_root=records_dir(out))
    exported = _sharegpt(records, cfg, corpus, tmp) if cfg.export.sharegpt else {}
    all_counters = {**counters, "export": merge_counts([stats.counts])}
    atomic_write_text(tmp / "exclusions.jsonl", dumps_jsonl(exclusions + stats.exclusions))
    result = dataset_stats(specs, all_counters, tokens, run)
    atomic_write_text(tmp / "stats.json", _json(result))
    atomic_write_text(
        tmp / "report.html", render_report(result, _cards(specs, cfg, corpus, tmp, exported))
    )
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(tmp, dest)
    if not records:
        raise ExportError(
            f"the run produced no records (every sample was dropped; see {dest / 'stats.json'} "
            "and exclusions.jsonl for the reasons)"
        )
    return result
