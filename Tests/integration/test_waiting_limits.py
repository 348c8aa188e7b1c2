"""Waiting requests cannot take every connection of the token listener.

A long-poll (and every other request that waits) holds its connection until it is answered, and
the listener never closes such a connection to make room. So that one client cannot keep every
other out, at most seven eighths of `connectionLimit` may wait (14 of 16 here): the next request
that would wait is refused at once (503 `too_many_waiting`), and requests answered at once still
get a connection. With caller keys, one key holds at most half of those places (429
`too_many_waiting_for_key`), so that it cannot take the other keys' places.

Connections are plain sockets, so that each long-poll holds exactly one connection and the test
decides when it goes away.
"""
import http.client
import json
import secrets
import shutil
import socket
import subprocess

import pytest

from broker import Broker
from test_hardening import bearer, write_keys
from test_http_api import wait_until

LONG_POLL = "/token/ready?after=1&timeout=120"


def open_request(broker, path=LONG_POLL, method="GET", headers=None, body=b""):
    """Sends one request on a new connection to the token listener and returns the socket, unread."""
    host, port = broker._split("token")
    connection = socket.create_connection((host, port), timeout=20)
    lines = [f"{method} {path} HTTP/1.1", "Host: x", "Token-Broker-Request: true",
             f"Content-Length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    connection.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
    return connection


def read_answer(connection):
    """The answer on `connection`: (status, headers with lower-case names, body); at most 20 s."""
    response = http.client.HTTPResponse(connection)
    response.begin()
    return response.status, {name.lower(): value for name, value in response.getheaders()}, response.read()


def waiting(broker):
    return broker.metric("token_broker_waiting_requests", listener="token")


def expect_refused(answer, status, code):
    got, headers, body = answer
    assert got == status, answer
    assert json.loads(body)["error"] == code, answer
    assert headers["retry-after"] == "1", answer


def test_a_client_opening_connection_limit_long_polls_does_not_keep_token_out():
    """The flood: as many long-polls as the listener takes connections. Without the cap every
    connection waits, and a new client's /token gets none (it times out, or its connection is
    the one closed to make room); with it, the last two are refused at once (or, not yet read,
    closed to make room for the next), and /token is answered."""
    with Broker({"connectionLimit": 16, "maxWaitSec": 600}) as broker:
        assert broker.get_json("/token")[0]["version"] == 1
        flood = []
        try:
            for count in range(1, 15):
                flood.append(open_request(broker))
                assert wait_until(lambda: broker.metric("token_broker_longpoll_waiters", provider="default") == count)
            flood += [open_request(broker) for _ in range(2)]
            for connection in flood[14:]:
                try:
                    answer = read_answer(connection)
                except ConnectionError:
                    continue  # closed, its head unread, to make room for the next connection
                expect_refused(answer, 503, "too_many_waiting")
            status, _, body = broker.request("GET", "/token", timeout=20)
            assert status == 200 and json.loads(body)["version"] == 1
            assert broker.metric("token_broker_longpoll_waiters", provider="default") == 14
        finally:
            for connection in flood:
                connection.close()


def test_waiting_requests_leave_an_eighth_of_the_connections_to_requests_answered_at_once():
    with Broker({"connectionLimit": 16, "maxWaitSec": 600}) as broker:
        assert broker.get_json("/token")[0]["version"] == 1
        held = [open_request(broker) for _ in range(14)]
        try:
            assert wait_until(lambda: broker.metric("token_broker_longpoll_waiters", provider="default") == 14)

            # (a) A long-poll past the cap is refused at once: 503, its own code, Retry-After.
            for _ in range(2):
                with open_request(broker) as refused:
                    answer = read_answer(refused)
                expect_refused(answer, 503, "too_many_waiting")
                assert "14 places" in json.loads(answer[2])["error_description"]
            # (b) A request answered at once still gets a connection and its token.
            status, _, body = broker.request("GET", "/token", timeout=20)
            assert status == 200 and json.loads(body)["version"] == 1
            assert waiting(broker) == 14
            assert broker.metric("token_broker_waits_refused_total", listener="token", limit="listener") == 2

            # (c) Places come back. Two clients hang up: two long-polls are taken again, each
            # answered at its deadline (304), which gives its place back in turn.
            for connection in held[:2]:
                connection.close()
            held = held[2:]
            assert wait_until(lambda: waiting(broker) == 12)
            for _ in range(2):
                polls = [open_request(broker, "/token/ready?after=1&timeout=1") for _ in range(2)]
                for poll in polls:
                    with poll:
                        status, headers, _ = read_answer(poll)
                    assert status == 304 and headers["etag"] == '"1"'
            assert waiting(broker) == 12
            held += [open_request(broker) for _ in range(2)]
            assert wait_until(lambda: waiting(broker) == 14)
            with open_request(broker) as refused:
                expect_refused(read_answer(refused), 503, "too_many_waiting")

            # An answer gives the place back: one more hang-up makes room for a forced refresh,
            # whose new token answers every waiter; then 14 may wait again, and no more.
            held.pop().close()
            assert wait_until(lambda: waiting(broker) == 13)
            status, _, body = broker.request("POST", "/token/refresh", body=b"{}", timeout=30)
            assert status == 200 and json.loads(body)["version"] == 2, (status, body)
            for connection in held:
                status, _, body = read_answer(connection)
                assert status == 200 and json.loads(body)["version"] == 2
                connection.close()
            assert waiting(broker) == 0
            held = [open_request(broker, "/token/ready?after=2&timeout=120") for _ in range(14)]
            assert wait_until(lambda: waiting(broker) == 14)
            with open_request(broker, "/token/ready?after=2&timeout=120") as refused:
                expect_refused(read_answer(refused), 503, "too_many_waiting")
            assert broker.metric("token_broker_waits_refused_total", listener="token", limit="listener") == 4
            status, _, _ = broker.request("GET", "/token", timeout=20)
            assert status == 200
        finally:
            for connection in held:
                connection.close()


def test_with_caller_keys_one_key_holds_at_most_half_the_waiting_places(tmp_path):
    a, b, c = (secrets.token_urlsafe(32) for _ in range(3))
    keys = tmp_path / "callers.json"
    write_keys(keys, [("a", a, ["default"]), ("b", b, ["default"]), ("c", c, ["default"])])
    config = {"connectionLimit": 16, "maxWaitSec": 600, "clientKeysFile": str(keys)}
    with Broker(config) as broker:
        assert broker.get_json("/token", headers=bearer(a))[0]["version"] == 1
        held = [open_request(broker, headers=bearer(a)) for _ in range(7)]
        try:
            assert wait_until(lambda: broker.metric("token_broker_longpoll_waiters", provider="default") == 7)
            # (d) Key a holds its half: its next long-poll, and its next refresh, are refused at once.
            with open_request(broker, headers=bearer(a)) as refused:
                answer = read_answer(refused)
            expect_refused(answer, 429, "too_many_waiting_for_key")
            assert "7 requests waiting" in json.loads(answer[2])["error_description"]
            with open_request(broker, "/token/refresh", "POST", headers=bearer(a), body=b"{}") as refused:
                expect_refused(read_answer(refused), 429, "too_many_waiting_for_key")
            # Key b's long-polls wait as before, and key a's /token is still answered.
            held += [open_request(broker, headers=bearer(b)) for _ in range(7)]
            assert wait_until(lambda: broker.metric("token_broker_longpoll_waiters", provider="default") == 14)
            assert waiting(broker) == 14
            assert broker.request("GET", "/token", headers=bearer(a), timeout=20)[0] == 200
            # The listener is full now: key c, which holds nothing, is refused by the listener's cap.
            with open_request(broker, headers=bearer(c)) as refused:
                expect_refused(read_answer(refused), 503, "too_many_waiting")
            # One of a's long-polls ends: a may wait again.
            held.pop(0).close()
            assert wait_until(lambda: waiting(broker) == 13)
            held.append(open_request(broker, headers=bearer(a)))
            assert wait_until(lambda: waiting(broker) == 14)
            assert broker.metric("token_broker_waits_refused_total", listener="token", limit="caller_key") == 2
            assert broker.metric("token_broker_waits_refused_total", listener="token", limit="listener") == 1
            assert broker.metric("token_broker_http_requests_total", listener="token", route="/token/ready",
                                 code="429") == 1
        finally:
            for connection in held:
                connection.close()


def test_the_waiting_metrics_are_valid_prometheus_text(broker):
    status, _, body = broker.request("GET", "/metrics", listener="admin")
    assert status == 200
    text = body.decode()
    for line in ("# TYPE token_broker_waiting_requests gauge",
                 'token_broker_waiting_requests{listener="token"} 0',
                 'token_broker_waiting_requests{listener="admin"} 0',
                 "# TYPE token_broker_waits_refused_total counter",
                 'token_broker_waits_refused_total{listener="token",limit="listener"} 0'):
        assert line in text.splitlines(), line
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool is not installed (Debian's `prometheus` package)")
    families = "\n".join(line for line in text.splitlines()
                         if "token_broker_waiting_requests" in line or "token_broker_waits_refused" in line)
    checked = subprocess.run([path, "check", "metrics"], input=families + "\n", capture_output=True, text=True,
                             timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_a_client_that_half_closes_its_long_poll_reads_503_client_closed_beside_kept_alive_connections():
    """README: a client that closes its side (`shutdown(SHUT_WR)`) while its request waits still
    reads the 503 `client_closed`. libmicrohttpd 0.9.75 takes a resumed connection as ready to
    read, and reads the half-close's end (then closes the connection) before it asks for the
    answer, unless the connection is the one its daemon has had idle longest: with another
    kept-alive connection that had finished a /token on the same daemon, the answer was lost.
    Twenty rounds beside four kept connections (so that every daemon of the listener likely has
    one); each must read the 503, and the kept connections stay served."""
    with Broker({"maxWaitSec": 600}) as broker:
        version = broker.get_json("/token")[0]["version"]
        kept = []
        try:
            for _ in range(4):
                connection = open_request(broker, "/token")
                assert read_answer(connection)[0] == 200
                kept.append(connection)
            unanswered = []
            for round_ in range(20):
                with open_request(broker, f"/token/ready?after={version}&timeout=30") as poll:
                    assert wait_until(lambda: broker.metric("token_broker_longpoll_waiters", provider="default") == 1)
                    poll.shutdown(socket.SHUT_WR)
                    try:
                        status, _, body = read_answer(poll)
                    except (ConnectionError, http.client.HTTPException, OSError) as error:
                        unanswered.append(f"round {round_}: {error!r}")
                    else:
                        assert status == 503 and json.loads(body)["error"] == "client_closed", (status, body)
                assert wait_until(lambda: broker.metric("token_broker_longpoll_waiters", provider="default") == 0)
            assert not unanswered, f"{len(unanswered)} of 20 half-closed long-polls read no answer: {unanswered}"
            for connection in kept:
                connection.sendall(b"GET /token HTTP/1.1\r\nHost: x\r\nToken-Broker-Request: true\r\n\r\n")
                assert read_answer(connection)[0] == 200
        finally:
            for connection in kept:
                connection.close()
