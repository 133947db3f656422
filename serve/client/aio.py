"""The asynchronous client: ``AsyncCriticClient`` and its ``AsyncSession``, over
``httpx.AsyncClient``; the same requests and behaviour as ``serve.client.sync``."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from serve.client.config import ClientConfig, client_config
from serve.client.flows import (
    Request,
    ReseedStatus,
    Run,
    SessionState,
    SessionView,
    diagnose_request,
    job_request,
    ready_request,
)
from serve.client.payloads import ActionInput, ImageInput, sendable, session_body
from serve.client.results import Job, Observation, Ranking, Verdict
from serve.client.transport import (
    ASYNC_TIMEOUTS,
    Attempt,
    Call,
    CircuitBreaker,
    Pause,
    Reply,
    Transport,
)


class AsyncCriticClient:
    """Asynchronous gateway client over one persistent ``httpx.AsyncClient`` (same arguments
    and behaviour as ``CriticClient``)."""

    def __init__(
        self,
        base_url: str | None = None,
        config: ClientConfig | None = None,
        *,
        token: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        breaker: CircuitBreaker | None = None,
    ) -> None:
        """A client of the gateway at ``base_url`` (see ``CriticClient.__init__``; ``transport``
        is an ``httpx.AsyncBaseTransport``)."""
        self._transport = Transport(client_config(base_url, config, token), breaker)
        self.config, self.breaker = self._transport.config, self._transport.breaker
        self._http = httpx.AsyncClient(transport=transport, **self._transport.http_options())

    async def _send(self, call: Call) -> Reply:
        """Drive ``call_flow`` over ``httpx.AsyncClient`` (the same loop as the sync one)."""
        run = Run(self._transport.flow(call, ASYNC_TIMEOUTS))
        while not run.done:
            try:
                outcome = await self._perform(run.step)
            except BaseException as exc:  # noqa: BLE001 - the flow records it, re-raises
                run.throw(exc)
            else:
                run.send(outcome)
        return run.value

    async def _perform(self, step: Attempt | Pause) -> httpx.Response | None:
        if isinstance(step, Pause):
            await asyncio.sleep(step.seconds)
            return None
        args, kwargs = self._transport.request_args(step)
        # wait_for bounds the whole attempt, including a transport that ignores timeouts.
        return await asyncio.wait_for(self._http.request(*args, **kwargs), step.timeout_s)

    async def _drive(self, request: Request) -> Any:
        """Run a request to its result (see ``CriticClient._drive``)."""
        try:
            run = Run(request.flow)
            while not run.done:
                run.send(await self._send(sendable(run.step)))
        except Exception:  # noqa: BLE001 - the agent loop must never see a client error
            return request.fail_open()
        return run.value

    async def start(
        self,
        task: str,
        platform: str,
        screen: tuple[int, int] | dict[str, int],
        coord_space: str = "screen_px",
        *,
        frame: tuple[int, int] | dict[str, int] | None = None,
        action_format: str = "auto",
        policy_id: str | None = None,
        volatile_regions: list[list[int]] | None = None,
    ) -> AsyncSession:
        """Open a session (see ``CriticClient.start``)."""
        body = session_body(
            task, platform, screen, coord_space, frame, action_format, policy_id, volatile_regions
        )
        state = SessionState(self.config, body, self._transport.deadlines)
        await self._drive(state.start_request())
        return AsyncSession(self, state)

    async def ready(self) -> bool:
        """Whether the gateway reports ready; False on any failure."""
        return bool(await self._drive(ready_request(self.config)))

    async def diagnose(self, path: str) -> Job:
        """Start a diagnosis job."""
        return await self._drive(diagnose_request(self.config, path))

    async def job(self, job_id: str) -> Job:
        """Poll a diagnosis job."""
        return await self._drive(job_request(self.config, job_id))

    async def aclose(self) -> None:
        """Close the HTTP connection pool."""
        await self._http.aclose()

    async def __aenter__(self) -> AsyncCriticClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class AsyncSession(SessionView):
    """One episode's gateway session (async); same methods as ``Session``, awaitable."""

    _client: AsyncCriticClient

    async def observe(
        self, step_idx: int, png: ImageInput, prev_action: ActionInput | None = None
    ) -> Observation:
        """See ``Session.observe``."""
        return await self._client._drive(self._state.observe_request(step_idx, png, prev_action))

    async def critique(
        self,
        step_idx: int,
        action: ActionInput | None = None,
        candidates: list[ActionInput] | None = None,
        *,
        png: ImageInput | None = None,
        return_image: bool = False,
        return_thinking: bool = False,
    ) -> Verdict | Ranking:
        """See ``Session.critique``."""
        request = self._state.critique_request(
            step_idx, action, candidates, png, return_image, return_thinking
        )
        return await self._client._drive(request)

    async def reseed(self, echo: dict[str, Any]) -> bool:
        """See ``Session.reseed``."""
        return await self.reseed_status(echo) == "rebuilt"

    async def reseed_status(self, echo: dict[str, Any]) -> ReseedStatus:
        """See ``Session.reseed_status``."""
        return await self._client._drive(self._state.reseed_request(echo))

    async def close(self, outcome: str | None = None) -> bool:
        """See ``Session.close``."""
        return bool(await self._client._drive(self._state.close_request(outcome)))
