"""Proxy mode while its provider has no token: how long a proxied request waits for one, and the
503 `token_unavailable` it gets when none comes, which says what `/token`'s says.

The issuer answers 503 with `Retry-After: 120` (FaultyIssuer's status_503), so no token comes
for two minutes. A proxied request waits at most the shorter of `maxWaitSec` and what is left of
the proxy's `timeoutMsec`, with or without background refresh. Each request has a client timeout
well under the old behaviour's wait, so that a broker that waits on fails the test, not hangs it.
"""
import json
import signal
import socket
import threading
import time

import pytest

from broker import GUARD, Broker
from issuers.faulty import FaultyIssuer
from test_http_api import wait_until

# How long a request may take before the test calls it a wait that was not bounded: the bound
# here is 2 s, the old wait for an on-demand provider was the fetch's retries (over 100 s with
# the issuer's Retry-After of 120 s), and for a provider with background refresh `maxWaitSec`.
CLIENT_TIMEOUT = 30


def config(issuer, background, max_wait_sec, timeout_msec):
    source = {"type": "oauth2", "tokenURL": issuer.url, "clientID": "c", "clientSecret": "s"}
    return {"maxWaitSec": max_wait_sec,
            "providers": [{"name": "p", "source": source, "backgroundRefreshEnabled": background}],
            # Never reached: no token comes, so nothing is forwarded.
            "proxies": [{"name": "api", "target": issuer.url.rsplit("/", 1)[0] + "/api", "provider": "p",
                         "timeoutMsec": timeout_msec}]}


def timed(broker, path):
    """(status, headers, body, seconds) of one GET; fails, rather than hangs, past CLIENT_TIMEOUT."""
    started = time.monotonic()
    try:
        status, headers, body = broker.request("GET", path, timeout=CLIENT_TIMEOUT)
    except (socket.timeout, TimeoutError):
        pytest.fail(f"GET {path} had no answer within {CLIENT_TIMEOUT} s")
    return status, headers, body, time.monotonic() - started


def last_error(description):
    return description.partition("; last upstream error: ")[2]


@pytest.mark.parametrize("background", [False, True], ids=["on_demand", "background_refresh"])
@pytest.mark.parametrize("max_wait_sec,timeout_msec", [(2, 60000), (60, 2000)], ids=["maxWaitSec", "timeoutMsec"])
def test_a_proxied_request_without_a_token_gets_the_token_routes_503_within_its_wait(background, max_wait_sec,
                                                                                    timeout_msec):
    """Without background refresh the proxy waited through the on-demand fetch's retries (156 s
    with this issuer, whatever maxWaitSec and timeoutMsec said); with it, maxWaitSec whatever
    timeoutMsec said. Its 503 said `Retry-After: 1` and not the issuer's error, where every 503
    token_unavailable says what is left of the issuer's Retry-After and the last upstream error."""
    issuer = FaultyIssuer()
    issuer.mode = "status_503"
    try:
        with Broker(config(issuer, background, max_wait_sec, timeout_msec)) as broker:
            status, headers, body, _ = timed(broker, "/proxy/api/x")
            assert status == 503, body
            document = json.loads(body)
            assert document["error"] == "token_unavailable", document
            assert 60 <= int(headers["retry-after"]) <= 120, headers
            assert document["error_description"].startswith('proxy "api" has no token from provider "p"'), document
            assert last_error(document["error_description"]), document
            # The token route says the same, from the same provider state.
            token_status, token_headers, token_body = broker.request("GET", "/providers/p/token",
                                                                     timeout=CLIENT_TIMEOUT)
            assert token_status == 503, token_body
            assert abs(int(token_headers["retry-after"]) - int(headers["retry-after"])) <= 2, (token_headers, headers)
            assert last_error(json.loads(token_body)["error_description"]) == last_error(document["error_description"])
            # Inside the issuer's Retry-After no fetch is made: a later request waits no longer.
            status, headers, body, _ = timed(broker, "/proxy/api/x")
            assert status == 503 and 60 <= int(headers["retry-after"]) <= 120, (status, headers, body)
            assert broker.metric("token_broker_proxy_requests_total", proxy="api", code="503") == 2
            assert issuer.requests == 1, "the issuer's Retry-After holds fetches off"
    finally:
        issuer.close()


@pytest.mark.parametrize("background", [False, True], ids=["on_demand", "background_refresh"])
def test_a_client_that_hangs_up_while_its_proxied_request_waits_for_a_token_stops_waiting(background):
    """The wait went on after the client had gone, to its end (60 s here; on demand, before the
    wait was bounded, through the fetch's retries), counted in token_broker_longpoll_waiters all
    along: nothing cancelled the task that waited. The bound alone does not fix it. (The issuer's
    Retry-After is 5 s here: one past the wait's end answers an on-demand request at once.)"""
    issuer = FaultyIssuer()
    issuer.mode, issuer.retry_after = "status_503", "5"
    try:
        with Broker(config(issuer, background, 60, 60000)) as broker:
            def waiters():
                return broker.metric("token_broker_longpoll_waiters", provider="p")

            host, port = broker.addresses["token"].rsplit(":", 1)
            client = socket.create_connection((host, int(port)), timeout=10)
            try:
                guard = "".join(f"{name}: {value}\r\n" for name, value in GUARD.items())
                client.sendall(f"GET /proxy/api/x HTTP/1.1\r\nHost: b\r\n{guard}\r\n".encode())
                assert wait_until(lambda: waiters() == 1, timeout=15), waiters()
            finally:
                client.close()
            assert wait_until(lambda: waiters() == 0, timeout=15), \
                "a client that hung up is still counted as waiting for a token"
    finally:
        issuer.close()


@pytest.mark.parametrize("background", [False, True], ids=["on_demand", "background_refresh"])
def test_a_proxied_request_waiting_for_a_token_when_the_broker_stops_gets_shutting_down(background):
    """README (Signals, step 2): "proxied requests still waiting for their first token, are
    answered at once with 503 shutting_down". On demand the proxy answered token_unavailable.
    (The issuer's Retry-After is 5 s here: one past the wait's end answers an on-demand request
    at once, and there would be nobody waiting.)"""
    issuer = FaultyIssuer()
    issuer.mode, issuer.retry_after = "status_503", "5"
    try:
        with Broker(config(issuer, background, 60, 60000)) as broker:
            answers = []
            waiting = threading.Thread(target=lambda: answers.append(timed(broker, "/proxy/api/x")))
            waiting.start()
            assert wait_until(lambda: broker.metric("token_broker_longpoll_waiters", provider="p") == 1, timeout=15)
            broker.process.send_signal(signal.SIGTERM)
            waiting.join(CLIENT_TIMEOUT + 5)
            assert answers, "no answer"
            status, headers, body, _ = answers[0]
            assert status == 503 and json.loads(body)["error"] == "shutting_down", (status, body)
            assert headers["retry-after"] == "1", headers
            assert broker.process.wait(timeout=15) == 0
    finally:
        issuer.close()
