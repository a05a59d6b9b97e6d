"""The overseer page against requests an attacker makes, over real HTTP: bytes no token holds,
bodies nested or sized to break the server, a time no calendar has. Each gets a refusal with a
stable code and the page's headers, never a server error; the access cookie is the page's own
port's (docs/web.md)."""

from __future__ import annotations

import http.client
import json
from typing import Any
from urllib.parse import quote, urlsplit

from tests.relay.conftest import Cluster, wait_for
from tests.web.conftest import WebServer, start_web


def _raw(
    web: WebServer, method: str, path: str, headers: dict[str, str], body: bytes = b""
) -> tuple[int, dict[str, str], Any]:
    """One request as sent, bytes and all (urllib would refuse some of these)."""
    where = urlsplit(web.base)
    conn = http.client.HTTPConnection(where.hostname or "", where.port, timeout=20)
    try:
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        for name, value in headers.items():
            conn.putheader(name, value.encode("utf-8"))
        conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        resp = conn.getresponse()
        raw = resp.read()
        got = {k.lower(): v for k, v in resp.getheaders()}
    finally:
        conn.close()
    try:
        return resp.status, got, json.loads(raw)
    except ValueError:
        return resp.status, got, raw


def test_hostile_requests_get_refusals_not_server_errors(
    sqlite_cluster: Cluster, web_servers: list[WebServer]
) -> None:
    [b] = sqlite_cluster.up("B")
    web = start_web(b)
    web_servers.append(web)
    host = urlsplit(web.base).netloc
    plain = {"Host": host}
    # Bytes no token holds, in every place a token goes: refused, not a crash.
    for path, headers in (
        ("/?token=%C3%A9", plain),
        ("/api/roster", {**plain, "Authorization": "Bearer \u00e9"}),
        ("/api/roster", {**plain, "Cookie": f"ci_token_{web.port}=\u00e9"}),
    ):
        status, got, body = _raw(web, "GET", path, headers)
        assert (status, body["error"]["code"]) == (401, "bad_token"), (path, body)
        assert got["x-content-type-options"] == "nosniff"
    # The URL's token becomes a cookie named for this page's port.
    status, got, _ = _raw(web, "GET", f"/?token={web.token}", plain)
    assert status == 303 and got["set-cookie"].startswith(f"ci_token_{web.port}=")

    auth = {**plain, "Authorization": f"Bearer {web.token}"}
    _, _, page = _raw(web, "GET", "/", auth)
    csrf = page.decode().split('name="csrf-token" content="', 1)[1].split('"', 1)[0]
    form = {**auth, "Content-Type": "application/json", "X-CSRF-Token": csrf}
    status, _, body = _raw(web, "POST", "/api/compose", {**form, "X-CSRF-Token": "\u00e9"}, b"{}")
    assert (status, body["error"]["code"]) == (403, "csrf")
    for hostile in (b"[" * 100_000, b'{"mode": "send", "to": "w", "message": "a\\ud800b"}'):
        status, got, body = _raw(web, "POST", "/api/compose", form, hostile)
        assert (status, body["error"]["code"]) == (400, "invalid_argument"), body
        assert got["x-content-type-options"] == "nosniff"
    status, _, body = _raw(web, "POST", "/api/compose", form, b" " * (10 * 1024 * 1024))
    assert (status, body["error"]["code"]) == (413, "too_large")
    status, _, body = _raw(web, "GET", "/api/search?q=x&since=99999999999d", auth)
    assert (status, body["error"]["code"]) == (400, "invalid_argument")
    # and the page still answers
    status, _, roster = _raw(web, "GET", "/api/roster", auth)
    assert status == 200 and roster["me"]["name"] == "overseer"


def test_ids_with_url_characters_open_their_thread_and_page(
    sqlite_cluster: Cluster, web_servers: list[WebServer]
) -> None:
    """A message id is any one line the sender chose: one holding `/`, `?`, `#` or `%` once
    answered 404 (`/` splits the path) or linked to another page."""
    [b] = sqlite_cluster.up("B")
    worker = b.client("worker")
    planner = b.client("planner")
    web = start_web(b)
    web_servers.append(web)
    headers = {"Host": urlsplit(web.base).netloc, "Authorization": f"Bearer {web.token}"}
    ids = ["a/b", "../api/roster", "q?x=1#y", "%2F"]
    for mid in ids:
        assert planner.send("worker", "hi", message_id=mid, reply_to=ids[0]).outcome.value == (
            "delivered"
        )

    def thread_of(mid: str) -> Any:
        return _raw(web, "GET", f"/api/thread/{quote(mid, safe='')}", headers)

    wait_for(lambda: thread_of(ids[-1])[0] == 200 and thread_of(ids[-1])[2], 10, "the feed")
    for mid in ids:
        status, _, body = thread_of(mid)
        assert status == 200, (mid, body)
        assert [m["id"] for m in body] == [mid]
        status, _, page = _raw(web, "GET", f"/message/{quote(mid, safe='')}", headers)
        assert status == 200, (mid, page)
        assert b'<a href="/message/a/b">' in page
    del worker
