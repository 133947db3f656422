"""Overhead of the critic guard per runner step, against an instant critic.

For each harness shape (WebArenaLiteV2, WindowsAgentArena, OSWorld, AndroidLab) a fake agent
shaped like the harness' own runs ``--steps`` steps bare and ``--steps`` steps wrapped in its
runner adapter (``serve.adapters``), against a real gateway (``serve.app.create_app``) served
on 127.0.0.1 whose backend answers Good at once. Bare and guarded runs alternate, ``--runs``
times; every step shows a new screen (1920x1080 desktop and web, 1440x3120 phone), drawn like
a UI (bars, lists, text) rather than noise, and encoded as the harness would hand it over.

What is reported per harness: the median per-step time bare and guarded, the overhead
(guarded - bare), and where the guarded step's time goes: inclusive wall time per step of the
client's and the gateway's phases (screenshot upload encoding, the HTTP round trips, base64
decoding, PNG decoding, the canonical frame, its PNG and reference, the stored file, the
marker, the critique route), measured by timing those functions in this process (the gateway
runs in a thread of it). Phases nest (``gw.observe`` holds the image phases), so they do not
add up; ``client.http`` holds every gateway phase.

    python benchmarks/bench_runners.py --steps 20 --runs 5 --json bench_runners.json
    python benchmarks/bench_runners.py --only androidlab --steps 10 --runs 3
"""

from __future__ import annotations

import argparse
import base64
import functools
import io
import json
import logging
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    # Appended: a PYTHONPATH naming another tree wins (to measure that tree's code).
    sys.path.append(str(ROOT))

HARNESSES = ("webarena", "waa", "osworld", "androidlab")
SCREENS = {
    "webarena": (1920, 1080),
    "waa": (1920, 1080),
    "osworld": (1920, 1080),
    "androidlab": (1440, 3120),
}


# ---------------------------------------------------------------------------------------------
# Screens: UI-like, distinct per step, cheap to compress like real ones


def ui_screen(width: int, height: int, seed: int) -> bytes:
    """A PNG of a UI-like screen: a title bar, a sidebar, a list of text rows, a button; the
    seed moves the selection and changes the text so each step's screen differs."""
    img = Image.new("RGB", (width, height), (243, 244, 247))
    d = ImageDraw.Draw(img)
    bar = max(24, height // 20)
    d.rectangle((0, 0, width, bar), fill=(32, 48, 80 + seed % 60))
    d.text((12, bar // 3), f"Window {seed} - Settings", fill=(255, 255, 255))
    side = width // 6 if width > height else 0
    if side:
        d.rectangle((0, bar, side, height), fill=(228, 230, 235))
    row = max(28, height // 40)
    for i, y in enumerate(range(bar + 8, height - row, row)):
        if (i + seed) % 9 == 0:
            d.rectangle((side + 4, y, width - 8, y + row - 4), fill=(205, 225, 250))
        d.rectangle((side + 12, y + 6, side + 12 + row // 2, y + row // 2 + 6), fill=(90, 120, 170))
        d.text(
            (side + 24 + row // 2, y + row // 4), f"Item {i + seed} entry text", fill=(20, 20, 20)
        )
    bw, bh = width // 8, row
    d.rectangle((width - bw - 20, height - bh - 20, width - 20, height - 20), fill=(40, 110, 220))
    buf = io.BytesIO()
    img.save(buf, format="PNG")  # Pillow's default, like most harnesses' screenshots
    return buf.getvalue()


# ---------------------------------------------------------------------------------------------
# Phase timers: the functions wrapped in this process, client and gateway alike


class Phases:
    """Wall time per named phase, summed over all threads while ``active``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.totals: dict[str, float] = defaultdict(float)
        self.active = False

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                if self.active:
                    with self.lock:
                        self.totals[name] += time.perf_counter() - t0

        return timed

    def wrap_async(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        async def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return await fn(*args, **kwargs)
            finally:
                if self.active:
                    with self.lock:
                        self.totals[name] += time.perf_counter() - t0

        return timed

    def take(self) -> dict[str, float]:
        with self.lock:
            out = dict(self.totals)
            self.totals.clear()
        return out


PHASES = Phases()
_TARGETS = (
    # (module, attribute path, phase name)
    ("serve.client.flows", "image_field", "client.image_field (base64 of the screenshot)"),
    ("serve.client", "CriticClient._send", "client.http (round trips, gateway included)"),
    ("serve.images", "decode_base64", "gw.base64_decode"),
    ("serve.images", "require_png_or_jpeg", "gw.format_check"),
    ("serve.images", "ImageStore.put_bytes", "gw.put_bytes (image path total)"),
    ("serve.images", "ImageStore._decode", "gw.png_decode"),
    ("serve.images", "ImageStore._canonical", "gw.canonical_frame"),
    ("serve.images", "BandedPng.encode", "gw.frame_png_encode"),
    ("serve.images", "frame_ref", "gw.frame_ref_sha256"),
    ("serve.images", "ImageStore._write", "gw.store_write"),
    ("serve.images", "encode_png", "gw.encode_png"),
    ("serve.critic", "draw_marks", "gw.marker_draw"),
    ("serve.images", "ImageStore.prime_marked", "gw.marked_png_encode"),
    ("serve.critic", "Critic.materialise", "gw.materialise (frames for the model)"),
)
_ASYNC_TARGETS = (
    ("serve.gateway", "Gateway.observe", "gw.observe route"),
    ("serve.gateway", "Gateway.critique", "gw.critique route"),
)


def _patch(module_name: str, path: str, wrapper: Callable[..., Any]) -> None:
    import importlib

    module = importlib.import_module(module_name)
    owner: Any = module
    *parents, attr = path.split(".")
    for p in parents:
        owner = getattr(owner, p)
    if not hasattr(owner, attr):
        return  # a phase this tree does not have
    setattr(owner, attr, wrapper(getattr(owner, attr)))


def install_timers() -> None:
    """Wrap the phase functions (once); phases missing from this tree are skipped."""
    if getattr(install_timers, "done", False):
        return
    for module, path, name in _TARGETS:
        _patch(module, path, functools.partial(PHASES.wrap, name))
    for module, path, name in _ASYNC_TARGETS:
        _patch(module, path, functools.partial(PHASES.wrap_async, name))
    install_timers.done = True  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------------------------
# Harness-shaped agents and one step of each loop


class ClickAgent:
    """An OSWorld/WAA/WebArena-style agent answering one click per step, with the memory
    attributes the adapters roll back (``thoughts``/``actions``/``history``)."""

    def __init__(self, style: str, screen: tuple[int, int]) -> None:
        self.style = style
        self.screen = screen
        self.reset()

    def reset(self, *_: Any, **__: Any) -> None:
        self.thoughts: list[str] = []
        self.actions: list[Any] = []
        self.history: list[str] = []
        self.previous_operations_list: list[str] = []

    def predict(self, instruction: str = "", obs: Any = None, **kwargs: Any) -> Any:
        x, y = self.screen[0] // 3, self.screen[1] // 4
        if self.style == "webarena":
            self.previous_operations_list.append("Click the header")
            code = [
                {"name": "click", "parameters": {"x": x, "y": y, "clicks": 1, "button": "left"}}
            ]
            return {"thought": "t", "operation": "Click the header", "actions": "click"}, code
        actions = [f'pyautogui.click(x={x}, y={y}, clicks=1, button="left")']
        self.thoughts.append("The menu is there.")
        self.actions.append(actions)
        if self.style == "waa":
            self.history.append("Click the menu")
            response = "<operation>Click the menu</operation><action>...</action>"
            return response, actions, {"agent_raw_response": response}, None
        return "The menu is there.", actions


class AndroidAgent:
    """An AndroidLab agent: ``prompt_to_message`` reads the screenshot into a data URL,
    ``act`` answers one tap in frame pixels."""

    name = "BenchAgent"

    def prompt_to_message(self, prompt: str, images: list[str]) -> dict[str, Any]:
        content = []
        for path in images:
            data = base64.b64encode(Path(path).read_bytes()).decode()
            url = f"data:image/png;base64,{data}"
            content.append({"type": "image_url", "image_url": {"url": url}})
        content.append({"type": "text", "text": prompt})
        return {"role": "user", "content": content}

    def act(self, messages: list[dict[str, Any]]) -> str:
        return "<think>t</think><operation>Tap OK</operation><action>click(x=490, y=1064)</action>"


@dataclass
class Harness:
    """One harness: a fresh agent (bare or wrapped) and its step on a given screen."""

    name: str
    make: Callable[[Any | None], Any]
    """``client`` (``None``: bare) -> the agent the loop calls."""
    step: Callable[[Any, bytes, int, Path], None]


def _web_step(agent: Any, png: bytes, idx: int, _: Path) -> None:
    agent.predict(instruction="Open the settings", observation={"screenshot": png})


def _waa_step(agent: Any, png: bytes, idx: int, _: Path) -> None:
    agent.predict("Open the settings", {"screenshot": png, "accessibility_tree": None})


def _osworld_step(agent: Any, png: bytes, idx: int, _: Path) -> None:
    agent.predict("Open the settings", {"screenshot": png, "accessibility_tree": None})


def _android_step(agent: Any, png: bytes, idx: int, folder: Path) -> None:
    # ``PixellevelTask.run_step``: the screenshot file the harness writes, then one ``act``.
    shot = folder / f"{idx}_before.png"
    shot.write_bytes(png)
    prompt = f"Task:\nOpen the clock\n\nPrevious operations:\n{'Step x: Tap OK' * idx}"
    system = {"role": "system", "content": "system prompt"}
    agent.act([system, agent.prompt_to_message(prompt, [str(shot)])])


def harnesses(inject_history: bool = False) -> dict[str, Harness]:
    from serve.adapters import (
        GuardedAndroidLabAgent,
        GuardedOSWorldAgent,
        GuardedWAAAgent,
        GuardedWebArenaLiteAgent,
    )

    def click(style: str, wrap: Callable[..., Any], **kw: Any) -> Callable[[Any], Any]:
        def make(client: Any) -> Any:
            agent = ClickAgent(style, SCREENS[style])
            if client is None:
                return agent
            return wrap(agent, client, inject_history=inject_history, **kw)

        return make

    def android(client: Any) -> Any:
        agent = AndroidAgent()
        if client is None:
            return agent
        return GuardedAndroidLabAgent(agent, client, inject_history=inject_history)

    return {
        "webarena": Harness("webarena", click("webarena", GuardedWebArenaLiteAgent), _web_step),
        "waa": Harness("waa", click("waa", GuardedWAAAgent), _waa_step),
        "osworld": Harness(
            "osworld",
            click("osworld", GuardedOSWorldAgent, screen=SCREENS["osworld"]),
            _osworld_step,
        ),
        "androidlab": Harness("androidlab", android, _android_step),
    }


# ---------------------------------------------------------------------------------------------
# Running


def _episode(h: Harness, client: Any, screens: list[bytes], folder: Path) -> list[float]:
    """Per-step wall times of one episode (the first step, which opens the session, kept)."""
    agent = h.make(client)
    if hasattr(agent, "reset"):
        agent.reset()
    times = []
    for idx, png in enumerate(screens):
        t0 = time.perf_counter()
        h.step(agent, png, idx, folder)
        times.append(time.perf_counter() - t0)
    if client is not None and hasattr(agent, "close"):
        agent.close()
    return times


def bench_harness(h: Harness, client: Any, steps: int, runs: int, tmp: Path) -> dict[str, Any]:
    size = SCREENS[h.name]
    bare: list[float] = []
    guarded: list[float] = []
    phases: dict[str, float] = defaultdict(float)
    for run in range(runs):
        # New screens per run, so the gateway never finds a step's screen already stored.
        screens = [ui_screen(*size, seed=1000 * run + i) for i in range(steps)]
        folder = tmp / f"{h.name}-{run}"
        folder.mkdir(parents=True)
        # Alternate the order per run so drift on a shared machine hits both alike.
        order = ("bare", "guarded") if run % 2 == 0 else ("guarded", "bare")
        for mode in order:
            if mode == "bare":
                bare += _episode(h, None, screens, folder)
                continue
            PHASES.take()
            PHASES.active = True
            try:
                guarded += _episode(h, client, screens, folder)
            finally:
                PHASES.active = False
            for name, total in PHASES.take().items():
                phases[name] += total
    n = len(guarded)
    med_b, med_g = statistics.median(bare), statistics.median(guarded)
    return {
        "screen": list(size),
        "steps": steps,
        "runs": runs,
        "bare_ms": round(1000 * med_b, 2),
        "guarded_ms": round(1000 * med_g, 2),
        "overhead_ms": round(1000 * (med_g - med_b), 2),
        "guarded_mean_ms": round(1000 * statistics.fmean(guarded), 2),
        "phases_ms_per_step": {k: round(1000 * v / n, 2) for k, v in sorted(phases.items())},
    }


def run(steps: int, runs: int, only: list[str], inject_history: bool = False) -> dict[str, Any]:
    from hivig.config import FrameConfig
    from serve.app import create_app
    from serve.client import CriticClient
    from tests.fakes.gateway import LiveServer, ScriptedBackend, serve_config

    install_timers()
    out: dict[str, Any] = {
        "steps": steps,
        "runs": runs,
        "inject_history": inject_history,
        "harnesses": {},
    }
    with tempfile.TemporaryDirectory(prefix="bench-runners-") as tmp:
        # The gateway's default frame budget (not the tests' tiny one): the real canonical frame.
        frame = FrameConfig()
        config = serve_config(
            Path(tmp) / "state",
            f"frame.min_pixels={frame.min_pixels}",
            f"frame.max_pixels={frame.max_pixels}",
            "critic.observe_deadline_s=30",
            "critic.critique_deadline_s=30",
        )
        app = create_app(config, ScriptedBackend())
        with LiveServer(app) as srv, CriticClient(srv.url) as client:
            table = harnesses(inject_history)
            for name in only:
                out["harnesses"][name] = bench_harness(
                    table[name], client, steps, runs, Path(tmp) / "loops"
                )
    return out


def _format(result: dict[str, Any]) -> str:
    mode = "history injected" if result.get("inject_history") else "history not injected"
    lines = [f"steps={result['steps']} runs={result['runs']} {mode} (medians per step, ms)"]
    for name, r in result["harnesses"].items():
        w, h = r["screen"]
        lines.append(
            f"{name:11s} {w}x{h}  bare {r['bare_ms']:8.2f}  guarded {r['guarded_ms']:8.2f}  "
            f"overhead {r['overhead_ms']:8.2f}"
        )
        for phase, ms in r["phases_ms_per_step"].items():
            lines.append(f"    {phase:52s} {ms:8.2f}")
    return "\n".join(lines)


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=(
            "Each harness runs RUNS rounds of STEPS bare steps and STEPS guarded steps "
            "(alternated), each step on a new UI-like screen (1920x1080; AndroidLab 1440x3120), "
            "against a gateway on 127.0.0.1 whose critic answers Good instantly. Reported: "
            "median ms per step bare and guarded, the overhead, and the guarded step's phases "
            "(inclusive ms per step; nested phases overlap)."
        ),
    )
    p.add_argument("--steps", type=int, default=20, help="steps per episode (default 20)")
    p.add_argument("--runs", type=int, default=5, help="bare/guarded rounds (default 5)")
    p.add_argument(
        "--only", action="append", choices=HARNESSES, metavar="HARNESS",
        help=f"run only this harness (repeatable; one of {', '.join(HARNESSES)})",
    )  # fmt: skip
    p.add_argument("--json", type=Path, metavar="OUT", help="also write the results here")
    p.add_argument(
        "--inject-history",
        action="store_true",
        help="the adapters add the gateway's progress summary to the agent's prompt (off by "
        "default, as in the adapters)",
    )
    args = p.parse_args(argv)
    if args.steps < 1 or args.runs < 1:
        p.error("--steps and --runs must be at least 1")
    if args.json is not None and not args.json.parent.is_dir():
        p.error(f"--json: folder {args.json.parent} does not exist; create it or pick another")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    logging.basicConfig(level=logging.WARNING)
    result = run(args.steps, args.runs, args.only or list(HARNESSES), args.inject_history)
    print(_format(result))
    if args.json is not None:
        try:
            args.json.write_text(json.dumps(result, indent=2) + "\n")
        except OSError as e:
            print(f"error: cannot write {args.json}: {e.strerror or e}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
