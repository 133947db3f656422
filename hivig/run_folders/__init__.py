"""Agent runs on disk -> plain step records: benchmark result folders and gateway traces.

Covers OSWorld, WindowsAgentArena, AndroidLab, WebArenaLiteV2, AndroidWorld and the gateway's
own session traces. Each benchmark writes one folder (or file) per task, in its own layout:

* **OSWorld** (``osworld``): ``traj.jsonl``, one line per executed action (``step_num``,
  ``action_timestamp``, ``action`` as pyautogui code or ``WAIT``/``DONE``/``FAIL``, ``reward``,
  ``done``, ``info``, ``screenshot_file`` = ``step_{n}_{ts}.png`` taken after it; many forks add
  ``response``), ``{"Error": ...}`` lines a crashed step leaves, and ``result.txt`` (the score).
* **WindowsAgentArena** (``windowsagentarena``): ``traj.jsonl`` with a reset line (``step_num``
  0, ``action`` null, ``screenshot`` = the first screen), then one line per executed action
  (``step_num``, ``action_timestamp``, ``action`` as pyautogui code or ``DONE``/``FAIL``/``WAIT``,
  ``reward``, ``done``, ``info``, ``screenshot`` = ``screenshot-step_N_ts.png`` taken after it,
  the agent's ``response``/``agent_raw_response``); ``result.txt`` holds the score.
* **AndroidLab** (``androidlab``): ``{task}_{ts}/traces/trace.jsonl``, one line per step
  (``index``, ``image`` = the screen before acting, saved under ``Screen/``, ``xml``,
  ``parsed_action`` = what the executor did, ``current_response`` = the agent's
  ``<think>/<operation>/<action>`` text, ``target`` = the instruction). Success is decided by a
  separate evaluation pass that writes ``results.jsonl`` lines (``task_id``, ``result.complete``).
* **WebArenaLiteV2** (``webarena``): ``results/{exp}/{task}/trajectory/{idx}.png`` (the screen
  before step ``idx``), ``result.json`` (``task``, and per step lists ``thought``,
  ``operation``, ``actions``), and ``results/{exp}/results.jsonl`` with the ``metric`` per task.
* **AndroidWorld** (``androidworld``): the checkpointer's ``{task}_{instance}.pkl.gz``, a
  gzipped pickle of a list of episode dicts (``goal``, ``task_template``, ``instance_id``,
  ``is_successful``, ``episode_data`` = per-step lists such as ``response``/``operation`` of the
  ScaleCUA agent or ``raw_screenshot``/``action_output`` of M3A-style agents). It is read with
  ``InertUnpickler``, which never imports or calls anything the file names (see there).
* **Gateway trace** (``trace``): ``<state_dir>/traces/<sid>.jsonl``, one event per line
  (``session``, ``observe``, ``critique``, ``close``), screenshots ``<state_dir>/images/<hex>.png``.

Platform and screen come from the run: the screen from the PNG header of a screenshot (no
decoding), the platform from the benchmark. A line that cannot be used is skipped with a reason,
never raised. Readers take one task folder; ``task_folders`` lists the task folders of a results
root. Only the standard library and ``hivig`` are used, so any stage can read these folders.
"""

from hivig.run_folders._base import (
    ANDROIDLAB_PIXELS,
    ANDROIDWORLD_PIXELS,
    DEFAULT_SCREEN,
    LAYOUTS,
    OSWORLD_PLATFORM,
    QWEN25_FACTOR,
    WEBARENA_PIXELS,
    FolderRun,
    FolderStep,
    pixel_calls,
    png_size,
)
from hivig.run_folders._detect import detect_layout, read_folder, task_folders
from hivig.run_folders.androidlab import read_androidlab
from hivig.run_folders.androidworld import (
    InertUnpickler,
    Pickled,
    array_pixels,
    load_pickle_inert,
    plain,
    read_androidworld,
)
from hivig.run_folders.osworld import parse_osworld_action, read_osworld, strip_thought_strings
from hivig.run_folders.trace import (
    TraceEvents,
    critique_pairs,
    final_action,
    matching_verdicts,
    read_trace,
    trace_action,
    trace_events,
    trace_image,
    trace_session_fields,
    trace_verdict,
)
from hivig.run_folders.waa import read_windowsagentarena
from hivig.run_folders.webarena import read_webarena

__all__ = [
    "critique_pairs",
    "final_action",
    "ANDROIDLAB_PIXELS",
    "ANDROIDWORLD_PIXELS",
    "DEFAULT_SCREEN",
    "FolderRun",
    "FolderStep",
    "InertUnpickler",
    "LAYOUTS",
    "OSWORLD_PLATFORM",
    "Pickled",
    "QWEN25_FACTOR",
    "TraceEvents",
    "WEBARENA_PIXELS",
    "array_pixels",
    "detect_layout",
    "load_pickle_inert",
    "matching_verdicts",
    "parse_osworld_action",
    "pixel_calls",
    "plain",
    "png_size",
    "read_androidlab",
    "read_androidworld",
    "read_folder",
    "read_osworld",
    "read_trace",
    "read_webarena",
    "read_windowsagentarena",
    "strip_thought_strings",
    "task_folders",
    "trace_action",
    "trace_events",
    "trace_image",
    "trace_session_fields",
    "trace_verdict",
]
