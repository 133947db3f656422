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
    out/dataset/provenance.jsonl                 per record: source (run / scalecua), benchmark,
                                                 task id, hard_case tag

The export reads every shard's final stage output, sorts samples by id and writes the folder in a
temporary location that is renamed into place, so its bytes depend neither on the shard count nor
on crashes and resumes. ShareGPT image paths are relative to the dataset folder (LlamaFactory's
``media_dir``), corpus images included, so copying ``out/`` together with its corpus sibling keeps
them valid. Registered in another ``dataset_info.json`` (LlamaFactory's own ``data/``), the
training YAML sets ``media_dir`` to this folder: docs/data.md shows both registrations.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from data_gen.audit import AuditSettings, ShortcutAuditError, check_audit, shortcut_audit
from data_gen.config import DataGenConfig
from data_gen.executor import StageStats, merge_counts, stable_int
from data_gen.ingest import decode_check
from data_gen.report import (
    ImageSizes,
    card_groups,
    dataset_stats,
    estimated_tokens,
    pick_cards,
    render_report,
)
from data_gen.step_unit import sample_to_json
from data_gen.steps.work import RECORD_INVALID, Work, step_text
from hivig.files import dumps_jsonl, write_atomic
from hivig.messages import ImageRef, mark_to_json
from hivig.profiles import resolve_profile
from hivig.records import (
    SPLITS,
    SFTRecord,
    records_dir,
    to_sharegpt,
    write_manifest,
    write_profile,
    write_records,
)
from hivig.vision import FramePolicy, canonical_frame, encode_png

T = TypeVar("T")


def collect_samples(works: list[Work]) -> list[SFTRecord]:
    """Every sample of the merged work items, sorted by id."""
    return sorted((s for w in works for u in w.units for s in u.samples()), key=lambda s: s.id)


def sample_views(works: list[Work]) -> dict[str, dict[str, Any]]:
    """Every sample as JSON with its full origin, by id: what the report and
    ``provenance.jsonl`` read (``data_gen.step_unit.sample_to_json``)."""
    return {
        s.id: sample_to_json(s, w.sample_origin(s))
        for w in works
        for u in w.units
        for s in u.samples()
    }


DUPLICATE_BAD_STEP = "duplicate_bad_step"
"""Drop reason of a Bad sample whose screenshot and Bad step an earlier sample already has
(instruction variants of one episode share screenshots, so they can produce the same pair)."""
DUPLICATE_GOOD_STEP = "duplicate_good_step"
"""The same for Good samples: a variant's Good step on the same screenshot is the same sample
for the critic whatever the task wording, and keeping only one side of the repeats would tilt
the Good:Bad ratio of the repeated screens."""
MIX_RATIO = "mix_ratio"
"""Drop reason of history samples beyond ``export.history_critique_ratio``."""


def duplicate_samples(works: list[Work]) -> dict[str, tuple[str, str]]:
    """``{sample id: (reason, id of the kept sample)}`` for critique samples repeating
    (screenshot, verdict, proposed step), Good and Bad alike.

    The smallest sample id of each group is kept, so the choice does not depend on sharding.
    """
    first: dict[tuple[str, ...], str] = {}
    dupes: dict[str, tuple[str, str]] = {}
    rows = []
    for work in works:
        traj = work.trajectory
        for k, unit in enumerate(work.units):
            bad = unit.bad
            shot = traj.steps[k].screenshot
            for sample in unit.critique or []:
                if sample.labels.verdict == "Bad" and bad is not None:
                    rows.append((sample.id, (shot, "Bad", bad.intent, bad.text)))
                elif sample.labels.verdict == "Good":
                    step = (traj.steps[k].intent or "", step_text(traj, k, mask_intent=True))
                    rows.append((sample.id, (shot, "Good", *step)))
    for sid, key in sorted(rows):
        if key in first:
            reason = DUPLICATE_BAD_STEP if key[1] == "Bad" else DUPLICATE_GOOD_STEP
            dupes[sid] = (reason, first[key])
        else:
            first[key] = sid
    return dupes


def mix_surplus(samples: list[SFTRecord], ratio: float, seed: int) -> set[str]:
    """History sample ids beyond ``ratio`` history samples per critique sample.

    Whole chains are kept, trajectory by trajectory in a seeded order (``chains_within``), so
    the run can plan the same cut before paying for a summary (``data_gen.planning``): a chain cut
    short loses its last pairs, and a chain never started costs nothing.
    """
    if ratio <= 0:
        return set()
    chains: dict[str, list[str]] = {}
    for s in sorted(
        (s for s in samples if s.kind == "history"), key=lambda s: (s.step_index, s.id)
    ):
        chains.setdefault(s.trajectory_id, []).append(s.id)
    quota = round(ratio * sum(1 for s in samples if s.kind == "critique"))
    kept = {i for chain in chains_within(chains, quota, seed).values() for i in chain}
    return {i for chain in chains.values() for i in chain} - kept


def chains_within(chains: dict[str, list[T]], quota: int, seed: int) -> dict[str, list[T]]:
    """The leading part of each chain kept within ``quota`` items in all: whole chains in a
    seeded order of their ids, the last one kept cut to fit."""
    kept: dict[str, list[T]] = {}
    room = quota
    for key in sorted(chains, key=lambda k: (stable_int(seed, k, "mix"), k)):
        if room <= 0:
            break
        kept[key] = chains[key][:room]
        room -= len(kept[key])
    return kept


def _json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, ensure_ascii=False, indent=1) + "\n"


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


def _undecodable(sample: SFTRecord, check: ImageCheck) -> str | None:
    for ref in sample.images:
        if (why := check.problem(ref.path)) is not None:
            return f"{ref.path}: {why}"
    return None


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
            policy=resolve_profile(cfg.profile).frame,
        )
        for record, row in zip(chosen, rows, strict=True):
            # Relative to the dataset folder; tmp is renamed to it, at the same depth.
            row["images"] = [os.path.relpath(p, tmp) for p in row["images"]]
            images[record.id] = row["images"]
        write_atomic(folder / f"{split}.json", json.dumps(rows, ensure_ascii=False, indent=1))
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
    write_atomic(tmp / "dataset_info.json", _json(info))
    return images


def _cards(
    specs: list[dict[str, Any]],
    records: dict[str, SFTRecord],
    cfg: DataGenConfig,
    corpus: Path,
    tmp: Path,
    exported: dict[str, list[str]],
) -> list[list[tuple[dict[str, Any], list[str]]]]:
    """Report cards with their images, each Bad card grouped with the Good card of its step.

    A card whose sample is in the ShareGPT export links the frames written there (the same
    canonical frame with the same marks; rendering and encoding it again doubled the cost of
    those images). Otherwise each distinct (screenshot, marks, size class) is rendered once,
    into ``report_images/``, which exists only when it holds something.
    """
    picked = pick_cards(specs, cfg.export.report_cards, lambda i: stable_int(cfg.seed, i, "card"))
    folder = tmp / "report_images"
    rendered: dict[str, str] = {}
    policy = resolve_profile(cfg.profile).frame  # read once, not per card
    out = []
    for group in card_groups(picked, specs):
        row = []
        for spec in group:
            if spec["id"] in exported:
                row.append((spec, list(exported[spec["id"]])))
                continue
            links = []
            for ref in records[spec["id"]].images:
                key = json.dumps(
                    [ref.path, [mark_to_json(m) for m in ref.marks], ref.size_class],
                    sort_keys=True,
                )
                if key not in rendered:
                    folder.mkdir(parents=True, exist_ok=True)
                    rendered[key] = _render_card_image(ref, cfg, corpus, folder, policy)
                links.append(rendered[key])
            row.append((spec, links))
        out.append(row)
    return out


def _render_card_image(
    ref: ImageRef, cfg: DataGenConfig, corpus: Path, folder: Path, policy: FramePolicy
) -> str:
    frame = canonical_frame(
        corpus / ref.path,
        min_pixels=cfg.frame.min_pixels,
        max_pixels=cfg.frame.max_pixels,
        factor=cfg.frame.factor,
        marks=ref.marks,
        size_class=ref.size_class,
        policy=policy,  # what the critic is trained on
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
    dupes = duplicate_samples(works)
    decodes = ImageCheck(corpus)
    samples, views = collect_samples(works), sample_views(works)
    for sid, reason in sorted(r for w in works for u in w.units for r in u.invalid):
        stats.seen()
        stats.drop(sid, RECORD_INVALID, reason)
    unique = [s for s in samples if s.id not in dupes]
    surplus = mix_surplus(unique, cfg.export.history_critique_ratio, cfg.seed)
    for sample in samples:
        stats.seen()
        if sample.id in dupes:
            reason, kept = dupes[sample.id]
            stats.drop(sample.id, reason, f"same as {kept}")
            continue
        if sample.id in surplus:
            ratio = cfg.export.history_critique_ratio
            stats.drop(sample.id, MIX_RATIO, f"beyond export.history_critique_ratio={ratio}")
            continue
        broken = _undecodable(sample, decodes)
        if broken is not None:
            stats.drop(sample.id, CORRUPT_IMAGE, broken)
            continue
        view = views[sample.id]
        n = estimated_tokens(view, sizes, f.min_pixels, f.max_pixels, f.factor)
        if limit and n > limit:
            stats.drop(sample.id, "too_long", f"about {n} tokens > export.max_tokens={limit}")
            continue
        records.append(sample)
        specs.append(view)
        tokens[sample.id] = n
        stats.kept()
    stats.check()
    e = cfg.export
    settings = AuditSettings(e.audit_max_auc, tuple(e.audit_gated), e.audit_min_samples)
    # The audit's probes run in worker processes; the records and frames are written
    # meanwhile, so the two share the cores instead of taking turns.
    with ThreadPoolExecutor(1, "hivig-audit") as pool:
        audit = pool.submit(shortcut_audit, records, settings)
        for split in SPLITS:
            write_records([r for r in records if r.split == split], tmp / "records" / split)
        # Training reads the corpus root from here (records hold corpus-relative image paths).
        write_manifest(tmp / "records", corpus, final_root=records_dir(out))
        write_profile(tmp / "records", resolve_profile(cfg.profile))
        exported = _sharegpt(records, cfg, corpus, tmp) if cfg.export.sharegpt else {}
        all_counters = {**counters, "export": merge_counts([stats.counts])}
        write_atomic(tmp / "exclusions.jsonl", dumps_jsonl(exclusions + stats.exclusions))
        result = dataset_stats(specs, all_counters, tokens, run)
        result["shortcut_audit"] = audit.result()
    result["distribution_out_of_bounds"] = out_of_bounds(
        result["dimension_target_vs_achieved"],
        cfg.perturb.min_dimension_ratio,
        cfg.perturb.max_dimension_ratio,
    )
    result["sources"] = source_counts(specs)
    write_atomic(tmp / "provenance.jsonl", dumps_jsonl(provenance_rows(specs)))
    write_atomic(tmp / "stats.json", _json(result))
    write_atomic(
        tmp / "report.html",
        render_report(
            result, _cards(specs, {r.id: r for r in records}, cfg, corpus, tmp, exported)
        ),
    )
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(tmp, dest)
    if not records:
        raise ExportError(
            f"the run produced no records (every sample was dropped; see {dest / 'stats.json'} "
            "and exclusions.jsonl for the reasons)"
        )
    try:
        check_audit(result["shortcut_audit"])
    except ShortcutAuditError as err:
        raise ExportError(f"{err}; the report is in {dest / 'report.html'}") from None
    bounds = result["distribution_out_of_bounds"]
    if bounds and cfg.perturb.unreachable_dimension == "error":
        raise ExportError(
            "the dimension distribution is off its target ("
            + "; ".join(f"{d}: {r['achieved']:.3f} vs {r['target']:.3f}" for d, r in bounds.items())
            + "); give those dimensions the weight the corpus can carry, or set "
            "perturb.unreachable_dimension=warn to accept it"
        )
    return result


def provenance_rows(specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per exported record, by id: where it came from (``source: run`` with benchmark
    and task id, or ``scalecua``) and its ``hard_case`` tag, if any."""
    return [
        {
            "id": s["id"],
            "split": s["split"],
            "kind": s["kind"],
            "verdict": s["labels"].get("verdict"),
            **(s.get("origin") or {"source": "scalecua", "hard_case": None}),
        }
        for s in specs
    ]


def source_counts(specs: list[dict[str, Any]]) -> dict[str, Any]:
    """Exported records per source, kind and verdict, and the tagged hard cases."""
    out: dict[str, dict[str, int]] = {}
    for row in provenance_rows(specs):
        key = f"{row['kind']}:{row['verdict'] or '-'}"
        by = out.setdefault(row["source"], {})
        by[key] = by.get(key, 0) + 1
        if row.get("hard_case"):
            by[f"hard_case:{row['hard_case']}"] = by.get(f"hard_case:{row['hard_case']}", 0) + 1
    return {k: dict(sorted(v.items())) for k, v in sorted(out.items())}


def out_of_bounds(
    rows: dict[str, dict[str, float]], low: float, high: float
) -> dict[str, dict[str, float]]:
    """Dimensions whose achieved share is outside [low, high] times their positive target."""
    return {
        name: r
        for name, r in rows.items()
        if r["target"] > 0 and not low * r["target"] <= r["achieved"] <= high * r["target"] + 1e-9
    }
