"""vLLM's own processing of the gateway's requests equals hivig's encoder, token for token.

Token ids and pixel values of vLLM's own processing equal hivig's encoder for a history and a
critique request. A one-step tiny training run writes the final checkpoint (processor files and
chat template as ``python -m train`` saves them); the gateway, on its ``openai`` backend with the
checkpoint's frame, sends a history update (two screenshots) and a critique (one marked
screenshot) to a loopback server that records the bodies. ``tests/_vllm_render.py``, run by the
vLLM venv's Python (``HIVIG_VLLM_PYTHON``; ``make test-all`` sets it), passes each body through
vLLM's chat pipeline with the flags ``slurm/serve.sbatch`` gives ``vllm serve`` (the
checkpoint's ``chat_template.jinja``, its frame as ``--mm-processor-kwargs``). hivig encodes the
same messages, rebuilt from the body, with ``encode_sample``: the prompt ids, the image grids and
the pixel values the model gets must agree. Negative controls (one character of text, one pixel)
show the comparison can fail.
"""

from __future__ import annotations

import base64
import copy
import io
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from PIL import Image

from hivig.checkpoint_files import read_context_length, read_frame
from hivig.messages import ChatMessage, ImagePart, TextPart
from hivig.models.qwen_vl import EncodedSample, build_processor, encode_sample
from serve.app import create_app
from tests._sample_run import tiny_final_checkpoint
from tests.fakes.gateway import CLICK, GOOD, SUMMARY, b64, screen, serve_config, session_body
from tests.fakes.openai_server import Reply, ScriptedServer, request_text

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
RENDER = Path(__file__).resolve().parents[1] / "_vllm_render.py"
VLLM_PYTHON = os.environ.get("HIVIG_VLLM_PYTHON")
"""The vLLM venv's Python (``make vllm-venv``; ``make test-all`` sets it)."""
MIN_PX, MAX_PX = 3136, 40_000  # not the defaults, so a default frame could not pass for it
SERVED = "hivig-critic"

# vLLM 0.32 hands Qwen3-VL raw uint8 patches and normalises them in the vision tower
# (mm_device_do_normalize: x * (rescale/std) - mean/std in float32); hivig's processor returns
# (x/255 - 0.5)/0.5 in float32. Same uint8 pixels, two float32 orders of the same affine map: at
# most an ulp or two apart (|x| <= 1, ulp 1.2e-7). 1e-6 allows that and nothing else: another
# resize, resample filter, channel order or a lossy image moves a value by >= 2/255 ~ 7.8e-3.
# The raw bytes are compared exactly as well (_raw_pixels_match).
PIXEL_ATOL = 1e-6


def _require_vllm() -> str:
    if VLLM_PYTHON:
        return VLLM_PYTHON
    message = "HIVIG_VLLM_PYTHON is unset (make test-all sets it; make vllm-venv builds the venv)"
    if os.environ.get("CI"):
        pytest.fail(f"{message}: the real-vLLM tier must not skip in CI")
    pytest.skip(message)


@pytest.fixture(scope="module")
def vllm_python() -> str:
    return _require_vllm()


@pytest.fixture(scope="module")
def final_ckpt(vllm_python, tmp_path_factory) -> Path:
    """The final checkpoint of a one-step tiny run, as ``python -m train`` writes it."""
    root = tmp_path_factory.mktemp("vllm_processing")
    final = tiny_final_checkpoint(root, MIN_PX, MAX_PX)
    assert read_frame(final) == (MIN_PX, MAX_PX)
    return final


def _answer(body: dict[str, Any]) -> Reply:
    text = request_text(body)
    return Reply(content=GOOD if "Current Proposed Step" in text else SUMMARY, reasoning="ok")


@pytest.fixture(scope="module")
def bodies(final_ckpt, tmp_path_factory) -> dict[str, dict[str, Any]]:
    """The gateway's real request bodies: ``history`` (two frames) and ``critique`` (one)."""
    lo, hi = read_frame(final_ckpt)
    state = tmp_path_factory.mktemp("gateway") / "state"
    with ScriptedServer(respond=_answer, model=SERVED) as server:
        cfg = serve_config(
            state,
            "backend.kind=openai",
            f"backend.base_url={server.base_url}",
            f"model={SERVED}",
            # What slurm/serve.sbatch gives the gateway: the checkpoint's frame and profile.
            f"frame.min_pixels={lo}",
            f"frame.max_pixels={hi}",
            f"critic.checkpoint={final_ckpt}",
            f"critic.profile={final_ckpt / 'profile'}",
            "critic.observe_deadline_s=30",
            "critic.critique_deadline_s=30",
        )
        shots = [screen(seed=0), screen(seed=1, dialog=True)]
        with TestClient(create_app(cfg)) as c:
            sid = c.post("/v1/sessions", json=session_body()).json()["session_id"]
            first = c.post(
                f"/v1/sessions/{sid}/observe", json={"step_idx": 0, "screenshot": b64(shots[0])}
            )
            assert first.status_code == 200, first.text
            obs = c.post(
                f"/v1/sessions/{sid}/observe",
                json={"step_idx": 1, "screenshot": b64(shots[1]), "prev_action": CLICK},
            ).json()
            v = c.post(f"/v1/sessions/{sid}/critique", json={"step_idx": 1, "action": CLICK})
        assert obs["status"] == "ok" and obs["history"]["version"] == 1, obs
        assert v.json()["source"] == "model", v.text
        history, critique = server.requests[-2:]
    assert len(_images(history)) == 2 and len(_images(critique)) == 1
    assert "Current Proposed Step" in request_text(critique)
    return {"history": history, "critique": critique}


def _png(part: dict[str, Any]) -> Image.Image:
    """The frame of an ``image_url`` part (a PNG data URL), as RGB."""
    header, _, payload = part["image_url"]["url"].partition(",")
    assert header == "data:image/png;base64", header
    return Image.open(io.BytesIO(base64.b64decode(payload))).convert("RGB")


def _images(body: dict[str, Any]) -> list[Image.Image]:
    return [
        _png(part)
        for message in body["messages"]
        if isinstance(message["content"], list)
        for part in message["content"]
        if part["type"] == "image_url"
    ]


def _messages(body: dict[str, Any]) -> list[ChatMessage]:
    """The gateway's messages, rebuilt from its request body (parts in the same order)."""
    messages = []
    for message in body["messages"]:
        content = message["content"]
        if isinstance(content, str):
            parts: list[TextPart | ImagePart] = [TextPart(content)]
        else:
            parts = []
            for part in content:
                if part["type"] == "text":
                    parts.append(TextPart(part["text"]))
                elif part["type"] == "image_url":
                    parts.append(ImagePart(_png(part)))
                else:
                    raise AssertionError(f"unexpected content part {part['type']!r}")
        messages.append(ChatMessage(role=message["role"], content=parts))
    return messages


def _altered_text(body: dict[str, Any]) -> dict[str, Any]:
    """The body with one character of its user text changed."""
    out = copy.deepcopy(body)
    part = next(p for p in out["messages"][-1]["content"] if p["type"] == "text")
    k = part["text"].index("Current Proposed Step")
    part["text"] = part["text"][:k] + "c" + part["text"][k + 1 :]
    return out


def _altered_pixel(body: dict[str, Any]) -> dict[str, Any]:
    """The body with one pixel of its first image changed."""
    out = copy.deepcopy(body)
    part = next(p for p in out["messages"][-1]["content"] if p["type"] == "image_url")
    image = _png(part)
    r, g, b = image.getpixel((5, 5))
    image.putpixel((5, 5), (255 - r, g, b))
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    part["image_url"]["url"] = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    return out


@pytest.fixture(scope="module")
def vllm_out(vllm_python, final_ckpt, bodies, tmp_path_factory) -> dict[str, dict[str, Any]]:
    """What vLLM feeds the model for each body: ids (``meta``) and ``pixel_values``/grids."""
    lo, hi = read_frame(final_ckpt)
    work = tmp_path_factory.mktemp("vllm_render")
    names = ["history", "critique", "critique_text_changed", "critique_pixel_changed"]
    requests = [
        bodies["history"],
        bodies["critique"],
        _altered_text(bodies["critique"]),
        _altered_pixel(bodies["critique"]),
    ]
    spec = {
        "checkpoint": str(final_ckpt),
        # slurm/serve.sbatch's flags that shape the prompt: template, frame, image limit.
        "chat_template": str(final_ckpt / "chat_template.jinja"),
        "mm_processor_kwargs": {"size": {"shortest_edge": lo, "longest_edge": hi}},
        # The rest of its `vllm serve` flags, plus the CPU build's --dtype (its VLLM_ARGS).
        "serve_args": [
            "--served-model-name",
            SERVED,
            "--max-model-len",
            str(read_context_length(final_ckpt)),
            "--limit-mm-per-prompt",
            json.dumps({"image": 2, "video": 0}),
            "--generation-config",
            "vllm",
            "--enable-prefix-caching",
            "--enable-prompt-tokens-details",
            "--max-num-seqs",
            "64",
            "--dtype",
            "float32",
        ],
        "requests": requests,
    }
    (work / "in.json").write_text(json.dumps(spec))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    done = subprocess.run(
        [vllm_python, str(RENDER), str(work / "in.json"), str(work / "out")],
        capture_output=True,
        text=True,
        timeout=270,  # inside pytest-timeout's 300 s, so its stderr is reported
        env=env,
    )
    assert done.returncode == 0, f"_vllm_render.py failed:\n{done.stderr[-6000:]}"
    out = {}
    for k, name in enumerate(names):
        meta = json.loads((work / "out" / f"{k}.json").read_text())
        out[name] = {
            "meta": meta,
            **{key: np.load(work / "out" / f"{k}.{key}.npy") for key in meta["tensors"]},
        }
    return out


@pytest.fixture(scope="module")
def hivig_enc(final_ckpt, bodies) -> dict[str, EncodedSample]:
    """hivig's serving encoding of the same messages with the checkpoint's processor."""
    lo, hi = read_frame(final_ckpt)
    processor = build_processor(final_ckpt, min_pixels=lo, max_pixels=hi)
    # _raw_pixels_match inverts this normalisation.
    image_processor = processor.image_processor
    assert list(image_processor.image_mean) == list(image_processor.image_std) == [0.5] * 3
    assert image_processor.rescale_factor == 1 / 255
    return {name: encode_sample(processor, _messages(body)) for name, body in bodies.items()}


def _pixel_diff(vllm: dict[str, Any], ours: EncodedSample) -> float:
    """Largest difference between what vLLM's vision tower gets and hivig's pixel values."""
    assert ours.pixel_values is not None
    theirs, mine = vllm["pixel_values_model"], ours.pixel_values.numpy()
    assert theirs.dtype == mine.dtype == np.float32, (theirs.dtype, mine.dtype)
    assert theirs.shape == mine.shape, (theirs.shape, mine.shape)
    return float(np.abs(theirs.astype(np.float64) - mine.astype(np.float64)).max())


def _raw_pixels_match(vllm: dict[str, Any], ours: EncodedSample) -> bool:
    """Whether vLLM's raw uint8 patches are the very bytes hivig normalised (mean = std = 0.5)."""
    assert ours.pixel_values is not None
    raw = vllm["pixel_values"]
    if raw.dtype != np.uint8:  # normalised by the processor (mm_device_do_normalize off)
        return bool(np.array_equal(raw, vllm["pixel_values_model"]))
    recovered = np.rint((ours.pixel_values.double().numpy() * 0.5 + 0.5) * 255)
    return bool(np.array_equal(raw, recovered.astype(np.uint8)))


@pytest.mark.parametrize("kind", ["history", "critique"])
def test_vllm_feeds_the_model_what_hivig_encodes(kind, vllm_out, hivig_enc):
    vllm, ours = vllm_out[kind], hivig_enc[kind]
    ids = vllm["meta"]["prompt_token_ids"]
    assert vllm["meta"]["type"] == "multimodal"
    mine = ours.input_ids.tolist()
    first = next((i for i, (a, b) in enumerate(zip(ids, mine, strict=False)) if a != b), None)
    assert ids == mine, (
        f"{kind}: vLLM's prompt ({len(ids)} ids) differs from hivig's ({len(mine)} ids) "
        f"first at {first}:\n{vllm['meta']['prompt']}"
    )
    assert ours.image_grid_thw is not None
    assert vllm["image_grid_thw"].tolist() == ours.image_grid_thw.tolist()
    assert len(vllm["meta"]["mm_placeholders"]["image"]) == len(ours.image_grid_thw)
    assert _raw_pixels_match(vllm, ours), f"{kind}: vLLM's pixels are not the frames hivig saw"
    diff = _pixel_diff(vllm, ours)
    print(
        f"{kind}: {len(ids)} ids, grids {ours.image_grid_thw.tolist()}, max |dpixel| {diff:.3g} "
        f"(vLLM {vllm['meta']['vllm_version']}, {vllm['meta']['input_norm']})"
    )
    assert diff <= PIXEL_ATOL, f"{kind}: pixel values differ by up to {diff}"


def test_the_comparison_sees_one_character_and_one_pixel(vllm_out, hivig_enc):
    ours = hivig_enc["critique"]
    text = vllm_out["critique_text_changed"]
    assert text["meta"]["prompt_token_ids"] != ours.input_ids.tolist()
    assert _raw_pixels_match(text, ours) and _pixel_diff(text, ours) <= PIXEL_ATOL
    pixel = vllm_out["critique_pixel_changed"]
    assert pixel["meta"]["prompt_token_ids"] == ours.input_ids.tolist()
    assert not _raw_pixels_match(pixel, ours) and _pixel_diff(pixel, ours) > 100 * PIXEL_ATOL
