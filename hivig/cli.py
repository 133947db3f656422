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
    hivig profile export-default --out profiles/hivig   # hivig's own interface, as a folder
    hivig profile import-reference --repo HiViG --out profiles/reference   # the authors'
    hivig profile show profiles/reference               # name, digest, settings
    hivig profile check --checkpoint RUN/final --profile profiles/reference

Exit status: 0 on success, 2 on bad input (the reason is printed to stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

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


def _cmd_profile_export_default(args: argparse.Namespace) -> int:
    from hivig.profiles import default_profile

    try:
        folder = default_profile().write(args.out)
    except OSError as e:
        return _fail(f"--out {args.out}: cannot write ({e.strerror}); pass a writable folder")
    print(f"wrote {folder} (profile {default_profile().name}, {default_profile().digest[:12]})")
    return 0


def _cmd_profile_import(args: argparse.Namespace) -> int:
    from hivig.profiles import load_profile
    from hivig.profiles.reference import ReferenceImportError, import_reference

    try:
        import_reference(args.repo, args.out)
        profile = load_profile(args.out)
    except ReferenceImportError as e:
        return _fail(str(e))
    except OSError as e:
        return _fail(f"--out {args.out}: cannot write ({e.strerror}); pass a writable folder")
    print(f"wrote {args.out} (profile {profile.name}, {profile.digest[:12]})")
    return 0


def _cmd_profile_show(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from hivig.profiles import ProfileError, load_profile

    try:
        profile = load_profile(args.folder)
    except ProfileError as e:
        return _fail(str(e))
    print(f"name: {profile.name}\ndigest: {profile.digest}\ndefault: {profile.is_default}")
    for key in ("render", "frame", "generation"):
        print(f"{key}: {json.dumps(asdict(getattr(profile, key)))}")
    return 0


def _cmd_profile_check(args: argparse.Namespace) -> int:
    from hivig.profiles import (
        ProfileError,
        check_served_profile,
        checkpoint_profile,
        resolve_profile,
    )

    if not Path(args.checkpoint, "config.json").is_file():
        return _fail(f"--checkpoint {args.checkpoint} is not a checkpoint folder (no config.json)")
    try:
        served = resolve_profile(args.profile)
        check_served_profile(args.checkpoint, served)
        trained = checkpoint_profile(args.checkpoint)
    except ProfileError as e:
        return _fail(str(e))
    if trained is None:
        print(f"{args.checkpoint} records no profile; serving it with {served.name}")
    else:
        print(f"{args.checkpoint} was trained with {served.name} ({served.digest[:12]})")
    return 0


def _profile_parser(sub: Any) -> None:
    profile = sub.add_parser("profile", help="critic profiles: the interface a critic reads")
    profile_sub = profile.add_subparsers(dest="profile_command", required=True)
    export = profile_sub.add_parser(
        "export-default",
        help="write hivig's own profile as a folder (a starting point for your own)",
        description="Write the default critic profile (templates, action-space and taxonomy "
        "texts, opening summary, chat template, profile.yaml) into --out.",
    )
    export.add_argument("--out", required=True, help="the folder to write")
    export.set_defaults(func=_cmd_profile_export_default)
    imp = profile_sub.add_parser(
        "import-reference",
        help="write the profile of the released HiViG critic from a copy of its repository",
        description="Read the converter scripts of a local copy of the HiViG authors' "
        "repository (revision fd1d4a2; a clone or a downloaded archive) without running them, "
        "and write the profile that reproduces their critique and history inputs. Any other "
        "revision is refused, naming the files that differ.",
    )
    imp.add_argument("--repo", required=True, help="the local copy of G-JWLee/HiViG")
    imp.add_argument("--out", required=True, help="the profile folder to write")
    imp.set_defaults(func=_cmd_profile_import)
    show = profile_sub.add_parser("show", help="print a profile's name, digest and settings")
    show.add_argument("folder", help="a profile folder")
    show.set_defaults(func=_cmd_profile_show)
    check = profile_sub.add_parser(
        "check",
        help="check that a checkpoint is served with the profile it was trained with",
        description="Exit 2 with one line when --checkpoint records another profile than "
        "--profile (the default profile when omitted).",
    )
    check.add_argument("--checkpoint", required=True, help="a checkpoint folder")
    check.add_argument("--profile", default="", help="the profile folder to serve it with")
    check.set_defaults(func=_cmd_profile_check)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``hivig`` command."""
    parser = argparse.ArgumentParser(
        prog="hivig",
        description="Tools over the hivig core library: convert actions between grammars, "
        "draw set-of-mark markers on canonical frames, list the error taxonomy, read a "
        "checkpoint's frame, write and check critic profiles.",
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
    _profile_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``hivig`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
