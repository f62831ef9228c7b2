"""``ttft grafana push``: create or update the folder, the ClickHouse data source and the dashboards.

Idempotent: every object is read first and written only when it differs from what the repository
builds, so a second push changes nothing and says so. Credentials come from the environment only
(``TTFT_GRAFANA_TOKEN``, or ``TTFT_GRAFANA_USER`` + ``TTFT_GRAFANA_PASSWORD``); a URL with credentials in
it is refused, so no secret ever sits on a command line or in shell history.

The data source's password (``TTFT_GRAFANA_CLICKHOUSE_PASSWORD``) cannot be read back from Grafana: the
data source is compared on its visible fields and on whether a password is set, and ``force`` rewrites
everything (use it after rotating the password).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal
from urllib.parse import urlsplit

from grafana_client.api import GrafanaApi
from grafana_client.client import GrafanaClientError, GrafanaException, GrafanaServerError

from streams.grafana.model import DATASOURCE_TYPE, DATASOURCE_UID
from streams.settings import redact_password, redact_url

TOKEN_ENV: Final = "TTFT_GRAFANA_TOKEN"
USER_ENV: Final = "TTFT_GRAFANA_USER"
PASSWORD_ENV: Final = "TTFT_GRAFANA_PASSWORD"
CLICKHOUSE_PASSWORD_ENV: Final = "TTFT_GRAFANA_CLICKHOUSE_PASSWORD"
#: The data source's ClickHouse user: ``grafana_ro`` of deploy/clickhouse/users.xml on a server; ``default``
#: for the writer's embedded-store interface (read-only whatever the user does).
CLICKHOUSE_USER_ENV: Final = "TTFT_GRAFANA_CLICKHOUSE_USER"
READ_ONLY_USER: Final = "grafana_ro"
DEFAULT_FOLDER_UID: Final = "ttft"
DEFAULT_FOLDER_TITLE: Final = "TTFT"
TIMEOUT_S: Final = 10.0
_VOLATILE: Final = ("id", "version")

Action = Literal["created", "updated", "unchanged"]


class PushError(RuntimeError):
    """A push that cannot proceed: bad configuration, refused credentials or an unreachable Grafana."""


@dataclass(frozen=True, slots=True)
class Change:
    """What a push did to one object."""

    kind: str
    name: str
    action: Action

    def __str__(self) -> str:
        return f"{self.action:<9} {self.kind} {self.name}"


def credentials(env: Mapping[str, str]) -> str | tuple[str, str]:
    """A token, or (user, password), from the environment; :class:`PushError` when neither is set."""
    token = env.get(TOKEN_ENV, "")
    if token:
        return token
    user, password = env.get(USER_ENV, ""), env.get(PASSWORD_ENV, "")
    if user and password:
        return (user, password)
    raise PushError(
        f"no Grafana credentials: set {TOKEN_ENV} (a service account token), or {USER_ENV} and "
        f"{PASSWORD_ENV}, in the environment"
    )


def connect(url: str, env: Mapping[str, str], timeout_s: float = TIMEOUT_S) -> GrafanaApi:
    """A grafana-client API for ``url`` with the environment's credentials."""
    try:
        parts = urlsplit(url)
        _ = parts.port  # a bad port raises here, not later with the URL in the message
    except ValueError:
        raise PushError(f"--url is not a valid URL: {redact_url(url)!r}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise PushError(f"--url must be http(s)://host[:port][/path], got {redact_url(url)!r}")
    if parts.username or parts.password or redact_url(url) != url:
        raise PushError(f"put Grafana credentials in {TOKEN_ENV} or {USER_ENV}/{PASSWORD_ENV}, not in the URL")
    api: GrafanaApi = GrafanaApi.from_url(url, credential=credentials(env), timeout=timeout_s)
    return api


def datasource_model(
    clickhouse_url: str, database: str, password: str | None, user: str = READ_ONLY_USER
) -> dict[str, Any]:
    """The data source as the API takes it: the same fields as the provisioning file."""
    try:
        parts = urlsplit(clickhouse_url)
        _ = parts.port
    except ValueError:
        raise PushError(f"--clickhouse-url is not a valid URL: {redact_url(clickhouse_url)!r}") from None
    if parts.scheme not in ("http", "https", "native") or not parts.hostname:
        raise PushError(
            "Grafana needs a ClickHouse server: --clickhouse-url must be http(s)://host:port, "
            f"got {redact_url(clickhouse_url)!r}"
        )
    default_port = {"http": 8123, "https": 8443, "native": 9000}[parts.scheme]
    model: dict[str, Any] = {
        "name": DATASOURCE_UID,
        "uid": DATASOURCE_UID,
        "type": DATASOURCE_TYPE,
        "access": "proxy",
        "jsonData": {
            "host": parts.hostname,
            "port": parts.port or default_port,
            "protocol": "native" if parts.scheme == "native" else "http",
            "secure": parts.scheme == "https",
            "username": user,
            "defaultDatabase": database,
            "dialTimeout": "10",
            "queryTimeout": "60",
        },
    }
    if password:
        model["secureJsonData"] = {"password": password}
    return model


def _missing(exc: GrafanaClientError) -> bool:
    return bool(exc.status_code == 404)


def _push_folder(api: Any, uid: str, title: str, force: bool) -> Change:
    try:
        current = api.folder.get_folder(uid)
    except GrafanaClientError as exc:
        if not _missing(exc):
            raise
        api.folder.create_folder(title, uid=uid)
        return Change("folder", uid, "created")
    if current.get("title") == title and not force:
        return Change("folder", uid, "unchanged")
    api.folder.update_folder(uid, title=title, overwrite=True)
    return Change("folder", uid, "updated")


def _datasource_differs(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    for key in ("name", "type", "access"):
        if current.get(key) != wanted[key]:
            return True
    current_json = current.get("jsonData") or {}
    if any(current_json.get(k) != v for k, v in wanted["jsonData"].items()):
        return True
    has_password = bool((current.get("secureJsonFields") or {}).get("password"))
    return has_password != ("secureJsonData" in wanted)


def _push_datasource(api: Any, wanted: dict[str, Any], force: bool) -> Change:
    uid = wanted["uid"]
    try:
        current = api.datasource.get_datasource_by_uid(uid)
    except GrafanaClientError as exc:
        if not _missing(exc):
            raise
        api.datasource.create_datasource(wanted)
        return Change("datasource", uid, "created")
    if not force and not _datasource_differs(current, wanted):
        return Change("datasource", uid, "unchanged")
    api.datasource.update_datasource_by_uid(uid, wanted)
    return Change("datasource", uid, "updated")


def _comparable(model: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in model.items() if k not in _VOLATILE}


def _push_dashboard(api: Any, model: dict[str, Any], folder_uid: str, force: bool) -> Change:
    uid = str(model["uid"])
    action: Action = "updated"
    try:
        current = api.dashboard.get_dashboard(uid)
    except GrafanaClientError as exc:
        if not _missing(exc):
            raise
        action = "created"
    else:
        same_folder = (current.get("meta") or {}).get("folderUid") == folder_uid
        if not force and same_folder and _comparable(current.get("dashboard") or {}) == _comparable(model):
            return Change("dashboard", uid, "unchanged")
    payload = {
        "dashboard": {**model, "id": None},
        "folderUid": folder_uid,
        "overwrite": True,
        "message": "ttft grafana push",
    }
    api.dashboard.update_dashboard(payload)
    return Change("dashboard", uid, action)


def push(
    api: GrafanaApi,
    *,
    datasource: dict[str, Any],
    dashboards: Mapping[str, dict[str, Any]],
    folder_uid: str = DEFAULT_FOLDER_UID,
    folder_title: str = DEFAULT_FOLDER_TITLE,
    force: bool = False,
) -> list[Change]:
    """Bring Grafana in line with the repository; returns one :class:`Change` per object, in order.

    Raises :class:`PushError` with a readable message on refused credentials (401/403), an unreachable
    Grafana or any other API failure.
    """
    raw_url = str(api.url or api.client.url)
    url = redact_url(raw_url)
    try:
        changes = [
            _push_folder(api, folder_uid, folder_title, force),
            _push_datasource(api, datasource, force),
        ]
        changes += [_push_dashboard(api, model, folder_uid, force) for model in dashboards.values()]
    except GrafanaClientError as exc:
        if exc.status_code in (401, 403):
            raise PushError(
                f"Grafana at {url} refused the credentials (HTTP {exc.status_code}): check {TOKEN_ENV} "
                f"(or {USER_ENV}/{PASSWORD_ENV}) and that it may edit folders, data sources and dashboards"
            ) from None
        raise PushError(f"Grafana at {url} rejected a request: {redact_password(str(exc.message), raw_url)}") from None
    except GrafanaServerError as exc:
        raise PushError(f"Grafana at {url} failed: {redact_password(str(exc.message), raw_url)}") from None
    except GrafanaException as exc:  # timeouts and transport errors the client wraps
        raise PushError(f"cannot reach Grafana at {url}: {redact_password(str(exc.message), raw_url)}") from None
    except OSError as exc:  # niquests' ConnectionError is an OSError the client does not wrap
        raise PushError(f"cannot reach Grafana at {url}: {redact_password(str(exc), raw_url)}") from None
    return changes


def summary(changes: list[Change]) -> str:
    """One line: what changed, or that nothing did."""
    counts = {a: sum(1 for c in changes if c.action == a) for a in ("created", "updated", "unchanged")}
    if counts["created"] == counts["updated"] == 0:
        return f"nothing changed: Grafana already matches ({counts['unchanged']} objects checked)"
    return f"{counts['created']} created, {counts['updated']} updated, {counts['unchanged']} unchanged"
