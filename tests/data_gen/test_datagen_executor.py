"""data_gen executor: sharding, atomic outputs, markers, resume, counters; the request cache."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from data_gen.annotator import AnnotatorRequest, RequestCache, cache_key
from data_gen.executor import (
    Codec,
    Executor,
    Shard,
    ShardError,
    StageStats,
    merge_counts,
    sample_seed,
    unit_float,
)
from hivig.config import FrameConfig
from hivig.files import write_atomic
from hivig.messages import ChatMessage, ImagePart, ImageRef, PointMark, TextPart

# ---------------------------------------------------------------------------------------------
# Shards and seeds


def test_shard_parse_and_errors():
    assert Shard.parse("3/16") == Shard(3, 16)
    assert Shard.parse("0/1").name == "00000-of-00001"
    for bad in ("3", "a/b", "4/4", "-1/3", "0/0"):
        with pytest.raises(ShardError):
            Shard.parse(bad)


def test_shards_partition_the_ids():
    ids = [f"traj{i}" for i in range(500)]
    owners = [[s for s in range(7) if Shard(s, 7).owns(i)] for i in ids]
    assert all(len(o) == 1 for o in owners)
    # Every shard gets some work (a degenerate hash would put everything in one shard).
    assert {o[0] for o in owners} == set(range(7))


def test_seeds_depend_on_sample_and_purpose_only():
    assert sample_seed(0, "a", "mask") == sample_seed(0, "a", "mask")
    assert sample_seed(0, "a", "mask") != sample_seed(0, "b", "mask")
    assert sample_seed(0, "a", "mask") != sample_seed(0, "a", "order")
    assert sample_seed(0, "a", "mask") != sample_seed(1, "a", "mask")
    values = [unit_float(0, f"s{i}", "x") for i in range(2000)]
    assert all(0 <= v < 1 for v in values)
    assert 0.45 < sum(values) / len(values) < 0.55


# ---------------------------------------------------------------------------------------------
# Counters


def test_counters_balance_and_detect_loss():
    stats = StageStats("s")
    stats.seen(3)
    stats.kept(2)
    stats.drop("x", "bad_thing", "why", raw=["raw answer"])
    stats.check()
    assert stats.exclusions == [
        {
            "stage": "s",
            "id": "x",
            "reason": "bad_thing",
            "message": "why",
            "raw_responses": ["raw answer"],
        }
    ]
    stats.seen()  # an item that was neither kept nor dropped
    with pytest.raises(AssertionError, match="do not balance"):
        stats.check()


def test_merge_counts_sums_keys():
    assert merge_counts([{"in": 2, "kept": 1}, {"in": 3, "dropped_x": 1}]) == {
        "dropped_x": 1,
        "in": 5,
        "kept": 1,
    }


def test_atomic_write_leaves_no_temp_files(tmp_path):
    target = tmp_path / "a" / "b.txt"
    write_atomic(target, "one")
    write_atomic(target, "two")
    assert target.read_text() == "two"
    assert [p.name for p in target.parent.iterdir()] == ["b.txt"]


# ---------------------------------------------------------------------------------------------
# Executor


@dataclass
class Doubler:
    name: str
    calls: int = 0
    fail_on: int | None = None

    def run(self, items, stats):
        self.calls += 1
        out = []
        for x in items:
            stats.seen()
            if x == self.fail_on:
                raise RuntimeError("crash")
            if x % 5 == 0:
                stats.drop(str(x), "multiple_of_five")
                continue
            out.append(x * 2)
            stats.kept()
        return out


INT_CODEC = Codec(lambda x: {"v": x}, lambda d: d["v"])


def test_executor_runs_commits_and_resumes(tmp_path):
    a, b = Doubler("a"), Doubler("b")
    ex = Executor(tmp_path, [a, b], INT_CODEC)
    shard = Shard(0, 1)
    assert ex.run_shard(shard, [1, 2, 5, 6]) == [4, 8, 24]
    assert ex.is_done(shard) and ex.is_done(shard, "a")
    counters = ex.load_counters(shard)
    assert counters["a"] == {"dropped_multiple_of_five": 1, "in": 4, "kept": 3}
    excl = ex.merged_exclusions([shard])
    assert [(r["stage"], r["id"]) for r in excl] == [("a", "5")]
    # Rerun: both stages are skipped and their outputs loaded.
    assert ex.run_shard(shard, [1, 2, 5, 6]) == [4, 8, 24]
    assert (a.calls, b.calls) == (1, 1)


def test_executor_crash_leaves_earlier_stage_done(tmp_path):
    a, b = Doubler("a"), Doubler("b", fail_on=4)
    ex = Executor(tmp_path, [a, b], INT_CODEC)
    shard = Shard(0, 1)
    with pytest.raises(RuntimeError):
        ex.run_shard(shard, [1, 2])
    assert ex.is_done(shard, "a") and not ex.is_done(shard, "b")
    assert not ex.output_path(shard, "b").exists()
    b.fail_on = None
    assert ex.run_shard(shard, [1, 2]) == [4, 8]
    assert a.calls == 1  # stage a was not recomputed


def test_executor_rejects_unbalanced_stage(tmp_path):
    class Leaky:
        name = "leaky"

        def run(self, items, stats):
            stats.seen(len(items))
            return items[:1]

    ex = Executor(tmp_path, [Leaky()], INT_CODEC)
    with pytest.raises(AssertionError):
        ex.run_shard(Shard(0, 1), [1, 2])
    assert not ex.is_done(Shard(0, 1))


# ---------------------------------------------------------------------------------------------
# Request cache


def _request(text: str, path: str, marks=()) -> AnnotatorRequest:
    msg = ChatMessage("user", [ImagePart(ImageRef(path, tuple(marks))), TextPart(text)])
    return AnnotatorRequest("stage", [msg], {"ignored": True})


def test_cache_key_is_content_addressed(tmp_path):
    (tmp_path / "a.png").write_bytes(b"one")
    (tmp_path / "b.png").write_bytes(b"one")
    digests = {"a.png": "h1", "b.png": "h1", "c.png": "h2"}
    key = lambda req, attempt=0, model="m": cache_key(  # noqa: E731
        model, {"temperature": 0}, FrameConfig(), req, attempt, digests.__getitem__
    )
    base = key(_request("hi", "a.png"))
    assert base == key(_request("hi", "b.png"))  # same bytes, different path: a hit
    assert base != key(_request("hi", "c.png"))  # different bytes: a miss
    assert base != key(_request("hi!", "a.png"))
    assert base != key(_request("hi", "a.png", [PointMark(1, 2)]))
    assert base != key(_request("hi", "a.png"), attempt=1)
    assert base != key(_request("hi", "a.png"), model="other")


def test_request_cache_round_trip_and_corrupt_entry(tmp_path):
    cache = RequestCache(tmp_path)
    assert cache.get("ab" * 32) is None
    cache.put("ab" * 32, {"text": "x"})
    assert cache.get("ab" * 32) == {"text": "x"}
    (tmp_path / "cd").mkdir()
    (tmp_path / "cd" / f"{'cd' * 32}.json").write_text("{not json")
    assert cache.get("cd" * 32) is None
    assert json.loads((tmp_path / "ab" / f"{'ab' * 32}.json").read_text()) == {"text": "x"}


def test_jsonl_round_trip_keeps_unicode_line_separators():
    from data_gen.executor import dumps_jsonl, loads_jsonl

    rows = [{"op": "type(text='a\u2028b\u0085c\u000bd')"}, {"op": "x"}]
    assert loads_jsonl(dumps_jsonl(rows)) == rows
