"""The client's limits and switches (``ClientConfig``), and the arguments both clients take."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class ClientConfig:
    """Client limits and switches (all YAML-able).

    Attributes:
        base_url: Gateway root, e.g. ``http://127.0.0.1:8080``.
        token: Bearer token, when the gateway has auth on.
        connect_timeout_s: TCP connect timeout of each attempt.
        observe_deadline_s: How long the gateway may take over one observe, in seconds;
            ``None`` (default): the gateway's own ``critic.observe_deadline_s``, read from
            ``/v1/info``. The client waits this plus ``deadline_grace_s``, retries included.
        critique_deadline_s: The same for one critique (``critic.critique_deadline_s``).
        deadline_grace_s: Seconds the client waits beyond the gateway's deadline (network,
            image decoding, queueing), so the gateway's degraded answer is not thrown away.
        session_deadline_s: Total time for session create/close and job calls.
        retries: Extra attempts after a retryable failure (transport, 429, 502-504).
        retry_jitter_s: Upper end of the random pause before a retry.
        breaker_failures: Consecutive failures that open the circuit breaker.
        breaker_open_s: How long the breaker stays open before one probe is let through.
        resend_smaller: On 413, shrink the screenshot once and resend it.
    """

    base_url: str = "http://127.0.0.1:8080"
    token: str | None = None
    connect_timeout_s: float = 2.0
    observe_deadline_s: float | None = None
    critique_deadline_s: float | None = None
    deadline_grace_s: float = 2.0
    session_deadline_s: float = 8.0
    retries: int = 1
    retry_jitter_s: float = 0.25
    breaker_failures: int = 5
    breaker_open_s: float = 60.0
    resend_smaller: bool = True

    def __post_init__(self) -> None:
        limits = [
            self.connect_timeout_s,
            self.observe_deadline_s,
            self.critique_deadline_s,
            self.session_deadline_s,
        ]
        if min(v for v in limits if v is not None) <= 0 or self.deadline_grace_s < 0:
            raise ValueError("client: timeouts and deadlines > 0, deadline_grace_s >= 0")
        if self.retries < 0 or self.retry_jitter_s < 0:
            raise ValueError("client: retries and jitter >= 0")
        if self.breaker_failures < 1 or self.breaker_open_s < 0:
            raise ValueError("client: breaker_failures >= 1, breaker_open_s >= 0")


def client_config(
    base_url: str | None, config: ClientConfig | None, token: str | None
) -> ClientConfig:
    """``config`` (the defaults when ``None``) with ``base_url`` and ``token`` put in when given,
    as both clients' constructors take them."""
    cfg = config or ClientConfig()
    if base_url is not None:
        cfg = replace(cfg, base_url=base_url)
    if token is not None:
        cfg = replace(cfg, token=token)
    return cfg
