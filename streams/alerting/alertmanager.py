"""Delivery of alert transitions to Alertmanager's API v2 (``POST {url}/api/v2/alerts``).

Alertmanager identifies an alert by its labels; ``startsAt``/``endsAt`` are wall-clock times at delivery
(event-time identity stays in the ``alerts`` table). A firing alert is sent with ``endsAt`` a few re-send
intervals ahead and re-sent before that passes, so an evaluator that dies lets its alerts expire instead
of paging forever; a resolution is the same labels with ``endsAt = now``.

The client never raises on network or HTTP errors: :meth:`AlertmanagerClient.post` retries with
exponential back-off and returns ``False`` when every attempt failed, so the caller keeps the delivery
pending (the outbox) and tries again later.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import aiohttp

from streams.rules.links import AlertLinks
from streams.rules.model import AlertTransition
from streams.settings import redact_password, redact_url

log = logging.getLogger(__name__)

#: HTTP statuses worth retrying; any other 4xx is a bad payload and retrying cannot fix it.
RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})
#: Statuses by which Alertmanager refuses the alerts themselves (API v2 validates every alert of a POST and
#: answers 400 for one bad one). Others that are not retried (401, 403, 404: a proxy, a wrong URL) are the
#: configuration's fault: the alerts stay owed until it is fixed.
PAYLOAD_REFUSED_STATUS = frozenset({400, 422})


class AlertSink(Protocol):
    """Where alert batches go: the Alertmanager client, or a fake in unit tests.

    ``refusal``: after a failed :meth:`post`, why Alertmanager refused the alerts themselves (posting them
    again cannot succeed), else None (unreachable, overloaded or misconfigured: worth retrying)."""

    refusal: str | None

    async def post(self, alerts: Sequence[Mapping[str, Any]]) -> bool: ...


def _rfc3339(when: datetime) -> str:
    return when.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def alertmanager_alert(
    transition: AlertTransition,
    *,
    now: datetime,
    ends_in: timedelta,
    starts_at: datetime | None = None,
    links: AlertLinks | None = None,
) -> dict[str, Any]:
    """The API v2 JSON object of one transition at wall time ``now``.

    Firing: ``endsAt = now + ends_in``. Resolved: ``endsAt = now``. Numbers become string annotations
    (Alertmanager annotations are strings); labels stay free of numbers. ``links`` (the deployment's, see
    :mod:`streams.rules.links`) set ``runbook_url`` and ``dashboard_url`` for every alert, whoever made it;
    ``generatorURL`` is the ``dashboard_url``.
    """
    annotations = dict(transition.annotations)
    if links is not None:
        annotations |= links.annotations(transition)
    for name, value in sorted(transition.numbers.items()):
        annotations[name] = f"{value:.6g}"
    start = starts_at if starts_at is not None and starts_at <= now else now
    end = now if transition.state == "resolved" else now + ends_in
    alert = {
        "labels": dict(transition.labels),
        "annotations": annotations,
        "startsAt": _rfc3339(start),
        "endsAt": _rfc3339(end),
    }
    if annotations.get("dashboard_url"):
        alert["generatorURL"] = annotations["dashboard_url"]
    return alert


class AlertmanagerClient:
    """An aiohttp client for one Alertmanager (or an HA pair behind one URL)."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 5.0,
        attempts: int = 3,
        backoff_s: float = 0.5,
        backoff_max_s: float = 5.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.endpoint = url.rstrip("/") + "/api/v2/alerts"
        #: What logs show: the endpoint without a password (the URL may hold credentials).
        self.shown_endpoint = redact_url(self.endpoint)
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._attempts = max(1, attempts)
        self._backoff_s = backoff_s
        self._backoff_max_s = backoff_max_s
        self._sleep = sleep
        self._session: aiohttp.ClientSession | None = None
        #: Outcome counters for metrics: posts that succeeded, failed attempts, posts given up.
        self.sent = 0
        self.failed_attempts = 0
        self.given_up = 0
        #: Why the last failed post's alerts were refused (status and Alertmanager's answer), else None.
        self.refusal: str | None = None

    async def __aenter__(self) -> AlertmanagerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the HTTP session (idempotent)."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def post(self, alerts: Sequence[Mapping[str, Any]]) -> bool:
        """POST a batch of API v2 alert objects; ``True`` once Alertmanager accepted it.

        Retries connection errors, timeouts and 408/429/5xx with exponential back-off; any other
        status is logged and returned as ``False`` at once.
        """
        self.refusal = None
        if not alerts:
            return True
        delay = self._backoff_s
        for attempt in range(1, self._attempts + 1):
            outcome = await self._post_once(list(alerts))
            if outcome is True:
                self.sent += 1
                return True
            self.failed_attempts += 1
            if outcome is False or attempt == self._attempts:
                break
            await self._sleep(delay)
            delay = min(delay * 2.0, self._backoff_max_s)
        self.given_up += 1
        return False

    async def _post_once(self, body: list[Mapping[str, Any]]) -> bool | None:
        """``True`` accepted, ``None`` retryable failure, ``False`` permanent failure."""
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        try:
            async with self._session.post(self.endpoint, json=body) as response:
                if 200 <= response.status < 300:
                    return True
                text = (await response.text())[:500]
                log.warning("alertmanager %s answered %s: %s", self.shown_endpoint, response.status, text)
                if response.status in PAYLOAD_REFUSED_STATUS:
                    self.refusal = f"{response.status}: {text.strip()}"
                return None if response.status in RETRYABLE_STATUS else False
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            # aiohttp's errors may repeat the URL (an invalid URL is its whole message): scrub the password.
            reason = redact_password(str(exc), self.endpoint)
            log.warning("alertmanager %s unreachable: %s", self.shown_endpoint, reason)
            return None
