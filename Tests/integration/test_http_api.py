"""The HTTP API end to end: the guard, long-polls, the retrier, cookies, metrics, shutdown."""
import asyncio
import json
import os
import resource
import signal
import socket
import threading
import time

import jwt
import pytest

from broker import GUARD, Broker


def raise_open_files():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < min(hard, 8192):
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 8192), hard))


def wait_until(condition, timeout=15, interval=0.02):
    """Polls `condition` until true; a generous bound, never a timing assertion."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return condition()


async def raw_requests(address, requests, concurrency_ready=None):
    """Sends many HTTP/1.1 requests on their own connections; returns [(status, body)].

    `concurrency_ready` is awaited after every request has been written, before any is read.
    """
    host, _, port = address.rpartition(":")

    async def one(request):
        reader, writer = await asyncio.open_connection(host.strip("[]"), int(port))
        writer.write(request)
        await writer.drain()
        return reader, writer

    opened = await asyncio.gather(*(one(r) for r in requests))
    if concurrency_ready:
        await concurrency_ready()

    async def answer(reader, writer):
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 40)
            status = int(head.split(b" ")[1])
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            body = await asyncio.wait_for(reader.readexactly(length), 10) if length else b""
            return status, body
        finally:
            writer.close()

    return await asyncio.gather(*(answer(r, w) for r, w in opened))


def get(path, extra=b""):
    return b"GET " + path.encode() + b" HTTP/1.1\r\nHost: broker\r\nToken-Broker-Request: true\r\nConnection: close\r\n" + extra + b"\r\n"


def post(path, body):
    data = json.dumps(body).encode()
    return (b"POST " + path.encode() + b" HTTP/1.1\r\nHost: broker\r\nToken-Broker-Request: true\r\nConnection: close\r\n"
            + b"Content-Type: application/json\r\nContent-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)


# The request guard

def test_the_guard_refuses_requests_without_its_header_or_with_x_forwarded_for(broker):
    for path in ["/token", "/token/ready", "/providers/default/token"]:
        status, _, body = broker.request("GET", path, guard=False)
        assert status == 403
        document = json.loads(body)
        assert document["error"] == "missing_request_header"
        assert "Token-Broker-Request: true" in document["error_description"]
    status, _, body = broker.request("POST", "/token/refresh", guard=False)
    assert status == 403
    status, _, body = broker.request("GET", "/token", headers={"X-Forwarded-For": "127.0.0.1"})
    assert status == 403 and json.loads(body)["error"] == "forwarded_request"
    status, _, _ = broker.request("GET", "/token", headers={"Token-Broker-Request": "yes"}, guard=False)
    assert status == 403
    assert broker.request("GET", "/.well-known/jwks.json", guard=False)[0] == 200, "public keys need no guard"


def test_the_guard_refuses_a_request_relayed_with_forwarded(broker):
    """RFC 7239's `Forwarded` is the standard form of `X-Forwarded-For`: a proxy that relays a
    request adds one or the other, and the guard refuses both (it let `Forwarded` through)."""
    for method, path in (("GET", "/token"), ("GET", "/token/ready?timeout=0"), ("POST", "/token/refresh"),
                         ("GET", "/providers/default/token")):
        for value in ("for=203.0.113.9", 'for="[2001:db8::1]";proto=https', ""):
            status, _, body = broker.request(method, path, headers={"Forwarded": value})
            assert status == 403, (method, path, value, status, body)
            assert json.loads(body)["error"] == "forwarded_request", body
    status, _, body = broker.request("GET", "/token", headers={"forwarded": "for=203.0.113.9"})
    assert status == 403 and json.loads(body)["error"] == "forwarded_request", body
    assert broker.request("GET", "/token", headers={"Forwarded-Host": "example.com"})[0] == 200


def test_operators_can_turn_the_guard_off():
    with Broker({"requestGuard": False}) as broker:
        assert broker.request("GET", "/token", guard=False)[0] == 200
        assert "request guard is off" in broker.stderr()


# Long-polls

def test_ready_answers_at_once_when_a_newer_token_is_cached_and_304_when_none_comes(broker):
    body, headers = broker.get_json("/token/ready?after=0&timeout=5")
    assert body["version"] == 1 and headers["etag"] == '"1"'
    status, headers, payload = broker.request("GET", "/token/ready?after=1&timeout=1")
    assert status == 304 and headers["etag"] == '"1"' and payload == b""
    status, headers, _ = broker.request("GET", "/token/ready?timeout=1", headers={"If-None-Match": '"1"'})
    assert status == 304 and headers["etag"] == '"1"'
    body, _ = broker.get_json("/token/ready")
    assert body["version"] == 1, "without after, any valid token answers at once"


def test_if_none_match_split_across_lines_is_read_as_one_list(broker):
    """RFC 9110 §5.3: a list header may be sent as several lines, which together are the list.
    Only the first line was read: a client holding version 2 that sent `"1"` and `"2"` on two
    lines got version 2 again at once (200) instead of a long-poll ending in 304."""
    status, headers, body = broker.request("POST", "/token/refresh", body=b"{}", timeout=30)
    assert status == 200 and headers["etag"] == '"2"', (status, body)

    def ready(lines, timeout):
        """GET /token/ready with each of `lines` as an If-None-Match line: (status, ETag)."""
        host, port = broker.addresses["token"].rsplit(":", 1)
        extra = b"".join(b"If-None-Match: " + line + b"\r\n" for line in lines)
        with socket.create_connection((host, int(port)), timeout=30) as connection:
            connection.sendall(get(f"/token/ready?timeout={timeout}", extra))
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = connection.recv(4096)
                assert chunk, head
                head += chunk
        lines = head.split(b"\r\n\r\n")[0].split(b"\r\n")
        etags = [line.split(b":", 1)[1].strip() for line in lines if line.lower().startswith(b"etag:")]
        return int(lines[0].split(b" ")[1]), etags

    for lines in ([b'"1"', b'"2"'], [b'"2"', b'"1"'], [b'"1"', b'W/"2"', b'"x"'], [b'"1"', b"*"],
                  [b'"1"', b'"0", W/"2"']):
        assert ready(lines, 1) == (304, [b'"2"']), lines
    # Lines that name only older versions are answered at once with the current token.
    assert ready([b'"1"', b'"0"'], 20) == (200, [b'"2"'])


def test_a_304_says_the_length_of_the_answer_it_stands_for_and_keeps_the_connection(broker):
    """RFC 9110 §8.6: a 304's Content-Length, if sent, is what a 200 to the same request would
    say. It said 0. http.client reads no body after a 304, so a second answer on the connection
    also shows that none was sent."""
    connection = broker.connection()
    try:
        connection.request("GET", "/token/ready?timeout=1", headers={**GUARD, "If-None-Match": '"1"'})
        response = connection.getresponse()
        assert response.status == 304 and response.read() == b""
        declared = response.getheader("Content-Length")
        assert response.getheader("Transfer-Encoding") is None
        connection.request("GET", "/token/ready", headers=GUARD)
        response = connection.getresponse()
        body = response.read()
        assert response.status == 200 and json.loads(body)["version"] == 1
        assert declared == str(len(body)), (declared, len(body))
    finally:
        connection.close()


def test_a_long_poll_is_woken_by_a_refresh(broker):
    result = {}

    def poll():
        result["answer"] = broker.request("GET", "/token/ready?after=1&timeout=20", timeout=30)

    waiter = threading.Thread(target=poll)
    waiter.start()
    assert wait_until(lambda: broker.metric("token_broker_longpoll_waiters", provider="default") == 1)
    status, _, body = broker.request("POST", "/token/refresh", body=json.dumps({"rejected_version": 1}))
    waiter.join(30)
    assert status == 200 and json.loads(body)["version"] == 2
    status, headers, body = result["answer"]
    assert status == 200 and json.loads(body)["version"] == 2 and headers["etag"] == '"2"', (status, body)


def test_a_version_from_before_a_restart_is_answered_with_the_new_broker_s_token_at_the_end_of_its_wait():
    """Without a store, a restarted broker numbers its tokens from 1 again, and its local signer
    signs with a key made at start: a client still holding version 3 from before holds a token
    that the JWKS no longer verifies. Its long-poll, `after=3` or `If-None-Match: "3"`, gets the
    new token when its wait ends (200, ETag "1"); it got 304 with ETag "1", a version it never
    had, and kept its dead token (RFC 9110 §13.1.2: 304 only when the current ETag is one the
    client listed). It still waits first, so that a client polling two brokers without a store
    is not answered at once by each in turn. Polling with the new broker's own version gets 304."""
    with Broker() as before:
        for _ in range(2):
            assert before.request("POST", "/token/refresh")[0] == 200
        held = before.get_json("/token")[0]
        assert held["version"] == 3
    with Broker() as restarted:
        keys = {key["kid"] for key in restarted.get_json("/.well-known/jwks.json")[0]["keys"]}
        for path, headers in [("/token/ready?after=3&timeout=2", None),
                              ("/token/ready?timeout=2", {"If-None-Match": '"3"'})]:
            status, answer_headers, body = restarted.request("GET", path, headers=headers, timeout=30)
            assert status == 200, (path, headers, status, answer_headers)
            token = json.loads(body)
            assert token["version"] == 1 and answer_headers["etag"] == '"1"', (path, headers, token)
            assert token["access_token"] != held["access_token"]
            assert jwt.get_unverified_header(token["access_token"])["kid"] in keys
        assert jwt.get_unverified_header(held["access_token"])["kid"] not in keys, "the old key is gone"
        status, answer_headers, _ = restarted.request("GET", "/token/ready?after=1&timeout=1")
        assert status == 304 and answer_headers["etag"] == '"1"'


def test_a_thousand_waiters_are_answered_by_one_refresh_with_one_fetch(broker):
    raise_open_files()
    address = broker.addresses["token"]

    async def scenario():
        async def all_waiting():
            loop = asyncio.get_running_loop()
            ok = await loop.run_in_executor(None, lambda: wait_until(
                lambda: broker.metric("token_broker_longpoll_waiters", provider="default") == 1000, timeout=30))
            assert ok, "the 1000 waiters did not all register"
            status, _, body = await loop.run_in_executor(None, lambda: broker.request("POST", "/token/refresh", body=b'{"rejected_version": 1}'))
            assert status == 200 and json.loads(body)["version"] == 2

        return await raw_requests(address, [get("/token/ready?after=1&timeout=30")] * 1000, all_waiting)

    answers = asyncio.run(scenario())
    assert len(answers) == 1000
    assert {status for status, _ in answers} == {200}
    assert {json.loads(body)["version"] for _, body in answers} == {2}
    assert broker.fetches() == 2, "the start-up fetch and exactly one refresh"
    assert broker.metric("token_broker_refreshes_total", provider="default", result="success") == 2


def test_a_hundred_concurrent_refreshes_of_the_same_version_cause_one_fetch(broker):
    answers = asyncio.run(raw_requests(broker.addresses["token"], [post("/token/refresh", {"rejected_version": 1})] * 100))
    assert {status for status, _ in answers} == {200}
    assert {json.loads(body)["version"] for _, body in answers} == {2}
    assert broker.fetches() == 2
    assert broker.metric("token_broker_excessive_refreshes_total", provider="default") == 0


def test_a_client_that_hangs_up_mid_poll_frees_its_waiter(broker):
    host, _, port = broker.addresses["token"].rpartition(":")
    with socket.create_connection((host, int(port)), timeout=5) as client:
        client.sendall(get("/token/ready?after=1&timeout=30"))
        assert wait_until(lambda: broker.metric("token_broker_longpoll_waiters", provider="default") == 1)
    assert wait_until(lambda: broker.metric("token_broker_longpoll_waiters", provider="default") == 0, timeout=10)
    assert broker.get_json("/token")[0]["version"] == 1, "the broker is unharmed"


def read_answer(client):
    """Reads one HTTP answer with a Content-Length from a keep-alive socket: (status, body)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = client.recv(4096)
        assert chunk, "the broker closed the connection"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")))
    while len(body) < length:
        chunk = client.recv(4096)
        assert chunk, "the broker closed the connection"
        body += chunk
    return int(head.split()[1]), body


def test_hang_ups_are_seen_on_a_kept_alive_connection_that_polls_again_and_on_reused_sockets(broker):
    """An answered poll leaves its socket watched (nothing is undone on the wake-up path): the
    next poll on the same connection must take over that watch, and a new connection that gets
    the closed socket's number must get a watch of its own."""
    host, _, port = broker.addresses["token"].rpartition(":")
    waiters = lambda: broker.metric("token_broker_longpoll_waiters", provider="default")
    keep_alive = lambda path: get(path).replace(b"Connection: close\r\n", b"")
    version = broker.get_json("/token")[0]["version"]
    with socket.create_connection((host, int(port)), timeout=10) as client:
        for _ in range(3):
            client.sendall(keep_alive(f"/token/ready?after={version}&timeout=30"))
            assert wait_until(lambda: waiters() == 1)
            assert broker.request("POST", "/token/refresh", body=json.dumps({"rejected_version": version}).encode())[0] == 200
            status, body = read_answer(client)
            assert status == 200 and json.loads(body)["version"] == version + 1
            version += 1
        client.sendall(keep_alive(f"/token/ready?after={version}&timeout=30"))
        assert wait_until(lambda: waiters() == 1)
    assert wait_until(lambda: waiters() == 0, timeout=10), "the hang-up on the kept-alive connection was missed"
    for _ in range(20):
        with socket.create_connection((host, int(port)), timeout=10) as client:
            client.sendall(keep_alive(f"/token/ready?after={version}&timeout=30"))
            assert wait_until(lambda: waiters() == 1)
        assert wait_until(lambda: waiters() == 0, timeout=10), "a hang-up on a reused socket was missed"
    assert broker.get_json("/token")[0]["version"] == version, "the broker is unharmed"


def test_sigterm_answers_waiting_long_polls_with_503_and_exits_0():
    with Broker() as broker:
        results = []

        def poll():
            results.append(broker.request("GET", "/token/ready?after=1&timeout=30", timeout=30))

        threads = [threading.Thread(target=poll) for _ in range(20)]
        for thread in threads:
            thread.start()
        assert wait_until(lambda: broker.metric("token_broker_longpoll_waiters", provider="default") == 20)
        started = time.monotonic()
        assert broker.stop(signal.SIGTERM, timeout=10) == 0
        for thread in threads:
            thread.join(10)
        assert len(results) == 20
        for status, headers, body in results:
            assert status == 503
            assert json.loads(body)["error"] == "shutting_down"
        assert time.monotonic() - started < 10


# The retrier

def test_refreshing_an_older_version_returns_the_current_token_without_fetching(broker):
    broker.request("POST", "/token/refresh", body=b'{"rejected_version": 1}')
    fetches = broker.fetches()
    status, _, body = broker.request("POST", "/token/refresh", body=b'{"rejected_version": 1}')
    assert status == 200 and json.loads(body)["version"] == 2
    assert broker.fetches() == fetches


def test_forced_refreshes_past_the_window_get_429_with_retry_after(broker):
    statuses = [broker.request("POST", "/token/refresh")[0] for _ in range(5)]
    assert statuses == [200] * 5
    status, headers, body = broker.request("POST", "/token/refresh")
    assert status == 429
    assert json.loads(body)["error"] == "excessive_refresh"
    assert 1 <= int(headers["retry-after"]) <= 30
    assert broker.fetches() == 6
    assert broker.metric("token_broker_excessive_refreshes_total", provider="default") == 1


# Errors

@pytest.mark.parametrize("path,parameter", [
    ("/token/ready?after=abc", "after"), ("/token/ready?after=-1", "after"), ("/token/ready?after=99999999999999999999", "after"),
    ("/token/ready?timeout=-5", "timeout"), ("/token/ready?timeout=1.5", "timeout"), ("/token/ready?after=1&after=2", "after"),
    ("/token/ready?timeout=%ff", "timeout"),
])
def test_bad_parameters_get_400_naming_them(broker, path, parameter):
    status, _, body = broker.request("GET", path)
    assert status == 400
    document = json.loads(body)
    assert document["error"] == "invalid_request" and parameter in document["error_description"]
    assert broker.get_json("/token")[0]["version"] >= 1


@pytest.mark.parametrize("body,needle", [
    (b"not json", "JSON object"), (b"[1]", "JSON object"), (b'{"rejected_version": -1}', "rejected_version"),
    (b'{"rejected_version": "3"}', "rejected_version"), (b'{"rejected": 3}', "unknown key"),
])
def test_bad_refresh_bodies_get_400(broker, body, needle):
    status, _, payload = broker.request("POST", "/token/refresh", body=body)
    assert status == 400 and needle in json.loads(payload)["error_description"]


def test_an_oversized_refresh_body_gets_413(broker):
    status, _, body = broker.request("POST", "/token/refresh", body=b"{" + b" " * 100_000 + b"}")
    assert status == 413 and json.loads(body)["error"] == "payload_too_large"


def test_each_listener_reads_no_more_body_than_its_routes_need(broker):
    """A body arrives before the caller key is checked: the token listener reads 4 KiB at most
    (a refresh body is a few bytes), the admin listener 1 KiB (a reload takes none). Valid JSON
    padded past the cap is refused, not read; one just under it is still taken."""
    def padded(total):
        return b'{"rejected_version": 1' + b" " * (total - 23) + b"}"
    assert len(padded(4096)) == 4096
    status, _, body = broker.request("POST", "/token/refresh", body=padded(4097))
    assert status == 413 and json.loads(body)["error"] == "payload_too_large", body
    status, _, body = broker.request("POST", "/token/refresh?timeout=1", body=padded(4096))
    assert status in (200, 304), body

    status, _, body = broker.request("POST", "/reload", listener="admin", body=b"{" + b" " * 1023 + b"}")
    assert status == 413 and json.loads(body)["error"] == "payload_too_large", body
    status, _, body = broker.request("POST", "/reload", listener="admin", body=b"{}")
    assert status == 200 and json.loads(body)["reloaded"] is True, body


def test_a_body_over_the_cap_that_awaits_continue_gets_413_instead(broker):
    """The head says the body is too large, and the client waits for `100 Continue` before
    sending it: the 413 comes instead, at once, where it came only after a body never sent."""
    host, port = broker.addresses["token"].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as connection:
        connection.sendall(b"POST /token/refresh HTTP/1.1\r\nHost: x\r\nToken-Broker-Request: true\r\n"
                           b"Content-Length: 10000000\r\nExpect: 100-continue\r\n\r\n")
        received = b""
        while b"\r\n\r\n" not in received or not received.rstrip().endswith(b"}"):
            chunk = connection.recv(65536)
            if not chunk:
                break
            received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413 "), received  # not 100 Continue
    assert json.loads(body)["error"] == "payload_too_large"


def test_methods_are_checked_per_route(broker):
    for method, path, allow in [("POST", "/token/ready", "GET, HEAD"), ("GET", "/token/refresh", "POST"), ("DELETE", "/token", "GET, HEAD")]:
        status, headers, body = broker.request(method, path)
        assert status == 405 and headers["allow"] == allow and json.loads(body)["error"] == "method_not_allowed"


def test_no_valid_token_gives_503_with_retry_after_and_the_upstream_error(tmp_path):
    missing = tmp_path / "token"
    config = {"providers": [{"name": "k8s", "source": {"type": "file", "path": str(missing)}, "maxErrorTokenRefreshDelayMsec": 200}]}
    with Broker(config) as broker:
        status, headers, body = broker.request("GET", "/token")
        assert status == 503 and int(headers["retry-after"]) >= 1
        document = json.loads(body)
        assert document["error"] == "token_unavailable" and "unreachable" in document["error_description"]
        status, headers, body = broker.request("GET", "/token/ready?timeout=1")
        assert status == 503 and "last upstream error" in json.loads(body)["error_description"]
        status, _, body = broker.request("GET", "/readyz", listener="admin")
        readiness = json.loads(body)
        assert status == 503 and readiness["ready"] is False
        assert readiness["providers"][0]["last_error"] == "unreachable"
        # The file appears: a waiting long-poll gets the token at the next retry.
        missing.write_text("opaque-token-value\n")
        body, _ = broker.get_json("/providers/k8s/token/ready?timeout=10")
        assert body["access_token"] == "opaque-token-value" and body["provider"] == "k8s"
        assert broker.request("GET", "/readyz", listener="admin")[0] == 200
        assert "opaque-token-value" not in broker.stderr()


# Cookies and metrics

def test_cookie_fields_carry_the_token_with_matching_max_age():
    config = {"providers": [{"setTokenCookie": True, "domainName": "example.test", "tokenCookiePath": "/api"}]}
    with Broker(config) as broker:
        body, _ = broker.get_json("/token")
        assert body["cookie"] == "aws-waf-token=" + body["access_token"]
        attributes = body["set_cookie"].split("; ")
        assert attributes[0] == body["cookie"]
        assert "Domain=example.test" in attributes and "Path=/api" in attributes
        assert f"Max-Age={body['expires_in']}" in attributes
        assert {"Secure", "HttpOnly", "SameSite=Lax"} <= set(attributes)
    with Broker() as broker:
        assert "cookie" not in broker.get_json("/token")[0]


def test_metrics_parse_as_prometheus_text_and_count_what_happened(broker):
    broker.get_json("/token")
    broker.request("GET", "/token", guard=False)
    samples = broker.metrics()
    assert samples[("token_broker_http_requests_total", (("code", "200"), ("listener", "token"), ("route", "/token")))] == 1
    assert samples[("token_broker_http_requests_total", (("code", "403"), ("listener", "token"), ("route", "/token")))] == 1
    assert samples[("token_broker_refreshes_total", (("provider", "default"), ("result", "success")))] == 1
    assert samples[("token_broker_refresh_duration_seconds_count", (("provider", "default"),))] == 1
    assert 0 < samples[("token_broker_token_expiry_seconds", (("provider", "default"),))] <= 900
    assert samples[("token_broker_build_info", (("version", "0.1.0"),))] == 1
    assert samples[("token_broker_provider_state", (("provider", "default"), ("state", "fresh")))] == 1
    status, headers, body = broker.request("GET", "/metrics", listener="admin")
    assert headers["content-type"].startswith("text/plain; version=0.0.4")
    token = broker.get_json("/token")[0]["access_token"]
    assert token.encode() not in body


def test_a_paused_provider_whose_token_expired_points_to_token_ready_and_resumes():
    config = {"providers": [{"source": {"lifetimeSec": 2}, "tokenRefreshDelaySec": 1}]}
    with Broker(config) as broker:
        # Nobody reads: after more than tokenRefreshDelaySec idle the provider pauses, and its token expires.
        def paused_and_expired():
            samples = broker.metrics()
            return (samples[("token_broker_provider_state", (("provider", "default"), ("state", "paused")))] == 1
                    and samples[("token_broker_token_version", (("provider", "default"),))] == 0)

        assert wait_until(paused_and_expired, timeout=20)
        fetches = broker.fetches()
        time.sleep(1.5)
        assert broker.fetches() == fetches, "a paused provider calls nobody"
        status, headers, body = broker.request("GET", "/token")
        assert status == 503
        assert "/token/ready" in json.loads(body)["error_description"]
        answer, _ = broker.get_json("/token/ready?timeout=10")
        assert answer["version"] > 1
