"""Critic profiles: the whole input interface a critic was trained with, in one folder.

``default_profile()`` is hivig's own interface; ``load_profile(DIR)`` reads a folder written by
``Profile.write`` or by ``hivig profile import-reference`` (the HiViG authors' interface, read
from a local copy of their repository). See ``_profile.py`` for the folder layout.
"""

from hivig.profiles._profile import (
    CHECKPOINT_PROFILE_DIR,
    PROFILE_FILES,
    FramePolicy,
    GenerationBudget,
    Profile,
    ProfileError,
    RenderPolicy,
    check_served_profile,
    checkpoint_profile,
    default_profile,
    load_profile,
    resolve_profile,
)

__all__ = [
    "CHECKPOINT_PROFILE_DIR",
    "PROFILE_FILES",
    "FramePolicy",
    "GenerationBudget",
    "Profile",
    "ProfileError",
    "RenderPolicy",
    "check_served_profile",
    "checkpoint_profile",
    "default_profile",
    "load_profile",
    "resolve_profile",
]
