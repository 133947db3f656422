"""Frame sizes pinned to the reference implementation: Qwen's own ``qwen-vl-utils``.

``hivig.vision.smart_resize`` decides how many visual tokens every screenshot costs, in training
and serving alike; it must give the same (height, width) as the rule Qwen ships, for every
screen size the runners send and the pixel budgets the configs use.
"""

from __future__ import annotations

import itertools

import pytest

from hivig.vision import smart_resize

vision_process = pytest.importorskip("qwen_vl_utils.vision_process")

SCREENS = [
    (1080, 1920), (1440, 2560), (2160, 3840), (800, 1280), (720, 1280), (728, 1288),
    (812, 1288), (3120, 1440), (2400, 1080), (2128, 980), (1024, 768), (100, 50), (31, 33),
    (16_000, 90),
]  # fmt: skip
BUDGETS = [(1024, 65_536), (65_536, 1_048_576), (3136, 2_109_744), (256 * 28 * 28, 1_003_520)]


@pytest.mark.parametrize(("screen", "budget"), list(itertools.product(SCREENS, BUDGETS)))
def test_frame_size_equals_qwen_vl_utils(screen, budget):
    height, width = screen
    low, high = budget
    ours = smart_resize(height, width, 32, low, high)
    theirs = vision_process.smart_resize(height, width, 32, min_pixels=low, max_pixels=high)
    if 0 in theirs:
        # The one documented difference: a side never rounds to 0 here (the reference would
        # hand the processor an empty image).
        assert ours == tuple(v or 32 for v in theirs)
    else:
        assert ours == tuple(theirs)
