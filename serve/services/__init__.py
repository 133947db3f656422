"""The gateway's services, one per API family; ``serve.gateway.Gateway`` composes them.

- ``sessions``: ``SessionService`` (create, get, close, per-session locks, the sweep);
- ``steps``: ``StepService`` (observe and critique, in a session or stateless; warm-up);
- ``images``: ``ImageService`` (uploads and the screenshots of request bodies);
- ``jobs``: ``JobService`` (background diagnosis jobs and their ``job.json``);
- ``answers``: the versions every answer carries, the trace flag.
"""

from serve.services.answers import SCHEMA_VERSION, Versions
from serve.services.images import ImageService
from serve.services.jobs import JobRecord, JobService
from serve.services.sessions import SessionService
from serve.services.steps import StepService

__all__ = [
    "SCHEMA_VERSION",
    "ImageService",
    "JobRecord",
    "JobService",
    "SessionService",
    "StepService",
    "Versions",
]
