"""What vLLM itself feeds the model for OpenAI chat requests: prompt token ids and image tensors.

Run with the Python of a vLLM venv (never hivig's): it imports only vLLM, its dependencies and the
standard library. No engine is started and no weights are loaded: the script builds the same
objects ``vllm launch render`` (vLLM's CPU-only render server) builds from ``vllm serve``'s own
command-line parser, and runs each request body through ``OnlineRenderer.render_chat``, the call
``/v1/chat/completions`` makes before it hands the engine its input. That is vLLM's chat-template
rendering, tokenization and multimodal processing (HF processor plus placeholder expansion).

    python tests/_vllm_render.py IN.json OUT_DIR

``IN.json``::

    {"checkpoint": "/path/to/final",
     "chat_template": "/path/to/final/chat_template.jinja",
     "mm_processor_kwargs": {"size": {"shortest_edge": 3136, "longest_edge": 40000}},
     "serve_args": ["--max-model-len", "4096"],
     "requests": [{"model": ..., "messages": [...], ...}, ...]}

``serve_args`` are more ``vllm serve`` flags. For request ``k`` the script writes to ``OUT_DIR``
``k.json`` (``prompt_token_ids`` with the image placeholders expanded, the ``prompt`` text,
``mm_placeholders``, the tensor keys) and one ``k.<key>.npy`` per tensor: ``pixel_values`` and
``image_grid_thw`` as vLLM's multimodal processor made them, batched across the request's images
as the model runner batches them, and ``pixel_values_model``, those pixels after the vision
tower's own input normalisation (vLLM 0.32 ships Qwen3-VL raw ``uint8`` patches and normalises
them on the device), in float32. It exits 1 with a message on stderr when anything fails.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

# Offline and engine-free: no hub look-ups, no KV cache to size.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


def _fail(message: str) -> None:
    print(f"_vllm_render: {message}", file=sys.stderr)
    sys.exit(1)


def _serve_argv(spec: dict[str, Any]) -> list[str]:
    argv = [str(spec["checkpoint"])]
    if spec.get("chat_template"):
        argv += ["--chat-template", str(spec["chat_template"])]
    if spec.get("mm_processor_kwargs"):
        argv += ["--mm-processor-kwargs", json.dumps(spec["mm_processor_kwargs"])]
    return argv + [str(a) for a in spec.get("serve_args", [])]


def _renderer(argv: list[str]) -> tuple[Any, Any]:
    """``(OnlineRenderer, VllmConfig)`` as a render server (and ``vllm serve``) builds them."""
    from starlette.datastructures import State
    from vllm import AsyncEngineArgs, envs
    from vllm.config import VllmConfig
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.entrypoints.launchers.render.app_state import init_render_app_state
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
    args.model = args.model_tag  # what `vllm serve MODEL` does
    validate_parsed_serve_args(args)
    # As vllm/entrypoints/launchers/render/entry.py: a model config, no engine, no KV cache.
    engine_args = AsyncEngineArgs.from_cli_args(args)
    model_config = engine_args.create_model_config()
    model_config.quantization = None
    envs.VLLM_CPU_KVCACHE_SPACE = 0
    vllm_config = VllmConfig(
        model_config=model_config,
        logging_config=engine_args.create_logging_config(),
        structured_outputs_config=engine_args.create_structured_outputs_config(),
    )
    state = State()
    asyncio.run(init_render_app_state(vllm_config, state, args))
    return state.online_renderer, vllm_config


def _input_norm(vllm_config: Any) -> Any:
    """The module the Qwen-VL vision tower opens with (``visual.input_norm``).

    With ``mm_device_do_normalize`` (vLLM's default for Qwen3-VL) the processor leaves pixels as
    raw ``uint8`` patches and this module rescales and normalises them on the device;
    otherwise it only casts.
    """
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.fusion.mm_input_norm import build_mm_input_norm

    with set_current_vllm_config(vllm_config):
        return build_mm_input_norm(vllm_config.model_config)


def _render(
    online_renderer: Any, input_norm: Any, body: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(meta, tensors)`` of one chat request body as the engine would receive it."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.serve.engine.protocol import ErrorResponse

    request = ChatCompletionRequest.model_validate(body)
    # skip_mm_cache: every item comes back with its data (a cache hit would leave a None item
    # whose tensors live in the engine process instead).
    result = asyncio.run(online_renderer.render_chat(request, skip_mm_cache=True))
    if isinstance(result, ErrorResponse):
        raise RuntimeError(f"vLLM rejected the request: {result.model_dump_json()}")
    _conversation, engine_inputs = result
    if len(engine_inputs) != 1:
        raise RuntimeError(f"expected one engine input, got {len(engine_inputs)}")
    (engine_input,) = engine_inputs
    meta: dict[str, Any] = {
        "type": engine_input["type"],
        "prompt_token_ids": list(engine_input["prompt_token_ids"]),
        "prompt": engine_input.get("prompt"),
    }
    tensors: dict[str, Any] = {}
    if engine_input["type"] == "multimodal":
        meta["mm_placeholders"] = {
            modality: [{"offset": r.offset, "length": r.length} for r in ranges]
            for modality, ranges in engine_input["mm_placeholders"].items()
        }
        # The model runner batches a request's items with the fields' own reduction
        # (MultiModalKwargsItems.get_data): pixel_values concatenated, grids stacked.
        for key, value in engine_input["mm_kwargs"].get_data().items():
            tensors[key] = value.detach().cpu().numpy()
        if "pixel_values" in tensors:
            # What the vision tower's patch embedding receives, computed in float32 (the CPU
            # build's --dtype; on a GPU the same affine map runs as a Triton kernel).
            import torch

            raw = torch.from_numpy(tensors["pixel_values"])
            with torch.no_grad():
                tensors["pixel_values_model"] = input_norm(raw, torch.float32).numpy()
    meta["tensors"] = sorted(tensors)
    return meta, tensors


def main(argv: list[str]) -> None:
    if len(argv) != 2:
        _fail("usage: _vllm_render.py IN.json OUT_DIR")
    spec_path, out = Path(argv[0]), Path(argv[1])
    try:
        spec = json.loads(spec_path.read_text())
        requests = spec["requests"]
        if not isinstance(requests, list) or not requests:
            raise ValueError("'requests' must be a non-empty list of chat request bodies")
        if not (Path(spec["checkpoint"]) / "config.json").is_file():
            raise ValueError(f"checkpoint {spec['checkpoint']} has no config.json")
    except (OSError, ValueError, KeyError, TypeError) as e:
        _fail(f"cannot read {spec_path}: {type(e).__name__}: {e}")
    out.mkdir(parents=True, exist_ok=True)
    try:
        import numpy as np
        import vllm

        online_renderer, vllm_config = _renderer(_serve_argv(spec))
        input_norm = _input_norm(vllm_config)
        mm_config = vllm_config.model_config.multimodal_config
        for k, body in enumerate(requests):
            meta, tensors = _render(online_renderer, input_norm, body)
            meta["vllm_version"] = vllm.__version__
            meta["mm_device_do_normalize"] = bool(mm_config.mm_device_do_normalize)
            meta["input_norm"] = type(input_norm).__name__
            for key, array in tensors.items():
                np.save(out / f"{k}.{key}.npy", array)
            (out / f"{k}.json").write_text(json.dumps(meta))
    except SystemExit:
        raise
    except BaseException as e:  # noqa: BLE001 (any failure is reported and exits 1)
        traceback.print_exc()
        _fail(f"vLLM rendering failed: {type(e).__name__}: {e}")


if __name__ == "__main__":
    main(sys.argv[1:])
