"""Runner adapters: the critic inside OSWorld, ScaleCUA, AndroidWorld and Qwen3-VL agent loops.

Each wrapper keeps the harness' own interface and accepts what real agents emit; parsing is the
shared tolerant front door ``hivig.actions.parse_agent_output``, and anything it cannot read is
still critiqued, as raw text.
"""

from serve.adapters._common import NO_ACTION, action_payload, png_size, rgb_png
from serve.adapters.androidworld import GuardedAndroidWorldAgent, StoppedResult, action_dict
from serve.adapters.osworld import GuardedOSWorldAgent, GuardedScaleCUAAgent
from serve.adapters.qwen import GuardedQwenPolicy, qwen_intent, qwen_messages

__all__ = [
    "NO_ACTION",
    "GuardedAndroidWorldAgent",
    "GuardedOSWorldAgent",
    "GuardedQwenPolicy",
    "GuardedScaleCUAAgent",
    "StoppedResult",
    "action_dict",
    "action_payload",
    "png_size",
    "qwen_intent",
    "qwen_messages",
    "rgb_png",
]
