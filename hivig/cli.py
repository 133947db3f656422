r"""The ``hivig`` command: small user-facing tools over the core library.

Examples::

    hivig action convert --from scalecua --to qwen --platform windows --width 1920 --height 1080 \
        $'moveTo(x=0.1, y=0.2)\ndragTo(x=0.5, y=0.2)'
    hivig action convert --from osworld --to json --width 1920 --height 1080 \
        "pyautogui.click(960, 540)"
    hivig mark --image shot.png --out marked.png --action "$(cat call.txt)"   # <tool_call> blocks
    hivig taxonomy
    hivig checkpoint frame RUN/final      # the frame a checkpoint was trained with: "MIN MAX"
    hivig checkpoint context RUN/final    # the context length to serve it with

Exit status: 0 on success, 2 on bad input (the reason is printed to stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from hivig import __version__
from hivig.actions import PLATFORMS

EXIT_BAD_INPUT = 2


def _fail(message: str) -> int:
    print(f"hivig: error: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT


def _parse_actions(args: argparse.Namespace):
    """Parse ``args.text`` with the chosen source grammar; returns actions or an ActionError."""
    from hivig import actions as A

    text = sys.stdin.read() if args.text == "-" else args.text
    if args.source == "scalecua":
        platform = args.platform or "windows"
        parsed = A.parse_scalecua(text, platform, args.width, args.height)
        return parsed if isinstance(parsed, A.ActionError) else list(parsed.actions)
    if args.source == "qwen":
        return A.parse_tool_calls(text)
    return A.parse_osworld(text, args.width, args.height)


def _target_space(args: argparse.Namespace, actions: list) -> str:
    """The tool space to render into: the platform's, else one that holds every action."""
    from hivig import actions as A

    if args.platform is not None:
        return A.space_for_platform(args.platform)
    for space in ("computer_use", "mobile_use"):
        if all(A.in_space(a, space) for a in actions):
            return space
    return "computer_use"


def _cmd_action_convert(args: argparse.Namespace) -> int:
    from hivig import actions as A

    result = _parse_actions(args)
    if isinstance(result, A.ActionError):
        return _fail(f"{result.reason}: {result.message}")
    if not result:
        return _fail("no action found in the input")
    try:
        if args.target == "json":
            text = json.dumps([a.to_arguments() for a in result], ensure_ascii=False)
        else:
            text = A.render_tool_calls(result, _target_space(args, result))
    except A.ActionError as e:  # e.g. call_user, or an action outside the platform's space
        return _fail(f"{e.reason}: {e.message}")
    print(text)
    return 0


def _cmd_mark(args: argparse.Namespace) -> int:
    from hivig import actions as A
    from hivig import vision as V

    actions = A.parse_tool_calls(args.action)
    if isinstance(actions, A.ActionError):
        return _fail(f"{actions.reason}: {actions.message}")
    marks = A.marks_for_actions(actions)
    try:
        image = V.load_image(args.image)
    except (OSError, V.ImageError) as e:
        return _fail(f"cannot read {args.image}: {e}")
    size_class = V.size_class_for_platform(args.platform)
    if not args.out.lower().endswith(".png"):
        return _fail(f"--out must be a .png path (markers need lossless pixels): {args.out}")
    try:
        frame = V.canonical_frame(
            image,
            min_pixels=args.min_pixels,
            max_pixels=args.max_pixels,
            marks=marks,
            size_class=size_class,
        )
        frame.save(args.out, format="PNG")
    except ValueError as e:  # an impossible pixel budget
        return _fail(str(e))
    except OSError as e:
        return _fail(f"cannot write {args.out}: {e}")
    print(f"wrote {args.out} ({frame.width}x{frame.height}, {len(marks)} marker(s))")
    return 0


def _cmd_taxonomy(args: argparse.Namespace) -> int:
    from hivig.taxonomy import DIMENSIONS

    if args.json:
        rows = [
            {
                "name": d.name,
                "group": d.group,
                "requires_intent": d.requires_intent,
                "generators": list(d.generators),
                "definition": d.definition,
            }
            for d in DIMENSIONS
        ]
        print(json.dumps(rows, indent=2, ensure_ascii=False))
        return 0
    for i, d in enumerate(DIMENSIONS, 1):
        print(f"{i:2d}. {d.name:<34} {d.group:<15} {'/'.join(d.generators)}")
    return 0


def _cmd_checkpoint_frame(args: argparse.Namespace) -> int:
    from hivig.checkpoint_files import CheckpointError, read_frame

    try:
        lo, hi = read_frame(args.path)
    except CheckpointError as e:
        return _fail(str(e))
    print(f"{lo} {hi}")
    return 0


def _cmd_checkpoint_context(args: argparse.Namespace) -> int:
    from hivig.checkpoint_files import CheckpointError, read_context_length

    try:
        print(read_context_length(args.path, args.cap))
    except CheckpointError as e:
        return _fail(str(e))
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``hivig`` command."""
    parser = argparse.ArgumentParser(
        prog="hivig",
        description="Tools over the hivig core library: convert actions between grammars, "
        "draw set-of-mark markers on canonical frames, list the error taxonomy, read a "
        "checkpoint's frame.",
    )
    parser.add_argument("--version", action="version", version=f"hivig {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    action = sub.add_parser("action", help="action grammar tools")
    action_sub = action.add_subparsers(dest="action_command", required=True)
    convert = action_sub.add_parser(
        "convert",
        help="convert an action between ScaleCUA, Qwen3-VL and OSWorld grammars",
        description="Parse an action in one grammar and print it as Qwen3-VL <tool_call> "
        "blocks or as a JSON list of tool-call argument objects (0-1000 grid). "
        "Multi-line input: pass real newlines (e.g. $'a\\nb' in bash) or '-' to read stdin.",
    )
    convert.add_argument(
        "--from", dest="source", choices=("scalecua", "qwen", "osworld"), required=True
    )
    convert.add_argument("--to", dest="target", choices=("qwen", "json"), default="qwen")
    convert.add_argument(
        "--platform",
        choices=PLATFORMS,
        default=None,
        help="screen platform (ScaleCUA input defaults to windows; the output space follows it)",
    )
    convert.add_argument("--width", type=int, default=1920, help="screenshot width in pixels")
    convert.add_argument("--height", type=int, default=1080, help="screenshot height in pixels")
    convert.add_argument("text", help="the action text, or - to read it from stdin")
    convert.set_defaults(func=_cmd_action_convert)

    mark = sub.add_parser(
        "mark",
        help="write the canonical frame of a screenshot with the action's marker(s) drawn",
        description="Resize a screenshot to the canonical frame (smart_resize, factor 32) and "
        "draw a red open-centre X for point actions and a blue arrow for drags and swipes.",
    )
    mark.add_argument("--image", required=True, help="input screenshot (PNG or JPEG)")
    mark.add_argument("--action", required=True, help="one or more <tool_call> blocks")
    mark.add_argument("--out", required=True, help="output PNG path")
    mark.add_argument("--max-pixels", type=int, default=1_048_576, help="frame area cap in pixels")
    mark.add_argument("--min-pixels", type=int, default=65_536, help="frame area floor in pixels")
    mark.add_argument(
        "--platform",
        choices=PLATFORMS,
        default=None,
        help="marker size class (android = mobile); by default portrait frames are mobile",
    )
    mark.set_defaults(func=_cmd_mark)

    tax = sub.add_parser("taxonomy", help="list the 12 error dimensions")
    tax.add_argument("--json", action="store_true", help="print definitions as JSON")
    tax.set_defaults(func=_cmd_taxonomy)

    ckpt = sub.add_parser("checkpoint", help="read a saved checkpoint's files")
    ckpt_sub = ckpt.add_subparsers(dest="checkpoint_command", required=True)
    frame = ckpt_sub.add_parser(
        "frame",
        help="print the pixel budget the checkpoint was trained with: MIN_PIXELS MAX_PIXELS",
        description="Read the image processor's size from processor_config.json (transformers "
        "5) or preprocessor_config.json (4.57). vLLM and the gateway must use this frame.",
    )
    frame.add_argument("path", help="a checkpoint folder written by train/ (RUN/final)")
    frame.set_defaults(func=_cmd_checkpoint_frame)
    context = ckpt_sub.add_parser(
        "context",
        help="print the context length to serve the checkpoint with (vLLM --max-model-len)",
        description="Read max_position_embeddings from config.json and print it, capped at "
        "--cap: vLLM refuses a --max-model-len above the model's own limit.",
    )
    context.add_argument("path", help="a checkpoint folder (RUN/final, RUN/merged)")
    context.add_argument(
        "--cap", type=int, default=16_384, help="upper bound (default 16384, the critic's need)"
    )
    context.set_defaults(func=_cmd_checkpoint_context)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``hivig`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
