"""The gateway's HTTP routes, one router per resource.

Each route reads its body into a ``serve.protocol`` model (``body``), calls one method of one
service of ``serve.gateway.Gateway`` and dumps the answer object it returns.
"""

from __future__ import annotations

from serve.routes import images, jobs, ops, sessions, stateless

ROUTERS = (sessions.router, stateless.router, images.router, jobs.router, ops.router)

__all__ = ["ROUTERS"]
