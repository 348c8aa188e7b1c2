"""Proxy mode against a real resource server that verifies the broker's tokens with PyJWT."""
import asyncio
import functools
import hashlib
import http.client
import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from broker import GUARD, Broker
from test_hardening import UnixConnection, exchange, parse, raw
from test_proxy_answer_framing import ScriptedUpstream
from test_http_api import wait_until

HERE = os.path.dirname(__file__)


class ResourceServer:
    def __init__(self):
        self.process = subprocess.Popen([sys.executable, os.path.join(HERE, "issuers", "resource_server.py")],
                                        stdout=subprocess.PIPE, text=True)
        self.address = self.process.stdout.readline().split()[1]
        self.base = f"http://{self.address}"

    def admin(self, path, document=None):
        data = json.dumps(document).encode() if document is not None else b""
        request = urllib.request.Request(self.base + path, data=data, method="POST" if document is not None else "GET")
        with urllib.request.urlopen(request, timeout=10) as response:
            body = response.read()
            return json.loads(body) if body else None

    def stats(self):
        return self.admin("/admin/stats")

    def close(self):
        self.process.terminate()
        self.process.wait(10)


@pytest.fixture(scope="module")
def resource():
    server = ResourceServer()
    yield server
    server.close()


def proxied_broker(resource, **proxy):
    config = {"proxies": [{"name": "api", "target": resource.base + "/api", **proxy}],
              "providers": [{"name": "default", "forcedRefreshMaxAttempts": 20}]}
    broker = Broker(config)
    resource.admin("/admin/reset", {})
    resource.admin("/admin/config", {"jwks": broker.url("/.well-known/jwks.json"), "cookie": None, "header": None})
    return broker


@pytest.fixture
def broker(resource):
    with proxied_broker(resource) as running:
        yield running


def echo(broker, method="GET", path="/proxy/api/echo/x", **kwargs):
    status, headers, body = broker.request(method, path, **kwargs)
    return status, headers, body


def current_token(broker):
    return broker.get_json("/token")[0]


def test_requests_are_forwarded_with_a_verified_token_and_answers_come_back(broker, resource):
    body = os.urandom(1000)
    status, headers, payload = echo(broker, "PUT", "/proxy/api/echo/a/b%20c?x=1&y=%2F&x=2",
                                    headers={"X-Custom": "kept", "Host": "evil.example", "Connection": "X-Secret-Hop",
                                             "X-Secret-Hop": "dropped", "Keep-Alive": "timeout=5", "Content-Type": "application/octet-stream"},
                                    body=body)
    assert status == 200, payload
    seen = json.loads(payload)
    assert seen["method"] == "PUT" and seen["target"] == "/api/echo/a/b%20c?x=1&y=%2F&x=2"
    names = {name.lower(): value for name, value in seen["headers"]}
    assert names["x-custom"] == "kept" and names["host"] == resource.address, "Host is the target's"
    assert "x-secret-hop" not in names and "keep-alive" not in names and "token-broker-request" not in names
    assert names["authorization"] == "Bearer " + current_token(broker)["access_token"]
    assert seen["body_length"] == 1000 and seen["body_sha256"] == hashlib.sha256(body).hexdigest()
    assert headers["x-upstream"] == "yes" and "x-hop" not in headers
    assert broker.metric("token_broker_proxy_requests_total", proxy="api", code="200") == 1


def test_header_bytes_that_are_not_utf8_cross_the_proxy_unchanged(broker):
    """Header values may hold bytes that are not UTF-8 (obs-text, RFC 9110 §5.5): they cross the
    proxy as sent, both ways, not each made U+FFFD; UTF-8 crosses as sent too, and so does an
    empty value. Over a raw socket, so that no client library encodes the values on its own."""
    obs_text, utf8 = b"caf\xe9 \xff end", b"caf\xc3\xa9"  # the resource server's X-Raw and X-Raw-Utf8 too
    answer = raw(broker, b"GET /proxy/api/echo/bytes?raw_header=1 HTTP/1.1\r\nHost: b\r\nToken-Broker-Request: true\r\n"
                         b"X-Custom: " + obs_text + b"\r\nX-Utf8: " + utf8 + b"\r\nX-Empty:\r\nConnection: close\r\n\r\n")
    status, _, body = parse(answer)
    assert status == 200, answer
    # The resource server reads each header byte as one Latin-1 character: encoding gives the bytes back.
    seen = {name.lower(): value.encode("latin-1") for name, value in json.loads(body)["headers"]}
    # The answer's header lines, as bytes (parse() decodes and lower-cases them).
    lines = answer.partition(b"\r\n\r\n")[0].split(b"\r\n")[1:]
    received = {name.strip().lower(): value.strip(b" \t") for name, _, value in (line.partition(b":") for line in lines)}
    got = {"upstream saw X-Custom": seen.get("x-custom"), "upstream saw X-Utf8": seen.get("x-utf8"),
           "upstream saw X-Empty": seen.get("x-empty"), "client got X-Raw": received.get(b"x-raw"),
           "client got X-Raw-Utf8": received.get(b"x-raw-utf8"), "client got X-Raw-Empty": received.get(b"x-raw-empty")}
    assert got == {"upstream saw X-Custom": obs_text, "upstream saw X-Utf8": utf8, "upstream saw X-Empty": b"",
                   "client got X-Raw": obs_text, "client got X-Raw-Utf8": utf8, "client got X-Raw-Empty": b""}, \
        "header bytes changed"


def test_libcurl_adds_no_accept_or_content_type_of_its_own(broker):
    """What the client did not send, or sent only for the hop, the target does not get from the
    client library either (libcurl adds `Accept: */*`, and a form type to a body)."""
    for headers in ({}, {"Connection": "Accept", "Accept": "text/hop-only"}):
        status, _, payload = echo(broker, "POST", headers=headers, body=b"a=1")
        assert status == 200, payload
        names = {name.lower(): value for name, value in json.loads(payload)["headers"]}
        assert "accept" not in names and "content-type" not in names, names


@pytest.mark.parametrize("family", ["ipv6", "unix"])
def test_a_token_listener_on_ipv6_or_a_unix_socket_proxies_and_stops_cleanly(resource, tmp_path, family):
    # With proxies, the token listener runs on the proxy's loops, each with a copy of its socket.
    socket_path = str(tmp_path / "token.sock")
    config = {"proxies": [{"name": "api", "target": resource.base + "/api"}], "providers": [{"name": "default"}]}
    with Broker(config, listen="[::1]:0" if family == "ipv6" else "unix:" + socket_path) as broker:

        def get(path):
            connection = UnixConnection(socket_path) if family == "unix" else broker.connection()
            try:
                connection.request("GET", path, headers=GUARD)
                response = connection.getresponse()
                return response.status, response.read()
            finally:
                connection.close()

        # The resource server reads the broker's keys from a plain HTTP server on loopback (it
        # cannot reach a Unix socket).
        status, jwks = get("/.well-known/jwks.json")
        assert status == 200, jwks
        (tmp_path / "jwks.json").write_bytes(jwks)
        files = http.server.ThreadingHTTPServer(
            ("127.0.0.1", 0), functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path)))
        threading.Thread(target=files.serve_forever, daemon=True).start()
        try:
            resource.admin("/admin/reset", {})
            resource.admin("/admin/config", {"jwks": f"http://127.0.0.1:{files.server_port}/jwks.json",
                                             "cookie": None, "header": None})
            # Several connections, so that more than one loop's daemon accepts.
            for index in range(8):
                status, payload = get(f"/proxy/api/echo/{index}")
                assert status == 200, payload
                assert json.loads(payload)["target"] == f"/api/echo/{index}"
        finally:
            files.shutdown()
            files.server_close()
        assert broker.stop() == 0
        assert "stopped" in broker.stderr()
    if family == "unix":
        assert not os.path.exists(socket_path), "the socket file is removed at stop"


def test_methods_without_bodies_and_head_pass_through(broker):
    for method in ("GET", "DELETE", "OPTIONS"):
        status, _, payload = echo(broker, method)
        assert status == 200 and json.loads(payload)["method"] == method
    status, headers, payload = echo(broker, "HEAD")
    assert status == 200 and payload == b"" and int(headers["content-length"]) > 0


def test_the_broker_names_itself_in_via_as_a_gateway_must(broker):
    """RFC 9110 §7.6.3: an HTTP-to-HTTP gateway sends Via in every request it forwards, with the
    protocol version it received, after any Via the request already had."""
    status, _, payload = echo(broker, headers={"Via": "1.1 edge"})
    assert status == 200
    vias = [value for name, value in json.loads(payload)["headers"] if name.lower() == "via"]
    assert vias == ["1.1 edge", "1.1 token-broker"], vias
    # A caller's Connection can take its own Via off (hop-by-hop), never the broker's.
    status, _, payload = echo(broker, headers={"Via": "1.1 edge", "Connection": "Via"})
    assert [value for name, value in json.loads(payload)["headers"] if name.lower() == "via"] == ["1.1 token-broker"]
    host, port = broker.addresses["token"].rsplit(":", 1)
    answer = exchange(f"{host}:{port}", b"GET /proxy/api/echo/old HTTP/1.0\r\nHost: b\r\n"
                      b"Token-Broker-Request: true\r\n\r\n", timeout=20)[0]
    status, _, body = parse(answer)
    assert status == 200, answer
    assert [value for name, value in json.loads(body)["headers"] if name.lower() == "via"] == ["1.0 token-broker"]


@pytest.mark.parametrize("minor", [2, 9])
def test_via_names_a_higher_http1_minor_version_as_the_client_sent_it(broker, minor):
    """A request line of HTTP/1.2 to HTTP/1.9 is served as HTTP/1.1 (RFC 9110 §2.5: a higher minor
    version is processed as the highest one the recipient conforms to), and the broker's answer
    says HTTP/1.1; but Via's received-protocol is the version the broker received (RFC 9110
    §7.6.3), which it named 1.1."""
    answer = raw(broker, b"GET /proxy/api/echo/newer HTTP/1.%d\r\nHost: b\r\nToken-Broker-Request: true\r\n"
                         b"Connection: close\r\n\r\n" % minor, timeout=20)
    assert answer.startswith(b"HTTP/1.1 200 "), answer
    status, _, body = parse(answer)
    vias = [value for name, value in json.loads(body)["headers"] if name.lower() == "via"]
    assert vias == [f"1.{minor} token-broker"], vias


def test_options_with_max_forwards_is_answered_at_zero_and_counted_down_otherwise(broker, resource):
    """RFC 9110 §7.6.2: an intermediary answers OPTIONS itself when Max-Forwards is 0, and sends
    one less on; other methods pass it on as it came."""
    status, headers, payload = echo(broker, "OPTIONS", headers={"Max-Forwards": "0"})
    assert status == 200 and payload == b"" and headers["content-length"] == "0"
    assert set(headers["allow"].split(", ")) == {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"}
    assert resource.stats()["seen"] == [], "nothing was forwarded"
    # The connection is kept: a request pipelined after it is answered too.
    answer = raw(broker, b"OPTIONS /proxy/api/echo/x HTTP/1.1\r\nHost: b\r\nToken-Broker-Request: true\r\n"
                 b"Max-Forwards: 0\r\n\r\nGET /proxy/api/echo/y HTTP/1.1\r\nHost: b\r\n"
                 b"Token-Broker-Request: true\r\nConnection: close\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200") and answer.count(b"HTTP/1.1 200") == 2, answer
    assert [seen["method"] for seen in resource.stats()["seen"]] == ["GET"]
    status, _, payload = echo(broker, "OPTIONS", headers={"Max-Forwards": "5"})
    assert status == 200
    assert [value for name, value in json.loads(payload)["headers"] if name.lower() == "max-forwards"] == ["4"]
    status, _, payload = echo(broker, "GET", headers={"Max-Forwards": "0"})
    assert status == 200 and json.loads(payload)["method"] == "GET"
    assert [value for name, value in json.loads(payload)["headers"] if name.lower() == "max-forwards"] == ["0"]
    for value in ["-1", "1, 2", "x", ""]:
        status, _, payload = echo(broker, "OPTIONS", headers={"Max-Forwards": value})
        assert status == 400 and "Max-Forwards" in json.loads(payload)["error_description"], (value, payload)
    # The broker's own answers count among the listener's requests as its target's do.
    for code, count in [("200", 5), ("400", 4)]:
        assert broker.metric("token_broker_proxy_requests_total", proxy="api", code=code) == count
        assert broker.metric("token_broker_http_requests_total", listener="token", route="/proxy/{name}", code=code) == count


def test_a_revoked_token_is_refreshed_and_the_request_retried_without_the_caller_noticing(broker, resource):
    first = current_token(broker)
    resource.admin("/admin/revoke", {"token": first["access_token"]})
    status, _, payload = echo(broker, "POST", body=b'{"small": "buffered body"}', headers={"Content-Type": "application/json"})
    assert status == 200, payload
    assert json.loads(payload)["body_length"] == 26
    assert current_token(broker)["version"] == first["version"] + 1
    assert resource.stats()["statuses"].get("401") == 1
    assert broker.metric("token_broker_proxy_retries_total", proxy="api") == 1
    assert broker.metric("token_broker_proxy_refreshes_total", proxy="api") == 1


async def concurrent_gets(address, count):
    host, _, port = address.rpartition(":")

    async def one():
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"GET /proxy/api/echo/c HTTP/1.1\r\nHost: b\r\nToken-Broker-Request: true\r\nConnection: close\r\n\r\n")
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 30)
        writer.close()
        return int(answer.split(b" ", 2)[1])

    return await asyncio.gather(*(one() for _ in range(count)))


def test_a_hundred_concurrent_refusals_cause_exactly_one_refresh(broker, resource):
    first = current_token(broker)
    fetches = broker.fetches()
    resource.admin("/admin/revoke", {"token": first["access_token"]})
    statuses = asyncio.run(concurrent_gets(broker.addresses["token"], 100))
    assert statuses == [200] * 100
    assert broker.fetches() == fetches + 1, "one upstream fetch for all hundred"
    assert broker.metric("token_broker_proxy_refreshes_total", proxy="api") == 1
    assert current_token(broker)["version"] == first["version"] + 1
    assert resource.stats()["statuses"]["401"] <= 100


def test_a_streamed_non_idempotent_body_is_not_retried(broker, resource):
    resource.admin("/admin/revoke", {"token": current_token(broker)["access_token"]})
    big = os.urandom(200_000)  # over bufferBodyBytes (64 KiB): streamed, so it cannot be sent twice
    status, headers, payload = echo(broker, "POST", body=big, headers={"Content-Type": "application/octet-stream"})
    assert status == 401 and "invalid_token" in headers["www-authenticate"]
    assert broker.metric("token_broker_proxy_retries_total", proxy="api") == 0
    posts = [seen for seen in resource.stats()["seen"] if seen["method"] == "POST"]
    assert len(posts) == 1 and posts[0]["body_length"] == 200_000


@pytest.mark.parametrize("method", ["POST", "PATCH"])
def test_a_request_that_is_not_idempotent_never_reaches_the_upstream_twice(method):
    """RFC 9110 §9.2.2: a proxy must not send a POST or PATCH again by itself. libcurl would,
    on a new connection, when the reused one closed without an answer, though the upstream
    may have acted on it. A request with a body fails instead (502); one without takes a new
    connection, and says `Content-Length: 0`, as its client did."""
    upstream = ScriptedUpstream(lambda method, target: b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
                                once_per_connection=True)
    broker = Broker({"proxies": [{"name": "u", "target": "http://" + upstream.address}]})
    try:
        host, port = broker.addresses["token"].rsplit(":", 1)
        # One client connection: its requests run on one of the broker's libcurl loops, which
        # keeps the upstream connection of the first for the next.
        connection = http.client.HTTPConnection(host, int(port), timeout=30)
        for path, verb, body, expected in [("/proxy/u/warm", "GET", None, 200),
                                           ("/proxy/u/charge", method, b'{"charge": 100}', 502),
                                           ("/proxy/u/warm-again", "GET", None, 200),
                                           ("/proxy/u/empty", method, b"", 200)]:
            connection.request(verb, path, body=body, headers=GUARD)
            response = connection.getresponse()
            response.read()
            assert response.status == expected, (path, response.status)
            if response.getheader("Connection", "").lower() == "close":
                connection.close()
                connection = http.client.HTTPConnection(host, int(port), timeout=30)
        connection.close()
        sent = [(verb, fields, body) for verb, fields, body in upstream.requests if verb == method]
        assert [body for _, _, body in sent] == [b'{"charge": 100}', b""], upstream.requests
        assert sent[1][1].get("content-length") == "0"
    finally:
        broker.stop()
        upstream.close()


def test_an_idempotent_put_is_sent_again_when_a_reused_connection_closes_unanswered():
    """A PUT may be sent again (RFC 9110 §9.2.2): with its body, it is, on a new connection,
    where the no-retry rule for POST and PATCH must not make it a 502."""
    upstream = ScriptedUpstream(lambda method, target: b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
                                once_per_connection=True)
    broker = Broker({"proxies": [{"name": "u", "target": "http://" + upstream.address}]})
    try:
        host, port = broker.addresses["token"].rsplit(":", 1)
        connection = http.client.HTTPConnection(host, int(port), timeout=30)
        for path, verb, body in [("/proxy/u/warm", "GET", None), ("/proxy/u/item", "PUT", b"x=1")]:
            connection.request(verb, path, body=body, headers=GUARD)
            response = connection.getresponse()
            response.read()
            assert response.status == 200, (path, response.status)
        connection.close()
        puts = [body for verb, _, body in upstream.requests if verb == "PUT"]
        assert puts == [b"x=1", b"x=1"], upstream.requests
    finally:
        broker.stop()
        upstream.close()


def test_a_streamed_body_arrives_whole(broker):
    big = os.urandom(3_000_000)
    status, _, payload = echo(broker, "PUT", body=big)
    assert status == 200
    seen = json.loads(payload)
    assert seen["body_length"] == len(big) and seen["body_sha256"] == hashlib.sha256(big).hexdigest()


def test_an_upstream_that_answers_before_reading_a_streamed_body_is_passed_on(broker):
    status, _, payload = echo(broker, "POST", "/proxy/api/refuse-early", body=os.urandom(9_000_000))
    assert status == 403 and json.loads(payload)["error"] == "not_here"
    assert broker.get_json("/token")[0]["version"] >= 1


def test_an_upstream_that_resets_after_its_head_during_a_streamed_body_cuts_the_answer_at_once(broker):
    # The answer's head is passed on while the request body is still coming in, and the upstream
    # fails before libmicrohttpd first asks for the answer's body: the client must see the cut
    # then, not wait for a body that will never come (its read would time out after 10 s, long
    # before the broker's 30 s connection timeout, and raise TimeoutError, not IncompleteRead).
    connection = broker.connection(timeout=10)
    try:
        connection.request("POST", "/proxy/api/head-then-reset", body=os.urandom(9_000_000), headers=GUARD)
        response = connection.getresponse()
        assert response.status == 403
        with pytest.raises(http.client.IncompleteRead):
            response.read()
    finally:
        connection.close()


def test_a_chunked_upload_streams_through(broker):
    host, port = broker._split("token")
    pieces = [os.urandom(50_000) for _ in range(5)]
    with socket.create_connection((host, port), timeout=20) as connection:
        connection.sendall(b"POST /proxy/api/echo/chunked HTTP/1.1\r\nHost: b\r\nToken-Broker-Request: true\r\n"
                           b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
        for piece in pieces:
            connection.sendall(b"%x\r\n" % len(piece) + piece + b"\r\n")
        connection.sendall(b"0\r\n\r\n")
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    status, _, body = parse(answer)
    assert status == 200
    assert json.loads(body)["body_sha256"] == hashlib.sha256(b"".join(pieces)).hexdigest()


def test_a_large_answer_streams_before_the_upstream_has_finished(broker, resource):
    total = 20 * 1024 * 1024
    connection = broker.connection(timeout=30)
    connection.request("GET", f"/proxy/api/big?bytes={total}", headers=GUARD)
    response = connection.getresponse()
    assert response.status == 200
    first = response.read(65536)  # the upstream holds the rest until released
    assert first == bytes(i % 251 for i in range(65536))
    resource.admin("/admin/release", {})
    rest = response.read()
    connection.close()
    data = first + rest
    assert len(data) == total
    assert hashlib.sha256(data).hexdigest() == hashlib.sha256(bytes(i % 251 for i in range(251)) * (total // 251) + bytes(range(total % 251))).hexdigest()


@pytest.mark.parametrize("name,request_bytes,status", [
    ("absolute URL", b"GET http://127.0.0.1:1/proxy/api/echo HTTP/1.1\r\n", 400),
    ("absolute URL to the proxy route", b"GET http://broker/proxy/api/echo/x HTTP/1.1\r\n", 400),
    ("unknown proxy", b"GET /proxy/other/echo HTTP/1.1\r\n", 404),
    ("dot-dot escape", b"GET /proxy/api/../../token HTTP/1.1\r\n", 400),
    ("encoded dot-dot escape", b"GET /proxy/api/%2e%2e/%2E%2E/admin/stats HTTP/1.1\r\n", 400),
    ("encoded slash", b"GET /proxy/api/echo%2f..%2f..%2fadmin HTTP/1.1\r\n", 400),
    ("encoded CR LF in the path", b"GET /proxy/api/echo%0d%0aX-Injected:%20yes HTTP/1.1\r\n", 400),
    ("encoded backslash", b"GET /proxy/api/..%5c..%5cadmin HTTP/1.1\r\n", 400),
    ("raw non-ASCII", b"GET /proxy/api/echo/\xff HTTP/1.1\r\n", 400),
    ("bad percent-escape", b"GET /proxy/api/echo/%zz HTTP/1.1\r\n", 400),
    ("TRACE, which would echo credentials", b"TRACE /proxy/api/echo/x HTTP/1.1\r\n", 405),
    ("CONNECT", b"CONNECT /proxy/api/echo/x HTTP/1.1\r\n", 405),
])
def test_open_proxy_attempts_are_refused(broker, resource, name, request_bytes, status):
    answer = parse(raw(broker, request_bytes + b"Host: b\r\nToken-Broker-Request: true\r\nConnection: close\r\n\r\n"))
    assert answer is not None and answer[0] == status, answer
    assert json.loads(answer[2])["error"] in ("invalid_request", "unknown_proxy", "not_found", "method_not_allowed")
    assert resource.stats()["seen"] == [], "nothing reached any upstream"


def test_dot_segments_that_stay_inside_are_resolved_and_queries_cannot_inject_headers(broker, resource):
    status, _, payload = echo(broker, path="/proxy/api/echo/a/./b/../c?q=%0d%0aX-Injected:%20yes")
    assert status == 200
    seen = json.loads(payload)
    assert seen["target"] == "/api/echo/a/c?q=%0d%0aX-Injected:%20yes"
    assert "x-injected" not in {name.lower() for name, _ in seen["headers"]}


def test_the_guard_and_caller_keys_apply_and_caller_keys_never_leave(resource, tmp_path):
    key = "caller-" + os.urandom(16).hex()
    (tmp_path / "callers.json").write_text(json.dumps({"keys": [{"name": "app", "sha256": hashlib.sha256(key.encode()).hexdigest(), "providers": ["*"]}]}))
    config = {"clientKeysFile": str(tmp_path / "callers.json"), "proxies": [{"name": "api", "target": resource.base + "/api", "inject": "header:X-Api-Token"}]}
    with Broker(config) as broker:
        resource.admin("/admin/reset", {})
        resource.admin("/admin/config", {"jwks": broker.url("/.well-known/jwks.json"), "cookie": None, "header": "X-Api-Token"})
        assert broker.request("GET", "/proxy/api/echo/x", guard=False, headers={"Authorization": "Bearer " + key})[0] == 403
        status, headers, _ = broker.request("GET", "/proxy/api/echo/x")
        assert status == 401 and headers["www-authenticate"].startswith("Bearer")
        status, _, payload = broker.request("GET", "/proxy/api/echo/x", headers={"Authorization": "Bearer " + key})
        assert status == 200, payload
        names = {name.lower(): value for name, value in json.loads(payload)["headers"]}
        assert "authorization" not in names and key not in payload.decode()
        assert names["x-api-token"] == broker.get_json("/token", headers={"Authorization": "Bearer " + key})[0]["access_token"]


def test_cookie_injection_and_overwrite_false_passes_callers_credentials_through(resource):
    with proxied_broker(resource, inject="cookie", overwrite=False) as broker:
        resource.admin("/admin/config", {"jwks": broker.url("/.well-known/jwks.json"), "cookie": "aws-waf-token", "header": None})
        status, _, payload = echo(broker, headers={"Cookie": "session=1"})
        assert status == 200
        cookie = dict(json.loads(payload)["headers"])["Cookie"]
        assert cookie == "session=1; aws-waf-token=" + current_token(broker)["access_token"]
        status, _, payload = echo(broker, headers={"Cookie": "aws-waf-token=mine"})
        assert status == 401, "the caller's own cookie went through untouched (and was refused upstream)"
        assert resource.stats()["seen"][-1]["token"] == "mine"


def test_waf_challenges_are_retried_only_with_their_header(resource):
    with proxied_broker(resource, retryOn=[202, 405], retryOnHeader="x-amzn-waf-action") as broker:
        first = current_token(broker)["version"]
        assert echo(broker, path="/proxy/api/status/405?header=x-amzn-waf-action")[0] == 405  # still 405 after the retry
        assert broker.metric("token_broker_proxy_retries_total", proxy="api") == 1
        assert current_token(broker)["version"] == first + 1
        assert echo(broker, path="/proxy/api/status/405")[0] == 405
        assert broker.metric("token_broker_proxy_retries_total", proxy="api") == 1, "no header, no retry"


def test_unreachable_and_slow_targets_give_502_and_504(resource):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    config = {"proxies": [{"name": "down", "target": f"http://127.0.0.1:{closed_port}"},
                          {"name": "slow", "target": resource.base + "/api", "timeoutMsec": 500}]}
    with Broker(config) as broker:
        resource.admin("/admin/config", {"jwks": broker.url("/.well-known/jwks.json"), "cookie": None, "header": None})
        status, _, body = broker.request("GET", "/proxy/down/x")
        assert status == 502 and json.loads(body)["error"] == "upstream_unreachable"
        status, _, body = broker.request("GET", "/proxy/slow/slow?seconds=3")
        assert status == 504 and json.loads(body)["error"] == "upstream_timeout"
        assert broker.request("GET", "/healthz", listener="admin")[0] == 200


def test_a_body_that_trickles_in_after_the_exchange_ended_is_cut_off(resource):
    """The exchange times out while the client is still sending its body a byte at a time. The
    answer can go only once the body is in, and the rest must arrive within connectionTimeoutSec:
    the connection was held for as long as the client kept sending."""
    config = {"connectionTimeoutSec": 2,
              "proxies": [{"name": "slow", "target": resource.base + "/api", "timeoutMsec": 500}]}
    with Broker(config) as broker:
        resource.admin("/admin/config", {"jwks": broker.url("/.well-known/jwks.json"), "cookie": None, "header": None})
        host, port = broker._split("token")
        closed = False
        with socket.create_connection((host, port), timeout=5) as connection:
            connection.sendall(b"POST /proxy/slow/echo/x HTTP/1.1\r\nHost: b\r\nToken-Broker-Request: true\r\n"
                               b"Content-Length: 1000000\r\n\r\n")
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not closed:
                try:
                    connection.sendall(b"x")
                    connection.settimeout(0.5)
                    closed = connection.recv(65536) == b""
                except socket.timeout:
                    pass
                except (BrokenPipeError, ConnectionResetError):
                    closed = True
        assert closed, "the broker kept the connection for a minute of trickling"
        assert wait_until(lambda: broker.metric("token_broker_open_connections", listener="token") == 0)
        assert broker.request("GET", "/healthz", listener="admin")[0] == 200


def test_bodies_over_the_cap_get_413(resource):
    with proxied_broker(resource, maxBodyBytes=100_000) as broker:
        status, _, body = echo(broker, "POST", body=b"x" * 100_001)
        assert status == 413 and json.loads(body)["error"] == "payload_too_large"
        assert broker.metric("token_broker_http_requests_total", listener="token", route="/proxy/{name}", code="413") == 1
        host, port = broker._split("token")
        with socket.create_connection((host, port), timeout=20) as connection:
            connection.sendall(b"POST /proxy/api/echo/c HTTP/1.1\r\nHost: b\r\nToken-Broker-Request: true\r\n"
                               b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
            for _ in range(3):
                connection.sendall(b"%x\r\n" % 50_000 + b"y" * 50_000 + b"\r\n")
            connection.sendall(b"0\r\n\r\n")
            answer = b""
            while chunk := connection.recv(65536):
                answer += chunk
        assert parse(answer)[0] == 413
        assert broker.get_json("/token")[0]["version"] >= 1


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as handle:
        return next(int(line.split()[1]) for line in handle if line.startswith("VmRSS:"))


def test_proxied_requests_leave_no_memory_behind(broker):
    """Each exchange used to keep itself alive through its upstream transfer (about 1.6 KB a request)."""
    connection = broker.connection(timeout=30)

    def burst(count):
        for _ in range(count):
            connection.request("GET", "/proxy/api/echo/leak", headers=GUARD)
            response = connection.getresponse()
            response.read()
            assert response.status == 200

    burst(1000)  # warm up: connection pools, allocator arenas
    before = rss_kib(broker.process.pid)
    burst(5000)
    grown = rss_kib(broker.process.pid) - before
    connection.close()
    assert grown < 4096, f"RSS grew by {grown} KiB over 5000 proxied requests"
