"""The gateway's HTTP routes, one router per resource.

Each route reads its body into a ``serve.protocol`` model (``body``), hands it to
``serve.gateway.Gateway`` and answers with what the gateway returns.
"""

from __future__ import annotations

from serve.routes import images, jobs, ops, sessions, stateless

ROUTERS = (sessions.router, stateless.router, images.router, jobs.router, ops.router)

__all__ = ["ROUTERS"]
