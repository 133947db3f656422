"""The data_gen folder shows its stages: ingest is a subpackage like perturb/ and steps/."""

from __future__ import annotations

from pathlib import Path

DATA_GEN = Path(__file__).resolve().parents[2] / "data_gen"


def test_ingest_is_a_subpackage_of_its_stages():
    assert (DATA_GEN / "ingest" / "__init__.py").is_file()
    for stage in ("_parse.py", "_build.py", "_images.py"):
        assert (DATA_GEN / "ingest" / stage).is_file(), stage
    assert not list(DATA_GEN.glob("_ingest_*.py")), "private ingest modules left at the top"
    assert not (DATA_GEN / "ingest.py").exists()


def test_public_ingest_names_still_import():
    from data_gen.ingest import REASONS, IngestConfig, ingest, parse_line, sniff_image

    assert callable(ingest) and callable(parse_line) and callable(sniff_image)
    assert IngestConfig().verify_images == "header"
    assert "bad_json" in REASONS
