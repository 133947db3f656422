"""The gateway of one process: its services, composed, and what they share.

Each ``/v1`` route calls one method of one service and dumps the answer object it returns
(``serve.protocol.dump_answer``):

- ``sessions`` (``serve.services.sessions.SessionService``): create, inspect and close sessions,
  hold one per request (a lock per session, and a lock file when processes share the store),
  and the expiry and retention sweep;
- ``steps`` (``serve.services.steps.StepService``): observe and critique, in a session or
  stateless, and the warm-up;
- ``uploads`` (``serve.services.images.ImageService``): ``/v1/images`` and the screenshots of
  every body; the screenshots themselves, their frames and marked copies are ``images``
  (``serve.images.ImageStore``);
- ``diagnoses`` (``serve.services.jobs.JobService``): background diagnosis jobs.

Per session, requests run one at a time, so a runner's retry of a step waits for the first try
and then gets its stored answer instead of applying the step twice.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from hivig.backends import InferenceBackend, backend_png_payloads
from hivig.profiles import load_profile
from hivig.vision import CANONICAL
from serve.config import ServeConfig
from serve.critic import Critic, QueueGate
from serve.images import ImageStore
from serve.metrics import Metrics
from serve.ranking import rank
from serve.services.answers import SCHEMA_VERSION, Versions
from serve.services.images import ImageService
from serve.services.jobs import JobService
from serve.services.sessions import SWEEP_SLICE, SessionService, SweepSteps
from serve.services.steps import StepService
from serve.sessions import SessionStore, open_store
from serve.traces import TraceWriter

logger = logging.getLogger(__name__)

__all__ = ["SCHEMA_VERSION", "SWEEP_SLICE", "Gateway", "rank"]


class Gateway:
    """The services of one gateway process over one store, one image store and one critic."""

    def __init__(self, cfg: ServeConfig, backend: InferenceBackend, model_version: str) -> None:
        """Open the stores under ``cfg.sessions.state_dir`` and wrap ``backend``."""
        state_dir = Path(cfg.sessions.state_dir)
        self.cfg = cfg
        self.model_version = model_version
        self.metrics = Metrics()
        self.store: SessionStore = open_store(cfg.sessions.store, state_dir)
        profile = load_profile(cfg.critic.profile) if cfg.critic.profile else None
        self.images = ImageStore(
            state_dir / "images",
            cfg.frame,
            max_bytes=cfg.limits.max_image_bytes,
            max_pixels=cfg.limits.max_image_pixels,
            large_pixels=cfg.limits.large_image_pixels,
            large_lanes=cfg.limits.large_image_lanes,
            cache_size=cfg.sessions.frame_cache,
            # A backend that sends PNGs (the OpenAI transport) is handed the frames' PNGs
            # made here, in the cache it sends them from.
            payloads=backend_png_payloads(backend),
            policy=profile.frame if profile is not None else CANONICAL,
        )
        self.traces = TraceWriter(state_dir / "traces", self.metrics)
        self.queue = QueueGate(cfg.limits.max_queue, cfg.limits.retry_after_s, self.metrics)
        self.critic = Critic(backend, cfg, self.images, self.metrics, self.queue, profile)
        versions = Versions(model_version, self.critic.prompt_version)
        self.sessions = SessionService(cfg, self.store, self.traces, self.metrics, versions)
        self.uploads = ImageService(self.images, self.critic.budget.observe_deadline_s, versions)
        self.steps = StepService(
            cfg,
            self.sessions,
            self.uploads,
            self.critic,
            self.queue,
            self.traces,
            self.metrics,
            versions,
        )
        self.diagnoses = JobService(cfg, backend, self.traces, versions)
        # One thread for the sweep: its slices never take a place of the default executor,
        # which model calls share, and two sweeps never overlap.
        self._sweeper = ThreadPoolExecutor(1, thread_name_prefix="hivig-sweep")
        self.metrics.sessions_open.set(self.store.count_open())

    @property
    def jobs(self) -> dict[str, Any]:
        """The diagnosis jobs this process knows in memory, by id."""
        return self.diagnoses.jobs

    def versions(self) -> dict[str, str]:
        """The versions every answer carries."""
        return self.sessions.versions()

    def close(self) -> None:
        """Release the stores (trace events still waiting get a last try)."""
        left = self.traces.flush()
        if left:
            logger.error(
                "%d trace events could not be written to %s and are lost", left, self.traces.root
            )
        self.store.close()
        self.images.close()

    # -- the sweep: expiry and retention -------------------------------------------------------

    async def sweep(self) -> list[str]:
        """Close idle sessions and apply ``retention``, off the event loop; the expired ids.

        The store and file work runs on a thread of its own, one bounded slice at a time (one
        transaction of at most ``SWEEP_SLICE`` sessions): a request waits for the store at most
        one slice, and nothing else waits at all.
        """
        loop = asyncio.get_running_loop()
        steps = self._sweep()
        done: Any = None
        while True:
            try:
                work = steps.send(done)
            except StopIteration as stop:
                return stop.value
            done = await loop.run_in_executor(self._sweeper, work)

    def stop_sweeps(self) -> None:
        """Wait for a sweep slice still running, and let the sweep thread go."""
        self._sweeper.shutdown(wait=True)

    def expire(self) -> list[str]:
        """The same sweep, run here and now (tests, tools); the expired ids."""
        steps = self._sweep()
        done: Any = None
        while True:
            try:
                work = steps.send(done)
            except StopIteration as stop:
                return stop.value
            done = work()

    def _sweep(self) -> SweepSteps:
        gone = yield from self.sessions.sweep_steps()
        yield from self.diagnoses.sweep_steps()
        self.metrics.sessions_open.set((yield self.store.count_open))
        return gone
