"""The torch-free resize equals torch's uint8 antialiased bicubic, pixel for pixel."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image, ImageDraw

from hivig.vision import smart_resize
from hivig.vision._frame import resize_rgb, rgbx_array
from hivig.vision._resample import axis_taps, resize_bicubic_aa

torch = pytest.importorskip("torch")
F = torch.nn.functional

MAX_PX = 1_048_576
MIN_PX = 65_536
# torch's scalar fallback kernel (ATEN_CPU_CAPABILITY=default, and CPUs without AVX2) repeats
# output row 0 down the whole column when the output is 1 pixel wide; its AVX kernel does not.
# Frame sizes are multiples of 32, so frames never meet it.
_AVX = torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")
needs_avx_torch = pytest.mark.skipif(not _AVX, reason="torch's fallback kernel is wrong at width 1")


def torch_resize(pixels: np.ndarray, out_h: int, out_w: int) -> np.ndarray:
    """torch's result, called as ``_frame.resize_rgb`` calls it: (1, C, H, W), channels last."""
    t = torch.from_numpy(np.array(pixels)).unsqueeze(0).permute(0, 3, 1, 2)
    out = F.interpolate(t, size=(out_h, out_w), mode="bicubic", antialias=True)
    return out[0].permute(1, 2, 0).contiguous().numpy()


def noise(h: int, w: int, c: int = 3, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, c), dtype=np.uint8)


def screenshot(w: int, h: int, seed: int = 0) -> Image.Image:
    """Flat panels, 1-px rules, saturated buttons, a gradient and lines of small text."""
    rng = np.random.default_rng(seed)
    img = Image.new("RGB", (w, h), (246, 246, 246))
    draw = ImageDraw.Draw(img)
    for _ in range(12):
        x0, y0 = int(rng.integers(0, w)), int(rng.integers(0, h))
        x1, y1 = x0 + int(rng.integers(8, w // 2 + 9)), y0 + int(rng.integers(8, h // 2 + 9))
        colour = tuple(int(v) for v in rng.integers(0, 256, 3))
        draw.rectangle((x0, y0, x1, y1), fill=colour, outline=(0, 0, 0))
    for y in range(0, h, 17):
        draw.line((0, y, w, y), fill=(200, 200, 200))
        draw.text((int(rng.integers(0, max(1, w // 3))), y + 2), "File Edit View 0123 Ok", fill=0)
    px = np.asarray(img).copy()
    px[: h // 8, : w // 4] = np.linspace(0, 255, w // 4, dtype=np.uint8)[None, :, None]
    return Image.fromarray(px)


# --------------------------------------------------------------------------------------------
# Screens, through the production call


SCREENS = [
    (1920, 1080),
    (2560, 1440),
    (1366, 768),
    (1280, 720),
    (1440, 3120),  # portrait phone
    (1080, 2400),
    (3840, 2160),  # several Pillow blocks: rgbx_array takes its copying route
    (200, 100),  # grows
    (3000, 40),  # 75:1
]


@pytest.mark.parametrize(("width", "height"), SCREENS)
def test_equals_frame_resize_on_screens(width, height):
    out_h, out_w = smart_resize(height, width, 32, MIN_PX, MAX_PX)
    for img in (screenshot(width, height), Image.fromarray(noise(height, width))):
        expected = np.asarray(resize_rgb(img, out_w, out_h))  # the torch call frames are made with
        assert np.array_equal(resize_bicubic_aa(np.asarray(img), out_h, out_w), expected)
        # Pillow's own RGBX storage, as a 4-channel array and as its RGB view (both in place).
        rgbx = rgbx_array(img)
        assert np.array_equal(resize_bicubic_aa(rgbx, out_h, out_w)[..., :3], expected)
        assert np.array_equal(resize_bicubic_aa(rgbx[..., :3], out_h, out_w), expected)


def test_unchanged_size_is_a_copy():
    out_h, out_w = smart_resize(800, 1280, 32, MIN_PX, MAX_PX)
    assert (out_h, out_w) == (800, 1280)
    px = np.asarray(screenshot(1280, 800))
    out = resize_bicubic_aa(px, out_h, out_w)
    assert np.array_equal(out, px) and not np.shares_memory(out, px)
    assert np.array_equal(out, torch_resize(px, 800, 1280))


def test_pillow_bicubic_is_close_but_not_equal():
    # Negative control: the same filter with Pillow's arithmetic differs, so equality is a real
    # check of the arithmetic and not only of the filter.
    img = screenshot(1920, 1080)
    ours = resize_bicubic_aa(np.asarray(img), 768, 1344).astype(int)
    pil = np.asarray(img.resize((1344, 768), Image.Resampling.BICUBIC)).astype(int)
    assert 0 < np.abs(ours - pil).max() <= 2


# --------------------------------------------------------------------------------------------
# Shapes, layouts and channel counts


SHAPES = [
    ((1080, 1920), (768, 1344)),
    ((100, 200), (128, 256)),  # grows both ways
    ((768, 1366), (736, 1312)),  # shrinks one axis, grows the other
    ((1080, 1920), (1080, 1344)),  # horizontal pass only
    ((1080, 1920), (768, 1920)),  # vertical pass only
    ((3840, 500), (768, 400)),  # 5x shrink: float64 vertical sums
    ((4000, 20), (3008, 32)),  # 200:1 tall
    ((20, 4000), (32, 6400)),  # 200:1 wide
    ((7, 4000), (3, 20)),  # 200x horizontal shrink: 800 taps
    ((2000, 30), (10, 7)),  # short rows: tap-by-tap vertical pass
    ((1, 1), (50, 40)),
    ((1, 500), (1, 3)),
    ((1, 300), (32, 64)),  # 1 pixel tall
    ((300, 1), (64, 32)),  # 1 pixel wide
    ((37, 53), (20, 91)),
]


@pytest.mark.parametrize(("size", "out"), SHAPES)
def test_equals_torch_on_shapes(size, out):
    px = noise(*size, c=4, seed=sum(size))
    expected = torch_resize(px, *out)
    assert np.array_equal(resize_bicubic_aa(px, *out), expected)
    assert np.array_equal(
        resize_bicubic_aa(np.ascontiguousarray(px[..., :3]), *out), expected[..., :3]
    )


@needs_avx_torch
@pytest.mark.parametrize(
    ("size", "out"), [((500, 1), (3, 1)), ((254, 70), (32, 1)), ((9, 9), (1, 1))]
)
def test_equals_torch_at_width_1(size, out):
    px = noise(*size, c=3, seed=1)
    assert np.array_equal(resize_bicubic_aa(px, *out), torch_resize(px, *out))


@pytest.mark.parametrize("channels", [1, 2, 4, 5])
def test_channel_counts(channels):
    px = noise(61, 83, c=channels, seed=channels)
    for out in ((40, 120), (90, 30)):
        assert np.array_equal(resize_bicubic_aa(px, *out), torch_resize(px, *out))


def test_layouts_give_the_same_frame():
    base = noise(300, 401, c=4, seed=3)
    rgb = np.ascontiguousarray(base[..., :3])
    expected = torch_resize(rgb, 200, 256)
    views = {
        "rgb view of rgbx": base[..., :3],
        "flipped": np.ascontiguousarray(rgb[::-1, ::-1])[::-1, ::-1],
        "fortran": np.asfortranarray(rgb),
        "channels apart": np.ascontiguousarray(np.moveaxis(rgb, 2, 0)).transpose(1, 2, 0),
        "crop": noise(310, 420, seed=3)[5:305, 7:408],
    }
    views["crop"][...] = rgb
    for name, px in views.items():
        assert np.array_equal(resize_bicubic_aa(px, 200, 256), expected), name


def test_saturated_content():
    # Black/white blocks: the cubic's overshoot is clamped in both passes.
    rng = np.random.default_rng(4)
    px = (rng.random((97, 131, 1)) < 0.5).astype(np.uint8).repeat(3, axis=2) * 255
    for out in ((64, 96), (194, 262), (97, 50)):
        assert np.array_equal(resize_bicubic_aa(px, *out), torch_resize(px, *out))


def test_random_sizes():
    rng = np.random.default_rng(5)
    for _ in range(120):
        h, w = (int(v) for v in rng.integers(1, 160, 2))
        out_h, out_w = (int(v) for v in rng.integers(2, 200, 2))
        if rng.random() < 0.2:
            out_h = h
        if rng.random() < 0.2:
            out_w = w
        if out_w == 1 and not _AVX:
            continue  # torch's fallback kernel is wrong there (see needs_avx_torch)
        px = noise(h, w, c=int(rng.choice([3, 4])), seed=int(rng.integers(1 << 30)))
        got, expected = resize_bicubic_aa(px, out_h, out_w), torch_resize(px, out_h, out_w)
        assert np.array_equal(got, expected), (h, w, out_h, out_w, px.shape[2])


# --------------------------------------------------------------------------------------------
# Weights, errors, independence from torch and from the CPU


def test_axis_taps_are_cached_and_never_overflow_int32():
    assert axis_taps(1920, 1344) is axis_taps(1920, 1344)
    assert axis_taps(1920, 1344).weights.shape == (1344, 6)
    for in_size, out_size in ((1920, 1344), (20_000, 100), (4000, 20), (1, 7), (5, 1)):
        assert axis_taps(in_size, out_size).acc_dtype is np.int32
    assert axis_taps(1080, 768).f32_exact and not axis_taps(3840, 768).f32_exact


@pytest.mark.parametrize(
    ("pixels", "size", "match"),
    [
        (np.zeros((4, 4, 3), np.float32), (2, 2), "uint8"),
        (np.zeros((4, 4), np.uint8), (2, 2), "uint8"),
        (np.zeros((0, 4, 3), np.uint8), (2, 2), "empty"),
        (np.zeros((4, 4, 3), np.uint8), (0, 2), "positive"),
        ([[[0, 0, 0]]], (2, 2), "uint8"),
    ],
)
def test_rejects_bad_input(pixels, size, match):
    with pytest.raises(ValueError, match=match):
        resize_bicubic_aa(pixels, *size)


def test_runs_without_torch():
    code = (
        "import sys, numpy as np\n"
        "sys.modules['torch'] = None  # any import of torch now fails\n"
        "from hivig.vision._resample import resize_bicubic_aa\n"
        "out = resize_bicubic_aa(np.zeros((1080, 1920, 3), np.uint8), 768, 1344)\n"
        "assert out.shape == (768, 1344, 3)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


_CASES = [((1080, 1920), (768, 1344)), ((1440, 2560), (768, 1344)), ((100, 200), (128, 256))]
_HASH_SCRIPT = """
import hashlib, json, sys
import numpy as np, torch, torch.nn.functional as F
out = {"capability": torch.backends.cpu.get_cpu_capability(), "hashes": []}
for (h, w), (oh, ow) in json.loads(sys.argv[1]):
    px = np.random.default_rng(h * w).integers(0, 256, (h, w, 4), dtype=np.uint8)
    t = torch.from_numpy(px).unsqueeze(0).permute(0, 3, 1, 2)
    r = F.interpolate(t, size=(oh, ow), mode="bicubic", antialias=True)
    out["hashes"].append(hashlib.sha256(r[0].permute(1, 2, 0).contiguous().numpy()).hexdigest())
print(json.dumps(out))
"""


@pytest.mark.parametrize("capability", ["default", "avx2"])
def test_torch_kernels_agree_with_ours(capability):
    # ATEN_CPU_CAPABILITY=default is torch's scalar kernel, avx2 its SIMD one (avx512 uses the
    # same SIMD kernel): training frames are the same whichever CPU made them, and so are ours.
    env = dict(os.environ, ATEN_CPU_CAPABILITY=capability)
    run = subprocess.run(
        [sys.executable, "-c", _HASH_SCRIPT, json.dumps(_CASES)],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    result = json.loads(run.stdout)
    if result["capability"] != capability.upper():
        pytest.skip(f"this CPU runs torch's {result['capability']} kernel, not {capability}")
    ours = []
    for (h, w), (oh, ow) in _CASES:
        px = np.random.default_rng(h * w).integers(0, 256, (h, w, 4), dtype=np.uint8)
        ours.append(hashlib.sha256(resize_bicubic_aa(px, oh, ow)).hexdigest())
    assert result["hashes"] == ours
