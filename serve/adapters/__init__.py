"""Runner adapters: the critic inside OSWorld, WindowsAgentArena, WebArenaLiteV2, AndroidLab,
AndroidWorld, ScaleCUA and Qwen3-VL agent loops.

Each wrapper keeps the harness' own interface and accepts what real agents emit; parsing is the
shared tolerant front door ``hivig.actions.parse_agent_output``, and anything it cannot read is
still critiqued, as raw text.
"""

from serve.adapters._common import (
    MEMORY_ATTRS,
    NO_ACTION,
    VERBATIM,
    action_payload,
    png_size,
    rgb_png,
    well_formed,
)
from serve.adapters._presets import ANDROIDLAB, WAA, WEBARENA_LITE, RunnerPreset
from serve.adapters.androidlab import ANDROIDLAB_STOP, GuardedAndroidLabAgent, runs_on_androidlab
from serve.adapters.androidworld import (
    GuardedAndroidWorldAgent,
    StepCommands,
    StoppedResult,
    action_dict,
    resolve_index,
)
from serve.adapters.osworld import GuardedOSWorldAgent, GuardedScaleCUAAgent
from serve.adapters.qwen import TOOL_CALL_FORMAT, GuardedQwenPolicy, qwen_intent, qwen_messages
from serve.adapters.waa import WAA_STOP_ACTIONS, GuardedWAAAgent
from serve.adapters.webarena_lite import (
    STOP_CODE,
    WEBARENA_MEMORY_ATTRS,
    GuardedWebArenaLiteAgent,
    code_text,
    planner_feedback,
)

__all__ = [
    "ANDROIDLAB",
    "ANDROIDLAB_STOP",
    "MEMORY_ATTRS",
    "NO_ACTION",
    "STOP_CODE",
    "TOOL_CALL_FORMAT",
    "VERBATIM",
    "WAA",
    "WAA_STOP_ACTIONS",
    "WEBARENA_LITE",
    "WEBARENA_MEMORY_ATTRS",
    "GuardedAndroidLabAgent",
    "GuardedAndroidWorldAgent",
    "GuardedOSWorldAgent",
    "GuardedQwenPolicy",
    "GuardedScaleCUAAgent",
    "GuardedWAAAgent",
    "GuardedWebArenaLiteAgent",
    "RunnerPreset",
    "StepCommands",
    "StoppedResult",
    "action_dict",
    "action_payload",
    "code_text",
    "planner_feedback",
    "png_size",
    "qwen_intent",
    "qwen_messages",
    "resolve_index",
    "runs_on_androidlab",
    "rgb_png",
    "well_formed",
]
