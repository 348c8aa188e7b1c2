"""HTTP framing (RFC 9112): what can be read two ways is refused, and nothing mixes two requests.

Requests are written byte by byte on raw sockets; a keep-alive upstream in this process records
every request it reads, on which connection, so that a smuggled request would be seen.
"""
import hashlib
import json
import secrets
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from broker import Broker
from test_hardening import exchange, parse, write_keys


class RecordingHandler(BaseHTTPRequestHandler):
    """Reads requests the way common servers do (Content-Length or chunked) and keeps connections alive."""
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def setup(self):
        super().setup()
        with self.server.lock:
            self.server.connections += 1
            self.connection_id = self.server.connections

    def read_body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return body
                body += self.rfile.read(size)
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        if len(body) < length:
            raise ConnectionError("body cut short")
        return body

    def handle_any(self):
        try:
            body = self.read_body()
        except (ConnectionError, ValueError):
            with self.server.lock:
                self.server.cut_short += 1
            self.close_connection = True
            return
        with self.server.lock:
            self.server.seen.append({"connection": self.connection_id, "method": self.command, "path": self.path,
                                     "headers": [(k, v) for k, v in self.headers.items()], "body": body})
        answer = json.dumps({"path": self.path}).encode()
        self.send_response(200)
        if self.path.endswith("/control-characters"):
            self.send_header("X-Ctl", "a\x01b")
            self.send_header("X-Del", "a\x7fb")
            self.send_header("X-Fine", "a\tb")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = handle_any


class RecordingUpstream:
    def __init__(self):
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), RecordingHandler)
        self.server.daemon_threads = True
        self.server.lock = threading.Lock()
        self.server.connections = 0
        self.server.cut_short = 0
        self.server.seen = []
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"

    @property
    def seen(self):
        with self.server.lock:
            return list(self.server.seen)

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def upstream():
    server = RecordingUpstream()
    yield server
    server.close()


GUARD = b"Token-Broker-Request: true\r\n"

# Each: a request head (after the request line and Host), and what follows it.
AMBIGUOUS = {
    "content-length-and-chunked": (b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n", b"0\r\n\r\n"),
    "chunked-and-content-length": (b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n", b"0\r\n\r\n"),
    "two-different-content-lengths": (b"Content-Length: 5\r\nContent-Length: 6\r\n", b"hello!"),
    "two-equal-content-lengths": (b"Content-Length: 5\r\nContent-Length: 5\r\n", b"hello"),
    "content-length-list": (b"Content-Length: 5, 5\r\n", b"hello"),
    "content-length-sign": (b"Content-Length: +5\r\n", b"hello"),
    "content-length-then-space": (b"Content-Length: 5 \r\n", b"hello"),
    "content-length-too-long": (b"Content-Length: 1234567890123456789\r\n", b"hello"),
    "gzip-then-chunked": (b"Transfer-Encoding: gzip, chunked\r\n", b"0\r\n\r\n"),
    "chunked-then-identity": (b"Transfer-Encoding: chunked, identity\r\n", b"0\r\n\r\n"),
    "identity": (b"Transfer-Encoding: identity\r\n", b""),
    "chunked-then-space": (b"Transfer-Encoding: chunked \r\n", b"0\r\n\r\n"),
    "chunked-then-tab": (b"Transfer-Encoding: chunked\t\r\n", b"0\r\n\r\n"),
    "two-hosts": (b"Host: y\r\n", b""),
    "two-transfer-encodings": (b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n", b"0\r\n\r\n"),
    "obs-fold": (b"X-Fold: a\r\n b\r\n", b""),
    "obs-fold-with-tab": (b"X-Fold: a\r\n\tb\r\n", b""),
    "space-before-colon": (b"X-Forwarded-For : 1.2.3.4\r\n", b""),
    "space-in-name": (b"X Forwarded: 1\r\n", b""),
    "carriage-return-in-value": (b"X-A: b\rc\r\n", b""),
    "nul-in-value": (b"X-A: b\x00c\r\n", b""),
    "escape-in-value": (b"X-A: b\x1bc\r\n", b""),
    "delete-in-value": (b"X-A: b\x7fc\r\n", b""),
}


# libmicrohttpd refuses these itself, before the broker sees the request, with its own HTML body.
REFUSED_BY_LIBRARY = {"content-length-list", "content-length-sign", "content-length-then-space"}


def assert_refused(answer, closed, json_body=True):
    parsed = parse(answer)
    assert parsed is not None, "no answer"
    status, headers, body = parsed
    assert status == 400, answer
    if json_body:
        assert headers["content-type"] == "application/json"
        assert json.loads(body)["error"] == "invalid_request"
    assert closed, "the connection must be closed after a refused head"


@pytest.fixture(scope="module")
def plain_broker():
    with Broker() as running:
        yield running


@pytest.mark.parametrize("case", sorted(AMBIGUOUS))
@pytest.mark.parametrize("route", ["POST /token/refresh", "GET /token", "GET /healthz admin"])
def test_ambiguous_heads_get_400_and_a_closed_connection_on_every_route(plain_broker, case, route):
    method, path, *admin = route.split()
    head, rest = AMBIGUOUS[case]
    request = f"{method} {path} HTTP/1.1\r\nHost: x\r\n".encode() + GUARD + head + b"\r\n" + rest
    answer, closed = exchange(plain_broker.addresses["admin" if admin else "token"], request)
    assert_refused(answer, closed, json_body=case not in REFUSED_BY_LIBRARY)
    assert plain_broker.process.poll() is None


def test_an_http_11_request_without_host_is_refused_and_an_http_10_one_is_not(plain_broker):
    request = b"GET /token HTTP/1.1\r\n" + GUARD + b"\r\n"
    assert_refused(*exchange(plain_broker.addresses["token"], request))
    status, _, body = parse(exchange(plain_broker.addresses["token"], b"GET /token HTTP/1.0\r\n" + GUARD + b"\r\n")[0])
    assert status == 200 and json.loads(body)["access_token"]


@pytest.mark.parametrize("host", [b"a b/c@d", b"user@x", b"x/y", b"x:80a", b"[::1"])
def test_a_host_that_is_not_a_host_and_port_is_refused(plain_broker, host):
    """RFC 9112 §3.2: a server MUST answer 400 to a Host field with an invalid value."""
    request = b"GET /token HTTP/1.1\r\nHost: " + host + b"\r\n" + GUARD + b"\r\n"
    assert_refused(*exchange(plain_broker.addresses["token"], request))
    sound = b"GET /token HTTP/1.1\r\nHost: [::1]:8080\r\n" + GUARD + b"Connection: close\r\n\r\n"
    assert parse(exchange(plain_broker.addresses["token"], sound)[0])[0] == 200


def test_ambiguous_heads_do_not_stop_a_sound_request_on_the_next_connection(plain_broker):
    sound = b"POST /token/refresh HTTP/1.1\r\nHost: x\r\n" + GUARD + b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n0\r\n\r\n"
    status, _, body = parse(exchange(plain_broker.addresses["token"], sound)[0])
    assert status == 200 and json.loads(body)["access_token"]
    bare_lf = b"GET /token HTTP/1.1\nHost: x\nToken-Broker-Request: true\nX-Empty:\nConnection: close\n\n"
    status, _, body = parse(exchange(plain_broker.addresses["token"], bare_lf)[0])
    assert status == 200 and json.loads(body)["access_token"]


# Request targets with a NUL, raw or percent-encoded in the path: libmicrohttpd hands the path
# over as a C string, so each would reach a route cut at the NUL (`/token`, `/healthz`).
NUL_TARGETS = {
    "encoded-in-path": b"/providers/default/token%00.png",
    "raw-in-path": b"/token\x00/anything/else",
    "raw-in-query": b"/token/ready?after=1&timeout=1\x00&after=9",
    "encoded-then-query": b"/token%00?x=1",
}


@pytest.mark.parametrize("case", sorted(NUL_TARGETS))
@pytest.mark.parametrize("listener", ["token", "admin"])
def test_a_target_with_a_nul_is_refused_not_cut_short(plain_broker, case, listener):
    target = NUL_TARGETS[case].replace(b"/token", b"/healthz") if listener == "admin" else NUL_TARGETS[case]
    request = b"GET " + target + b" HTTP/1.1\r\nHost: x\r\n" + GUARD + b"\r\n"
    answer, closed = exchange(plain_broker.addresses[listener], request)
    assert_refused(answer, closed)
    assert b"NUL" in parse(answer)[2]
    # A %00 in the query is not the path's: it stays in the value, for the query's readers to judge.
    status, _, _ = parse(exchange(plain_broker.addresses[listener],
                                  b"GET " + (b"/healthz" if listener == "admin" else b"/token")
                                  + b"?x=%00 HTTP/1.1\r\nHost: x\r\n" + GUARD + b"Connection: close\r\n\r\n")[0])
    assert status == 200


SPACED_TARGETS = {
    "space in the path": b"/token /x",
    "space in the query": b"/token?a= b",
    "tab in the path": b"/token\t/x",
    "DEL in the query": b"/token?a=\x7f",
    "escape in the path": b"/token\x1b[0m",
}


@pytest.mark.parametrize("case", sorted(SPACED_TARGETS))
@pytest.mark.parametrize("listener", ["token", "admin"])
def test_a_target_with_a_space_or_a_control_character_is_refused(plain_broker, case, listener):
    """libmicrohttpd takes a request line's last space for the one before its version: `GET
    /token /x HTTP/1.1` reached the routes as the path `/token /x` (404) and `/token?a= b` was
    served (200), where RFC 9112 §3.2 allows no whitespace in a target, and a server in front may
    split the line at its first space instead."""
    target = SPACED_TARGETS[case].replace(b"/token", b"/healthz") if listener == "admin" else SPACED_TARGETS[case]
    request = b"GET " + target + b" HTTP/1.1\r\nHost: x\r\n" + GUARD + b"\r\n"
    answer, closed = exchange(plain_broker.addresses[listener], request)
    assert_refused(answer, closed)
    assert b"space or a control character" in parse(answer)[2]


@pytest.mark.parametrize("listener", ["token", "admin"])
def test_a_target_with_more_query_arguments_than_the_buffer_holds_gets_414_at_once(
        plain_broker, listener):
    """libmicrohttpd 0.9.75 reads a query's arguments into the connection's 4 KiB, about 56 bytes
    each: 70 of them, in a target of 280 bytes, did not fit, and it then lost its own 431 (it reads
    on as if none had been queued): the connection hung unanswered until its timeout, with the
    request pipelined behind it. The broker now ends such a query before libmicrohttpd reads it,
    and answers 414 at the head, closing the connection, as for a malformed head."""
    path = b"/healthz" if listener == "admin" else b"/token"

    def target(arguments):
        return b"GET " + path + b"?" + b"&".join([b"a=1"] * arguments) + b" HTTP/1.1\r\nHost: x\r\n" + GUARD

    answer, closed = exchange(plain_broker.addresses[listener],
                              target(70) + b"\r\n" + b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n" + GUARD + b"\r\n")
    first = parse(answer)
    assert first is not None, "no answer"
    status, headers, body = first
    assert status == 414 and headers["content-type"] == "application/json", answer
    assert headers["connection"] == "close" and closed, answer
    assert json.loads(body)["error"] == "uri_too_long", body
    assert answer.count(b"HTTP/1.1 ") == 1, "the pipelined request is not read"
    # Forty, in a target of 166 bytes, are read as any query is (a default connection takes 45).
    status, _, _ = parse(exchange(plain_broker.addresses[listener], target(40) + b"Connection: close\r\n\r\n")[0])
    assert status == 200
    # A longer target leaves less room: 25 arguments behind a path of 2,700 bytes hung too.
    long_path = path + b"/" + b"p" * 2700
    answer, closed = exchange(plain_broker.addresses[listener],
                              b"GET " + long_path + b"?" + b"&".join([b"a=1"] * 25) + b" HTTP/1.1\r\nHost: x\r\n"
                              + GUARD + b"\r\n")
    assert parse(answer) and parse(answer)[0] == 414 and closed, answer[:200]


ARGUMENTS = b"&".join(b"a%d=1" % i for i in range(200))
# A NUL sent raw before the query: libmicrohttpd finds the `?` over the whole target and reads the
# arguments after it, which the broker counted only up to the NUL; 200 of them did not fit the
# connection's 4 KiB, and libmicrohttpd then lost its own 431: no answer for 30 s (the
# connection's timeout), then the connection closed.
NUL_BEFORE_QUERY = {
    "one NUL": b"/tok\x00en?" + ARGUMENTS,
    "three NULs": b"/t\x00o\x00\x00ken?" + ARGUMENTS,
    "60 arguments": b"/tok\x00en?" + ARGUMENTS[:ARGUMENTS.index(b"a60=")],
    "in the path, on the admin listener": b"/healthz\x00x?" + ARGUMENTS,
    # A NUL followed, raw, by what follows the one before the version: it looks like the end.
    "a NUL that looks like the end": b"/a\x00HTTP/1.1\x00?" + ARGUMENTS,
    "and a path that fills the memory": b"/a\x00HTTP/1.1\x00" + b"p" * 3950 + b"?x=1",
}


@pytest.mark.parametrize("case", sorted(NUL_BEFORE_QUERY))
def test_a_target_with_a_raw_nul_before_its_query_is_refused_at_once(plain_broker, case):
    listener = "admin" if "admin" in case else "token"
    request = b"GET " + NUL_BEFORE_QUERY[case] + b" HTTP/1.1\r\nHost: x\r\n" + GUARD + b"\r\n"
    answer, closed = exchange(plain_broker.addresses[listener], request, timeout=10)
    assert_refused(answer, closed)
    assert b"NUL" in parse(answer)[2]
    status, _, _ = parse(exchange(plain_broker.addresses[listener], b"GET " + (
        b"/healthz" if listener == "admin" else b"/token") + b" HTTP/1.1\r\nHost: x\r\n" + GUARD
        + b"Connection: close\r\n\r\n")[0])
    assert status == 200


def padded_head(size):
    """A GET /token head of exactly `size` bytes, its last header padded."""
    start = b"GET /token HTTP/1.1\r\nHost: x\r\n" + GUARD + b"Connection: close\r\nX-Pad: "
    return start + b"a" * (size - len(start) - 4) + b"\r\n\r\n"


@pytest.mark.parametrize("kib", [4, 16])
def test_every_head_gets_its_answer_or_431_never_a_silent_close(kib):
    """libmicrohttpd builds the answer's head in what the request's head leaves of the connection's
    memory (`connectionMemoryKiB`), and closed the connection without a byte where it did not fit:
    with 4 KiB, heads of about 3,790 to 3,970 bytes. Every head now gets its answer, or 431: the
    broker's JSON one (sent past libmicrohttpd where even its head does not fit), or
    libmicrohttpd's own for a head larger than the memory."""
    memory = kib * 1024
    with Broker({"providers": [{"name": "default"}], "connectionMemoryKiB": kib}) as broker:
        answers = {}
        for size in [memory - 3000, memory - 2000, *range(memory - 700, memory + 200, 8)]:
            answer, closed = exchange(broker.addresses["token"], padded_head(size), timeout=10)
            parsed = parse(answer)
            assert parsed is not None, f"a head of {size} bytes in {kib} KiB: closed without an answer"
            status, headers, body = parsed
            assert status in (200, 431), (size, answer[:300])
            if status == 431:
                assert closed and headers["connection"] == "close", (size, answer[:300])
                if headers.get("content-type") == "application/json":
                    assert json.loads(body)["error"] == "request_header_fields_too_large", body
                    status = "431 json"
            answers[status] = answers.get(status, 0) + 1
        assert answers.get(200) and answers.get("431 json") and answers.get(431), answers
        # The same with a default connection on the admin listener (4 KiB).
        for size in (3750, 3800, 3889, 3950, 4200):
            answer, _ = exchange(broker.addresses["admin"], padded_head(size).replace(b"/token", b"/healthz"))
            assert parse(answer) and parse(answer)[0] == 431, (size, answer[:300])
        assert broker.process.poll() is None


def test_a_proxied_target_with_a_raw_nul_is_refused_not_forwarded_cut_short(tmp_path, upstream):
    config, low_key, _ = two_callers(tmp_path, upstream)
    with Broker(config) as broker:
        before = len(upstream.seen)
        request = (b"GET /proxy/low/a\x00b HTTP/1.1\r\nHost: x\r\n" + GUARD
                   + b"Authorization: Bearer " + low_key.encode() + b"\r\n\r\n")
        assert_refused(*exchange(broker.addresses["token"], request))
        assert upstream.seen[before:] == []


def two_callers(tmp_path, upstream):
    low_key, high_key = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    keys = tmp_path / "callers.json"
    write_keys(keys, [("low-app", low_key, ["low"]), ("high-app", high_key, ["high"])])
    config = {"providers": [{"name": "low"}, {"name": "high"}], "clientKeysFile": str(keys),
              "proxies": [{"name": "low", "target": upstream.base + "/low", "provider": "low"},
                          {"name": "high", "target": upstream.base + "/high", "provider": "high"}]}
    return config, low_key, high_key


def test_a_smuggled_request_never_reaches_the_upstream_nor_gets_another_callers_token(tmp_path, upstream):
    config, low_key, high_key = two_callers(tmp_path, upstream)
    with Broker(config) as broker:
        # Warm a pooled upstream connection, as a busy proxy would have.
        assert broker.request("GET", "/proxy/low/warm", headers={"Authorization": "Bearer " + low_key})[0] == 200
        before = len(upstream.seen)
        smuggled = b"helloGET /admin/delete-everything HTTP/1.1\r\nHost: upstream\r\nX-Swallow: "
        attack = (b"POST /proxy/low/upload HTTP/1.1\r\nHost: 127.0.0.1\r\n" + GUARD
                  + b"Authorization: Bearer " + low_key.encode() + b"\r\n"
                  + b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
                  + f"{len(smuggled):x}\r\n".encode() + smuggled + b"\r\n0\r\n\r\n")
        answer, closed = exchange(broker.addresses["token"], attack)
        assert_refused(answer, closed)
        status, _, body = broker.request("GET", "/proxy/high/orders", headers={"Authorization": "Bearer " + high_key})
        assert status == 200 and json.loads(body)["path"] == "/high/orders", body
        seen = upstream.seen[before:]
        assert [entry["path"] for entry in seen] == ["/high/orders"], seen
        high_token = broker.get_json("/providers/high/token", headers={"Authorization": "Bearer " + high_key})[0]["access_token"]
        assert dict((k.lower(), v) for k, v in seen[0]["headers"])["authorization"] == "Bearer " + high_token
        assert not any("swallow" in k.lower() for k, _ in seen[0]["headers"])


def test_proxy_headers_stay_behind_and_bad_header_lines_are_refused_before_forwarding(tmp_path, upstream):
    config, low_key, _ = two_callers(tmp_path, upstream)
    with Broker(config) as broker:
        before = len(upstream.seen)
        status, _, _ = broker.request("GET", "/proxy/low/h", headers={
            "Authorization": "Bearer " + low_key, "Proxy": "http://evil.example:8080", "Proxy-Foo": "x",
            "PROXY-Authorization": "Basic eA==", "X-Kept": "yes"})
        assert status == 200
        names = {k.lower() for k, _ in upstream.seen[-1]["headers"]}
        assert "x-kept" in names
        assert not {"proxy", "proxy-foo", "proxy-authorization"} & names, names
        for bad in (b"X Bad: 1\r\n", b"X-Ctl: a\x01b\r\n", b"X-Fold: a\r\n b\r\n"):
            request = (b"GET /proxy/low/bad HTTP/1.1\r\nHost: x\r\n" + GUARD
                       + b"Authorization: Bearer " + low_key.encode() + b"\r\n" + bad + b"\r\n")
            assert_refused(*exchange(broker.addresses["token"], request))
        assert [entry["path"] for entry in upstream.seen[before:]] == ["/low/h"]


def test_a_body_cut_short_is_not_finished_upstream_and_its_connection_is_not_reused(tmp_path, upstream):
    config, low_key, _ = two_callers(tmp_path, upstream)
    config["proxies"][0]["bufferBodyBytes"] = 0  # stream every body
    with Broker(config) as broker:
        before = len(upstream.seen)
        host, port = broker.addresses["token"].rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as client:
            client.sendall(b"PUT /proxy/low/upload HTTP/1.1\r\nHost: x\r\n" + GUARD
                           + b"Authorization: Bearer " + low_key.encode() + b"\r\n"
                           + b"Content-Length: 100000\r\n\r\n" + b"a" * 30000)
            time.sleep(0.5)
        # The upstream sees the cut (its read ends early), never a complete request.
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and upstream.server.cut_short == 0:
            time.sleep(0.05)
        assert upstream.server.cut_short >= 1
        status, _, body = broker.request("GET", "/proxy/low/after", headers={"Authorization": "Bearer " + low_key})
        assert status == 200, body
        assert [entry["path"] for entry in upstream.seen[before:]] == ["/low/after"]


def test_idle_connections_cannot_starve_the_admin_listener():
    with Broker() as broker:
        host, port = broker.addresses["admin"].rsplit(":", 1)
        idle = []
        try:
            for _ in range(300):
                idle.append(socket.create_connection((host, int(port)), timeout=10))
            time.sleep(0.3)
            status, _, body = broker.request("GET", "/healthz", listener="admin", timeout=5)
            assert status == 200, body
            evicted = broker.metric("token_broker_connections_evicted_total", listener="admin")
            assert evicted >= 300 - 240
        finally:
            for connection in idle:
                connection.close()


def test_the_admin_listener_closes_idle_connections_after_connection_timeout():
    with Broker({"connectionTimeoutSec": 1}) as broker:
        host, port = broker.addresses["admin"].rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=15) as connection:
            started = time.monotonic()
            assert connection.recv(1) == b""  # closed by the broker, not by this timeout
            assert time.monotonic() - started < 14


def test_making_room_never_closes_a_connection_whose_request_head_has_arrived():
    with Broker({"connectionLimit": 16}) as broker:
        host, port = broker.addresses["token"].rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=20) as uploading:
            uploading.sendall(b"POST /token/refresh HTTP/1.1\r\nHost: x\r\n" + GUARD
                              + b"Content-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{")
            time.sleep(0.3)
            idle = []
            try:
                for _ in range(30):
                    idle.append(socket.create_connection((host, int(port)), timeout=10))
                    time.sleep(0.01)
                time.sleep(0.5)
                uploading.sendall(b"}")
                received = b""
                while True:
                    chunk = uploading.recv(65536)
                    if not chunk:
                        break
                    received += chunk
            finally:
                for connection in idle:
                    connection.close()
        status, _, body = parse(received)
        assert status == 200, received
        assert broker.metric("token_broker_connections_evicted_total", listener="token") >= 1


def test_libmicrohttpds_own_messages_go_through_the_log_and_cannot_forge_a_line():
    """libmicrohttpd quotes a request's path when it fails to send an answer; a path with %0a in
    it must not start a line of its own that looks like the broker's."""
    import struct

    forged = "time=2026-01-01T00:00:00Z%20level=error%20msg=INJECTED"
    request = f"GET /x%0a{forged} HTTP/1.1\r\nHost: x\r\n".encode() + GUARD + b"\r\n"
    with Broker() as broker:
        host, port = broker.addresses["token"].rsplit(":", 1)
        # A send fails only when the reset arrives while libmicrohttpd is still answering the
        # pipelined requests: usually at once, but on a loaded machine it may take many tries.
        deadline = time.monotonic() + 90
        for _ in range(900):
            with socket.create_connection((host, int(port)), timeout=10) as connection:
                connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                connection.sendall(request * 200)
            time.sleep(0.1)
            if "msg=libmicrohttpd" in broker.stderr() or time.monotonic() > deadline:
                break
        log = broker.stderr()
        assert "msg=libmicrohttpd" in log, "no send ever failed, so nothing was shown"
        assert not any(line.startswith("time=2026-01-01") or "msg=INJECTED" in line.split(" detail=")[0]
                       for line in log.splitlines()), log
        assert all(line.startswith("time=") for line in log.splitlines()), log


def test_answer_headers_with_control_characters_are_dropped_and_counted(tmp_path, upstream):
    config, low_key, _ = two_callers(tmp_path, upstream)
    with Broker(config) as broker:
        answer, _ = exchange(broker.addresses["token"], b"GET /proxy/low/control-characters HTTP/1.1\r\nHost: x\r\n" + GUARD
                             + b"Authorization: Bearer " + low_key.encode() + b"\r\nConnection: close\r\n\r\n")
        head = answer.partition(b"\r\n\r\n")[0]
        assert head.startswith(b"HTTP/1.1 200"), answer
        assert b"x-fine: a\tb" in head.lower()
        assert b"x-ctl" not in head.lower() and b"x-del" not in head.lower(), head
        assert not any(byte < 0x20 and byte not in (0x09, 0x0a, 0x0d) or byte == 0x7f for byte in head)
        assert broker.metric("token_broker_response_headers_dropped_total") == 2
