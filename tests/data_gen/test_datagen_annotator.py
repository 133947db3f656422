"""data_gen against a real loopback OpenAI-compatible server with scripted answers.

Covers validation retries, transport retries, slow answers, permanent errors, drop accounting and
the request cache."""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections import Counter
from pathlib import Path

import pytest

from data_gen.annotator import TRANSIENT_REASONS, backend_error_reason
from data_gen.config import DataGenConfig
from data_gen.executor import StageIncomplete
from data_gen.ingest import ingest
from data_gen.run import run
from data_gen.sample_corpus import SampleConfig, make_sample
from hivig.config import load_config
from hivig.records import SPLITS, read_records
from tests.fakes.openai_server import Reply, ScriptedServer, request_images, request_text

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = ROOT / "configs" / "data_gen" / "default.yaml"


class Script:
    """Answers by stage, recognised from the system prompt; some answers are scripted to fail."""

    def __init__(self, permanent_errors: bool) -> None:
        self.permanent_errors = permanent_errors
        self.lock = threading.Lock()
        self.seen: Counter[str] = Counter()
        self.bad_calls: dict[str, str] = {}
        # Screenshot digest -> the expert step executed on it (learnt from transition requests).
        self.expert: dict[str, str] = {}
        self.invalid_sent = 0

    def __call__(self, body: dict) -> Reply | str:
        text = request_text(body)
        images = [hashlib.sha256(b).hexdigest() for b in request_images(body)]
        if "You analyse state transitions" in text:
            with self.lock:
                self.expert[images[0]] = text.split("Executed Step:\n", 1)[1].strip()
        h = int(hashlib.sha256(text.encode()).hexdigest()[:8], 16)
        with self.lock:
            self.seen[text] += 1
            first = self.seen[text] == 1
        if first and h % 5 == 0:
            # Looks plausible, breaks the contract: a validation retry must follow.
            with self.lock:
                self.invalid_sent += 1
            return "I think the step is fine."
        if first and h % 11 == 0:
            return Reply(status=503)  # the client retries transport-level failures itself
        delay = 0.05 if h % 7 == 0 else 0.0
        answer = self._answer(text, h, images)
        if h % 3 == 1 and answer.startswith("<think>"):
            # vLLM with a reasoning parser: the reasoning arrives in `reasoning_content`.
            think, rest = answer[len("<think>") :].split("</think>", 1)
            target = "history tracker" in text or "known to" in text
            # Reasoning of non-target stages may quote the tags; it is never scanned for them.
            extra = " (sent separately)" if target else " (quotes </think> and <think>)"
            return Reply(content=rest.lstrip(), reasoning=think.strip() + extra, delay_s=delay)
        return Reply(content=answer, delay_s=delay)

    def _answer(self, text: str, h: int, images: list[str]) -> str:
        if "You analyse state transitions" in text:
            if self.permanent_errors and h % 4 == 0:
                return "PERMANENT"
            return (
                "<think>\n[Action Mechanism] The click hits a button.\n[Structural Effect] A panel "
                "opens.\n</think>\n<next_state>\nA panel will open.\n</next_state>"
            )
        if "history tracker" in text:
            return (
                "<think>The screen changed.</think>\n<summary>\nProgress Summary: Work is under "
                "way.\nLast Action Result: The step changed the screen.\n</summary>"
            )
        if "You synthesise training data" in text:
            return self._perturbation(text, h)
        if "You evaluate training data" in text:
            return self._judge(text, h, images[0])
        if "known to succeed" in text:
            return _critique("Good", None)
        if "known to be wrong" in text:
            dim = re.search(r"Hidden Error Dimension: (.+)", text).group(1).strip()
            return _critique("Bad", dim)
        raise AssertionError("unknown stage")

    def _perturbation(self, text: str, h: int) -> str:
        dim = re.search(r"Candidate Error Dimensions:\n- ([^:]+):", text).group(1)
        name = "click" if '"mobile_use"' in text else "left_click"
        call = json.dumps(
            {
                "name": "mobile_use" if name == "click" else "computer_use",
                "arguments": {"action": name, "coordinate": [h % 900 + 50, h % 700 + 150]},
            }
        )
        if dim == "Action Formulation Error":
            call = call[:-1]
        step = f"Action: Try something else\n<tool_call>\n{call}\n</tool_call>"
        with self.lock:
            self.bad_calls[call] = dim
        obj = {
            "dimension_violated": dim,
            "rejected_thought": "Looks right.",
            "rejected_proposed_step": step,
        }
        return f"<think>Divergence proof.</think>\n{json.dumps(obj)}"

    def _judge(self, text: str, h: int, image: str) -> str:
        a = text.split("Candidate A:\n", 1)[1].split("\nCandidate B:", 1)[0].strip()
        dim = next((d for c, d in self.bad_calls.items() if c in text), "Termination Misjudgment")
        if image in self.expert:
            expert = "A" if a == self.expert[image] else "B"
        else:
            # A final step has no transition request: recognise the Bad by its generated call.
            expert = "B" if any(c in a for c in self.bad_calls) else "A"
        bad_slot = "B" if expert == "A" else "A"
        if h % 6 == 0:
            better, dim = bad_slot, dim  # the judge is fooled: the pair must be dropped
        elif h % 6 == 1:
            better, dim = (
                expert,
                "Suboptimal Path" if dim != "Suboptimal Path" else "Semantic Error",
            )
        else:
            better = expert
        obj = {
            "better_candidate": better,
            "predicted_error_dimension": dim,
            "reasoning_summary": "One candidate is wrong.",
        }
        return f"<think>Syntax check.</think>\n{json.dumps(obj)}"


def _critique(verdict: str, dim: str | None) -> str:
    lines = [f"Overall Grading: {verdict}"]
    if dim:
        lines.append(f"Error Dimension: {dim}")
    lines.append("Explanation: The interface will respond as described.")
    body = "\n".join(lines)
    return (
        "<think>\nAction String Check: the call - Syntax is Valid.\n\nIt will change the screen."
        f"\n\nOverall Grading: {verdict}.\n</think>\n<criticism>\n{body}\n</criticism>"
    )


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    make_sample(root / "c", SampleConfig(trajectories=4, seed=5), progress=False)
    ingest(root / "c", root / "i", progress=False)
    return root / "c", root / "i" / "trajectories.jsonl"


def _cfg(corpus, out, server, cache):
    c, t = corpus
    return load_config(
        DataGenConfig,
        DEFAULT,
        [
            f"corpus={c}",
            f"out={out}",
            f"trajectories={t}",
            f"annotator.cache_dir={cache}",
            f"annotator.backend.base_url={server.base_url}",
            "annotator.backend.model=scripted",
            "annotator.backend.concurrency=8",
            "annotator.backend.timeout_s=10",
            "annotator.backend.max_retries=3",
            "annotator.backend.backoff_s=0.01",
            "annotator.outage_wait_s=0",  # the outage tests end the run at the client's retries
            "export.sharegpt=false",
            "export.report_cards=4",
            "perturb.unreachable_dimension=warn",  # 4 trajectories cannot express all 12
        ],
    )


def test_scripted_endpoint_retries_drops_and_cache(corpus, tmp_path):
    script = Script(permanent_errors=True)
    cache = tmp_path / "cache"
    with ScriptedServer(respond=lambda b: _permanent(script, b), model="scripted") as server:
        stats = run(_cfg(corpus, tmp_path / "a", server, cache), None)
        first = server.request_count
    st = stats["stages"]
    # Validation retries happened and were counted.
    assert script.invalid_sent > 0
    assert sum(c.get("llm_retries", 0) for c in st.values()) >= script.invalid_sent // 2
    # Permanent errors, judge rejections: every item is accounted for with a reason.
    assert st["transitions"].get("dropped_annotator_http_status", 0) > 0
    assert st["judge"].get("dropped_judge_preferred_perturbed", 0) > 0
    assert st["judge"].get("dropped_judge_dimension_mismatch", 0) > 0
    assert st["rationale"].get("dropped_judge_vetoed", 0) > 0
    for stage, counts in st.items():
        dropped = sum(v for k, v in counts.items() if k.startswith("dropped_"))
        assert counts["in"] == counts.get("kept", 0) + dropped, stage
    exclusions = [
        json.loads(x)
        for x in (tmp_path / "a" / "dataset" / "exclusions.jsonl").read_text().splitlines()
    ]
    judged = [e for e in exclusions if e["reason"] == "judge_preferred_perturbed"]
    assert judged and all(e["raw_responses"] for e in judged)
    # The records name the real endpoint's model, not the offline annotator.
    records = [r for s in SPLITS for r in read_records(tmp_path / "a" / "dataset" / "records" / s)]
    assert records and all(r.provenance.annotator_model == "scripted" for r in records)
    assert all(r.provenance.annotator_kind == "endpoint" for r in records)
    assert first > 0
    # Separately delivered reasoning is used as is: no stage drops it as a think-tag problem,
    # and targets carry it inside one non-empty think block.
    assert not any("think" in k for counts in st.values() for k in counts), st
    assert any("(sent separately)\n</think>" in r.target for r in records)
    assert not any(re.search(r"<think>\s*</think>", r.target) for r in records)


def _permanent(script: Script, body: dict) -> Reply | str:
    reply = script(body)
    if isinstance(reply, Reply) and reply.content == "PERMANENT":
        return Reply(status=400)
    return reply


def test_rerun_with_the_cache_sends_no_request(corpus, tmp_path):
    script = Script(permanent_errors=False)
    cache = tmp_path / "cache"
    with ScriptedServer(respond=script, model="scripted") as server:
        run(_cfg(corpus, tmp_path / "a", server, cache), None)
        first = server.request_count
        assert first > 0
        # A fresh output folder sharing the cache: every request, retries included, is a hit.
        run(_cfg(corpus, tmp_path / "b", server, cache), None)
        assert server.request_count == first
    a = (tmp_path / "a" / "dataset" / "stats.json").read_text()
    b = (tmp_path / "b" / "dataset" / "stats.json").read_text()
    assert a == b


def test_temporary_endpoint_errors_are_retried_by_a_rerun(corpus, tmp_path):
    script = Script(permanent_errors=False)
    outage = {"on": True}
    answered: list[str] = []  # transition requests answered during the outage
    resent: list[str] = []  # ... and sent again by the rerun

    def respond(body: dict) -> Reply | str:
        text = request_text(body)
        transition = "You analyse state transitions" in text
        hit = int(hashlib.sha256(text.encode()).hexdigest()[:8], 16) % 4 == 0
        if outage["on"] and transition and hit:
            return Reply(status=503)  # every client retry fails too: the outage outlasts them
        if transition:
            (answered if outage["on"] else resent).append(text)
        return script(body)

    out, cache = tmp_path / "a", tmp_path / "cache"
    with ScriptedServer(respond=respond, model="scripted") as server:
        with pytest.raises(StageIncomplete, match="annotator_http_unavailable"):
            run(_cfg(corpus, out, server, cache), None)
        # Nothing of the failed stage is committed: no marker, so a rerun retries it.
        assert not list((out / "completions").rglob("transitions.json"))
        assert not (out / "dataset" / "stats.json").exists()
        outage["on"] = False
        stats = run(_cfg(corpus, out, server, cache), None)
    assert not any("annotator_http" in k for c in stats["stages"].values() for k in c)
    assert stats["stages"]["transitions"]["kept"] == stats["stages"]["transitions"]["in"]
    # Cached successes make the rerun cheap: only the failed requests are sent again.
    assert answered and resent
    assert not set(answered) & set(resent)


def test_permanent_http_errors_are_drops_and_other_statuses_are_temporary():
    from hivig.backends.base import BackendHTTPError, BackendTimeout, RetriesExhausted

    assert backend_error_reason(BackendHTTPError("x", status=400)) == "annotator_http_status"
    for status in (429, 500, 503):
        err = RetriesExhausted(BackendHTTPError("x", status=status), attempts=3)
        assert backend_error_reason(err) in TRANSIENT_REASONS
    assert backend_error_reason(BackendTimeout("x")) in TRANSIENT_REASONS
    assert "annotator_http_status" not in TRANSIENT_REASONS


def test_a_failed_history_pair_does_not_lose_the_rest_of_its_trajectory(corpus, tmp_path):
    # A third of the history requests are refused for good (HTTP 400, no retry helps).
    script = Script(permanent_errors=False)

    def respond(body: dict) -> Reply | str:
        text = request_text(body)
        if (
            "history tracker" in text
            and int(hashlib.sha256(text.encode()).hexdigest(), 16) % 3 == 0
        ):
            return Reply(status=400)
        return script(body)

    with ScriptedServer(respond=respond, model="scripted") as server:
        stats = run(_cfg(corpus, tmp_path / "a", server, tmp_path / "cache"), None)
    history = stats["stages"]["history"]
    refused = history["dropped_annotator_http_status"]
    assert refused > 0 and "dropped_chain_broken" not in history, history
    # Every other pair was annotated, from the last good summary after a refusal, and kept.
    assert history["kept"] == history["in"] - refused
    assert history["chain_resumed"] > 0


def test_a_cache_key_keeps_its_value():
    # Existing caches stay valid only while the key's value does: pinned here (the key is built
    # with the project's one content hash, hivig.backends.content_hash).
    from data_gen.annotator import AnnotatorRequest, cache_key
    from hivig.config import FrameConfig
    from hivig.messages import ChatMessage, ImagePart, ImageRef, PointMark, TextPart

    image = ImagePart(ImageRef("a/b.png", (PointMark(3, 4),), "phone"))
    messages = [
        ChatMessage("system", (TextPart("sys é"),)),
        ChatMessage("user", (TextPart("hi"), image, TextPart("x"))),
    ]
    request = AnnotatorRequest(stage="history", messages=messages)
    key = cache_key("m", {"temperature": 0.0}, FrameConfig(), request, 1, lambda p: "d" + p)
    assert key == "1ac4ec76ca822c3d7800fe7b2aca777a4f01776cdca3e490f3d139cf0b9e5ca5"
