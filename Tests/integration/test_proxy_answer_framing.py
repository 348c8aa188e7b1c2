"""Proxy mode against raw-socket upstreams on loopback that send answers no ordinary server
would: heads too large for a connection, conflicting lengths, too many or folded headers, a
101, a chunked answer to HEAD, a 304 with a length. The client must always get an answer that
is either the upstream's, whole and well framed, or the broker's own 502, never one that looks
complete but is not."""
import json
import socket
import threading
import time

import pytest

from broker import GUARD, Broker
from test_hardening import exchange, parse


class ScriptedUpstream:
    """An upstream on 127.0.0.1 that answers each request it reads with `answer(method, target)`,
    bytes sent as they are, and keeps the connection for the next request (at most ten per
    connection); with `once_per_connection`, a request on a connection used before is read whole
    and the connection closed without an answer, as an upstream that acted on it and went away.
    It records the request lines it read in `seen`, and each request (method, header fields by
    lowercase name, body) in `requests`."""

    def __init__(self, answer, once_per_connection=False):
        self.answer = answer
        self.once_per_connection = once_per_connection
        self.requests = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.5)
        self.address = "127.0.0.1:%d" % self.listener.getsockname()[1]
        self.seen = []
        self.stopping = False
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        while not self.stopping:
            try:
                connection, _ = self.listener.accept()
            except socket.timeout:
                continue
            threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    def _serve(self, connection):
        connection.settimeout(10)
        buffered, served = b"", 0
        with connection:
            for _ in range(10):
                while b"\r\n\r\n" not in buffered:
                    try:
                        chunk = connection.recv(65536)
                    except OSError:
                        return
                    if not chunk:
                        return
                    buffered += chunk
                head, _, buffered = buffered.partition(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                fields = {name.strip().lower(): value.strip() for name, value in
                          (line.split(":", 1) for line in lines[1:])}
                length = int(fields.get("content-length", "0"))
                while len(buffered) < length:
                    chunk = connection.recv(65536)
                    if not chunk:
                        return
                    buffered += chunk
                body, buffered = buffered[:length], buffered[length:]
                method, target = lines[0].split(" ")[:2]
                self.seen.append((method, target))
                self.requests.append((method, fields, body))
                if self.once_per_connection and served:
                    return
                served += 1
                try:
                    connection.sendall(self.answer(method, target))
                except OSError:
                    return

    def close(self):
        self.stopping = True
        self.thread.join(5)
        self.listener.close()


@pytest.fixture
def upstream_answering(request):
    """Starts a broker with proxy `u` in front of a `ScriptedUpstream`; yields a function that
    takes the answer (bytes, or a function of method and target) and any broker settings, and
    returns (broker, upstream)."""
    started = []

    def start(answer, proxy=None, provider=None, **config):
        upstream = ScriptedUpstream(answer if callable(answer) else (lambda method, target: answer))
        broker = Broker({"proxies": [{"name": "u", "target": "http://" + upstream.address, **(proxy or {})}],
                         "providers": [{"name": "default", **(provider or {})}], **config})
        started.append((broker, upstream))
        return broker, upstream

    yield start
    for broker, upstream in started:
        broker.stop()
        upstream.close()


def get(broker, method="GET", path="/proxy/u/x"):
    """One request on a connection of its own: (status, headers, body, everything received)."""
    answer = exchange(broker.addresses["token"],
                      f"{method} {path} HTTP/1.1\r\nHost: b\r\nToken-Broker-Request: true\r\n"
                      "Connection: close\r\n\r\n".encode(), timeout=20)[0]
    assert answer, "no answer at all"
    status, headers, body = parse(answer)
    return status, headers, body, answer


def read_head(connection, timeout=20):
    """Reads from a kept connection until an answer's head has ended; everything read. Fails
    when the connection closes first."""
    received = b""
    deadline = time.monotonic() + timeout
    while b"\r\n\r\n" not in received and time.monotonic() < deadline:
        chunk = connection.recv(65536)
        assert chunk, f"the connection closed after {received!r}"
        received += chunk
    return received


def assert_bad_answer_502(broker, answer_bytes, problem):
    status, headers, body, _ = answer_bytes
    assert status == 502, answer_bytes
    error = json.loads(body)
    assert error["error"] == "upstream_unreachable" and problem in error["error_description"], error
    assert broker.metric("token_broker_proxy_requests_total", proxy="u", code="502") == 1
    assert broker.metric("token_broker_proxy_requests_total", proxy="u", code="200") == 0


def test_an_answer_head_too_large_for_the_connection_is_a_502_not_an_empty_reply(upstream_answering):
    """With the default 4 KiB of connection memory, libmicrohttpd cannot build a head of 4 KB:
    it closed the connection without a byte, and the broker counted a 200."""
    big = b"HTTP/1.1 200 OK\r\nX-Big: " + b"b" * 4000 + b"\r\nContent-Length: 2\r\n\r\nok"
    broker, _ = upstream_answering(big)
    assert_bad_answer_502(broker, get(broker), "head")
    # A head that fits still goes through.
    fits = b"HTTP/1.1 200 OK\r\nX-Big: " + b"b" * 1000 + b"\r\nContent-Length: 2\r\n\r\nok"
    broker, _ = upstream_answering(fits)
    status, headers, body, _ = get(broker)
    assert (status, body, headers["x-big"]) == (200, b"ok", "b" * 1000)


@pytest.mark.parametrize("request_extra", ["query", "cookies"])
def test_query_arguments_and_cookies_leave_less_room_for_the_answers_head(upstream_answering, request_extra):
    """libmicrohttpd keeps a record per query argument and per cookie in the connection's
    memory: with 36 arguments (the most a target may have with 4 KiB) or 40 cookies, a
    2,000-byte answer header no longer fits, and must be a 502, not an empty reply counted as 200."""
    head = b"HTTP/1.1 200 OK\r\nX-Big: " + b"b" * 2000 + b"\r\nContent-Length: 2\r\n\r\nok"
    broker, _ = upstream_answering(head)
    if request_extra == "query":
        path, extra = "/proxy/u/x?" + "&".join(f"a{i}=1" for i in range(36)), ""
    else:
        path, extra = "/proxy/u/x", "Cookie: " + "; ".join(f"c{i}=1" for i in range(40)) + "\r\n"
    received = exchange(broker.addresses["token"],
                        f"GET {path} HTTP/1.1\r\nHost: b\r\nToken-Broker-Request: true\r\n{extra}"
                        "Connection: close\r\n\r\n".encode(), timeout=20)[0]
    assert received, "an empty reply"
    assert_bad_answer_502(broker, (*parse(received), received), "head")
    assert broker.metric("token_broker_proxy_requests_total", proxy="u", code="200") == 0


def test_conflicting_content_lengths_are_a_502(upstream_answering):
    """RFC 9112 §6.3 item 5: an answer with two different lengths cannot be framed."""
    broker, _ = upstream_answering(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 7\r\n\r\nhello..")
    assert_bad_answer_502(broker, get(broker), "Content-Length")
    # The same length twice, or as a list, frames the answer one way only: it goes through.
    broker, _ = upstream_answering(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5, 5\r\n\r\nhello")
    status, _, body, _ = get(broker)
    assert (status, body) == (200, b"hello")


def test_an_answer_with_more_headers_than_are_passed_on_is_a_502(upstream_answering):
    """Headers past the 200th were dropped unseen: a dropped Cache-Control changes the answer."""
    lines = b"".join(b"X-H%d: %d\r\n" % (n, n) for n in range(200))
    broker, _ = upstream_answering(b"HTTP/1.1 200 OK\r\n" + lines + b"Cache-Control: no-store\r\nContent-Length: 2\r\n\r\nok")
    assert_bad_answer_502(broker, get(broker), "headers")


def test_switching_protocols_from_the_upstream_is_a_502(upstream_answering):
    """RFC 9110 §15.2.2: the broker does not tunnel. After a 101 the connection speaks another
    protocol; the broker read on as HTTP, and passed on what looked like an answer there."""
    broker, _ = upstream_answering(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
                                   b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
    assert_bad_answer_502(broker, get(broker), "101")


def test_an_obs_folded_header_reaches_the_client_unfolded_whole(upstream_answering):
    """RFC 9112 §5.2: each fold is replaced by a space; the continuation was lost."""
    broker, _ = upstream_answering(b"HTTP/1.1 200 OK\r\nX-A: foo\r\n  bar\r\n\tbaz\r\nContent-Length: 2\r\n\r\nok")
    status, headers, body, _ = get(broker)
    assert (status, body, headers["x-a"]) == (200, b"ok", "foo bar baz")


def test_proxy_headers_of_the_answer_stay_behind(upstream_answering):
    """`Proxy`, `Proxy-*` stay behind both ways, as the README says."""
    broker, _ = upstream_answering(b"HTTP/1.1 200 OK\r\nProxy: http://evil\r\nProxy-Status: x; error=y\r\n"
                                   b"Proxy-Authentication-Info: a=b\r\nX-Kept: 1\r\nContent-Length: 2\r\n\r\nok")
    status, headers, body, _ = get(broker)
    assert (status, body, headers["x-kept"]) == (200, b"ok", "1")
    assert not [name for name in headers if name.startswith("proxy")], headers


def test_a_304_says_no_length_other_than_the_upstreams(upstream_answering):
    """RFC 9110 §8.6: a 304's Content-Length must be what a 200 would say; it said 0. It says
    the upstream's, nothing follows its head, and the client's connection is kept: a second
    request on it gets the same."""
    broker, _ = upstream_answering(b"HTTP/1.1 304 Not Modified\r\nETag: \"e\"\r\nContent-Length: 1234\r\n\r\n")
    host, port = broker.addresses["token"].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=20) as connection:
        for _ in range(2):
            connection.sendall(b"GET /proxy/u/x HTTP/1.1\r\nHost: b\r\nToken-Broker-Request: true\r\n\r\n")
            received = read_head(connection)
            status, headers, _ = parse(received)
            assert status == 304 and headers["etag"] == '"e"' and headers.get("content-length") == "1234", headers
            assert received.endswith(b"\r\n\r\n") and received.count(b"\r\n\r\n") == 1, "nothing follows the head"
        # Still nothing after the second head.
        connection.settimeout(0.5)
        with pytest.raises(socket.timeout):
            connection.recv(1)


def test_a_refused_answer_passed_on_whole_keeps_the_length_it_stands_for(upstream_answering):
    """A refused answer is held for one retry; when no retry may be made (here the forced
    refreshes are used up), it is passed on whole. An answer to HEAD, or a 304, has no body to
    hold, and went out saying `Content-Length: 0`; it says the upstream's length, as one passed
    on as it comes does, and the connection goes on."""
    def answer(method, target):
        if target.endswith("/not-modified"):
            return b"HTTP/1.1 304 Not Modified\r\nETag: \"e\"\r\nContent-Length: 1234\r\n\r\n"
        head = b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 12\r\n\r\n"
        return head if method == "HEAD" else head + b"unauthorized"

    broker, _ = upstream_answering(answer, proxy={"retryOn": [304, 401]}, provider={"forcedRefreshMaxAttempts": 1})
    assert get(broker)[0] == 401  # takes the one forced refresh: the answer after it goes on as it comes
    host, port = broker.addresses["token"].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=20) as connection:
        for method, path, length in [("HEAD", "/proxy/u/x", "12"), ("GET", "/proxy/u/not-modified", "1234")]:
            connection.sendall(f"{method} {path} HTTP/1.1\r\nHost: b\r\nToken-Broker-Request: true\r\n\r\n".encode())
            received = read_head(connection)
            status, headers, _ = parse(received)
            assert headers.get("content-length") == length, (method, path, received)
            assert received.endswith(b"\r\n\r\n"), "nothing follows the head"
    assert broker.metric("token_broker_proxy_requests_total", proxy="u", code="304") == 1


def test_a_304_without_a_length_has_none(upstream_answering):
    """Without the upstream's length there is none to give: no Content-Length (not 0), no
    chunking, nothing after the head."""
    broker, _ = upstream_answering(b"HTTP/1.1 304 Not Modified\r\nETag: \"e\"\r\n\r\n")
    status, headers, body, received = get(broker)
    assert status == 304 and "content-length" not in headers and "transfer-encoding" not in headers, headers
    assert received.endswith(b"\r\n\r\n") and received.count(b"\r\n\r\n") == 1, "nothing follows the head"


def test_a_chunked_answer_to_head_leaves_the_clients_connection_well_framed(upstream_answering):
    """RFC 9112 §6.3 rule 1: nothing follows the head of an answer to HEAD. The broker sent
    `0\\r\\n\\r\\n` after it, which a client reads as the start of its next answer."""
    broker, _ = upstream_answering(lambda method, target: b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-M: %s\r\n\r\n"
                                   % method.encode() + (b"" if method == "HEAD" else b"2\r\nok\r\n0\r\n\r\n"))
    host, port = broker.addresses["token"].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=20) as connection:
        connection.sendall(b"HEAD /proxy/u/x HTTP/1.1\r\nHost: b\r\nToken-Broker-Request: true\r\n\r\n")
        received = b""
        while b"\r\n\r\n" not in received:
            chunk = connection.recv(65536)
            assert chunk, received
            received += chunk
        head, _, after = received.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200") and b"x-m: head" in head.lower(), head
        # A second request on the same connection: its answer must follow the head directly,
        # or the broker must have closed the connection after the head (and sent nothing more).
        try:
            connection.sendall(b"GET /proxy/u/y HTTP/1.1\r\nHost: b\r\nToken-Broker-Request: true\r\nConnection: close\r\n\r\n")
        except OSError:
            pass
        for _ in range(1000):
            try:
                chunk = connection.recv(65536)
            except (ConnectionResetError, socket.timeout):
                break
            if not chunk:
                break
            after += chunk
    assert after == b"" or after.startswith(b"HTTP/1.1 200"), after[:80]
    if after:
        status, headers, body = parse(after)
        assert headers["x-m"] == "GET" and b"ok" in body


def test_a_refused_answer_is_never_passed_on_cut_short_looking_whole(upstream_answering):
    """With no new token to retry with, the refused answer is passed on. Its body was cut to
    64 KiB, with `Content-Length: 65536`; it must come whole (or visibly cut)."""
    body = bytes(range(256)) * 400  # 102,400 bytes
    broker, _ = upstream_answering(b"HTTP/1.1 401 Unauthorized\r\nContent-Length: %d\r\n\r\n" % len(body) + body,
                                   provider={"forcedRefreshMaxAttempts": 1})
    # The first refusal forces the one refresh allowed; the second gets no new token.
    for _ in range(2):
        status, headers, received, raw_answer = get(broker)
        assert status == 401
        assert received == body, (len(received), headers.get("content-length"))


@pytest.mark.parametrize("timeout_msec", [2000, 60000])
def test_a_refused_request_waits_for_a_new_token_no_longer_than_its_exchange_may_take(timeout_msec):
    """`timeoutMsec` covers the whole exchange: a refused request whose forced refresh fails
    was held for `maxWaitSec` (30 s here) instead. It now waits at most what is left of the
    exchange (2 s), and not past the failed fetch (with an exchange of 60 s, nothing else would
    end it before 30 s). The client waits at most 20 s."""
    fetches = []

    def answer(method, target):
        if target.startswith("/token"):
            fetches.append(target)
            if len(fetches) == 1:
                document = b'{"access_token": "first", "expires_in": 3600}'
                return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
                    len(document), document)
            return b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\n\r\nsick"
        return b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 7\r\n\r\nrefused"

    upstream = ScriptedUpstream(answer)
    broker = Broker({"maxWaitSec": 30,
                     "proxies": [{"name": "u", "target": "http://" + upstream.address + "/api", "timeoutMsec": timeout_msec}],
                     "providers": [{"name": "default", "source": {"type": "http", "url": f"http://{upstream.address}/token"}}]})
    try:
        status, _, body, _ = get(broker)
        assert (status, body) == (401, b"refused")
        assert len(fetches) >= 2, "the refusal forced a refresh, which failed"
    finally:
        broker.stop()
        upstream.close()
