"""Per-benchmark settings of the runner adapters: platform, screen, coordinates, policy frame."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from hivig.actions import COORD_SPACES, PLATFORMS
from hivig.run_folders import QWEN25_FACTOR

# Qwen2.5-VL ``smart_resize`` patch factor used by every ScaleCUA evaluation harness (one
# value, shared with the result-folder readers).
SCALECUA_FACTOR = QWEN25_FACTOR


@dataclass(frozen=True)
class RunnerPreset:
    """How one benchmark harness shows screens to its policy and writes actions.

    Attributes:
        name: The benchmark, for logs.
        platform: Session platform (one of ``hivig.actions.PLATFORMS``).
        screen: Screen size ``(w, h)`` in pixels the harness executes on (the first
            screenshot overrides it when its size differs).
        coord_space: How the actions the adapter judges write coordinates (``screen_px``:
            harness-side pixels; ``resized_px``: pixels of the policy's frame).
        min_pixels: Smallest policy frame, in pixels (area, not edge length).
        max_pixels: Largest policy frame, in pixels (area, not edge length).
        factor: Frame edges are multiples of this many pixels.
    """

    name: str
    platform: str
    screen: tuple[int, int]
    coord_space: str
    min_pixels: int
    max_pixels: int
    factor: int = SCALECUA_FACTOR

    def __post_init__(self) -> None:
        if self.platform not in PLATFORMS:
            raise ValueError(f"preset.platform must be one of {PLATFORMS}, got {self.platform!r}")
        if self.coord_space not in COORD_SPACES:
            raise ValueError(
                f"preset.coord_space must be one of {COORD_SPACES}, got {self.coord_space!r}"
            )
        if min(self.screen) < 1 or not 0 < self.min_pixels <= self.max_pixels:
            raise ValueError("preset: screen sides >= 1 and 0 < min_pixels <= max_pixels")

    def frame(self, screen: tuple[int, int] | None = None) -> tuple[int, int]:
        """``(w, h)`` of the image the policy sees for ``screen`` (default: the preset's)."""
        # Deferred: wrapping an agent must not load the image stack before a frame is needed.
        from hivig.vision import smart_resize

        w, h = screen or self.screen
        fh, fw = smart_resize(h, w, self.factor, self.min_pixels, self.max_pixels)
        return (fw, fh)

    def with_screen(self, screen: tuple[int, int]) -> RunnerPreset:
        """The same preset on another screen size."""
        return dataclasses.replace(self, screen=(int(screen[0]), int(screen[1])))


WEBARENA_LITE = RunnerPreset(
    name="webarena_lite_v2",
    platform="web",
    screen=(1280, 720),
    # The harness executes the agent's ``code`` list, already in screen pixels.
    coord_space="screen_px",
    min_pixels=3_136,
    max_pixels=2_007_040,  # the native agent's default ``max_pixel``: 1280x720 -> 1288x728
)
"""WebArenaLiteV2 (Playwright, 1280x720)."""

ANDROIDLAB = RunnerPreset(
    name="androidlab",
    platform="android",
    screen=(1440, 3120),
    # ``<action>`` calls are pixels of the resized frame; the executor rescales them by the
    # device size (1440x3120 -> 980x2128).
    coord_space="resized_px",
    min_pixels=3_136,
    max_pixels=2_109_744,
)
"""AndroidLab (adb, pixel-level ScaleCUA agents)."""

WAA = RunnerPreset(
    name="windowsagentarena",
    platform="windows",
    screen=(1280, 800),
    # The ScaleCUA agent turns its frame pixels (1288x812) into screen-pixel pyautogui code.
    coord_space="screen_px",
    min_pixels=3_136,
    max_pixels=2_109_744,
)
"""WindowsAgentArena (pyautogui in a Windows VM, 1280x800)."""
