"""Proxy mode with caller keys: a proxied request is checked as it arrives, and again before it
goes upstream after a wait (for its first token, for the refresh after a refused answer), as a
token route's waited request is when answered: the keys file may have been re-read meanwhile.

The issuer holds its answer until the test has removed a key and the broker has read the file
again (a probe with the removed key on another provider's /token gets 401); the upstream counts
what reaches it.
"""
import json
import secrets
import threading

import pytest

from broker import Broker
from issuers.faulty import FaultyIssuer
from test_hardening import bearer, write_keys
from test_http_api import wait_until
from test_proxy_answer_framing import ScriptedUpstream

CLIENT_TIMEOUT = 90


class HeldIssuer(FaultyIssuer):
    """An issuer whose token answers, from the `held`th on, wait for `release` (at most 60 s)."""

    def __init__(self, held=1):
        super().__init__()
        self.held = held
        self.release = threading.Event()
        self.lock = threading.Lock()

    def answer(self, handler):
        with self.lock:
            self.served += 1
            number = self.served
        if number >= self.held:
            self.release.wait(60)
        self.send(handler, 200, {"access_token": f"good-{number}", "token_type": "bearer", "expires_in": 300})


def scripted_upstream(refuse_first=False):
    """An upstream that answers 200 `ok`; with `refuse_first`, 401 the first time it sees a path."""
    seen = set()

    def answer(method, target):
        if refuse_first and target not in seen:
            seen.add(target)
            return (b'HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Bearer error="invalid_token"\r\n'
                    b"Content-Length: 7\r\n\r\nrefused")
        return b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"

    return ScriptedUpstream(answer)


def config(issuer, upstream, keys, background=True):
    source = {"type": "oauth2", "tokenURL": issuer.url, "clientID": "c", "clientSecret": "s", "timeoutMsec": 60000}
    return {"maxWaitSec": 120, "clientKeysFile": str(keys),
            "providers": [{"name": "default"}, {"name": "p", "source": source, "backgroundRefreshEnabled": background}],
            "proxies": [{"name": "api", "target": f"http://{upstream.address}/api", "provider": "p",
                         "timeoutMsec": 120000}]}


def start(broker, key, path):
    """A proxied GET in a thread; its answer lands in the returned list."""
    answers = []
    thread = threading.Thread(target=lambda: answers.append(
        broker.request("GET", path, headers=bearer(key), timeout=CLIENT_TIMEOUT)))
    thread.start()
    return thread, answers


def three_callers(tmp_path):
    """A keys file naming three callers, `removed` and `narrowed` allowed p, `kept` only p; and their keys."""
    callers = {name: secrets.token_urlsafe(32) for name in ("removed", "narrowed", "kept")}
    keys = tmp_path / "callers.json"
    write_keys(keys, [("removed", callers["removed"], ["default", "p"]),
                      ("narrowed", callers["narrowed"], ["default", "p"]), ("kept", callers["kept"], ["p"])])
    return keys, callers


def send_all(broker, callers):
    """Each caller's proxied GET of /proxy/api/{name}, in threads of their own."""
    return {name: start(broker, key, f"/proxy/api/{name}") for name, key in callers.items()}


def answers_after_the_keys_change(broker, keys, callers, issuer, waiting):
    """Writes the new list (`removed` gone, `narrowed` without p), waits until the broker reads it,
    lets the issuer answer, and checks what each waiting caller then got."""
    write_keys(keys, [("narrowed", callers["narrowed"], ["default"]), ("kept", callers["kept"], ["p"])])
    assert wait_until(lambda: broker.request("GET", "/token", headers=bearer(callers["removed"]))[0] == 401,
                      timeout=15), "the broker did not read the new keys file"
    issuer.release.set()
    for thread, _ in waiting.values():
        thread.join(CLIENT_TIMEOUT + 5)
    assert all(answers for _, answers in waiting.values()), "no answer"
    check_refusals({name: answers[0] for name, (_, answers) in waiting.items()})


def check_refusals(answers):
    status, headers, body = answers["removed"]
    assert status == 401 and json.loads(body)["error"] == "invalid_caller_key", (status, body)
    assert 'error="invalid_token"' in headers["www-authenticate"], headers
    status, _, body = answers["narrowed"]
    assert status == 403 and json.loads(body)["error"] == "provider_not_allowed", (status, body)
    assert '"narrowed"' in json.loads(body)["error_description"], body
    status, _, body = answers["kept"]
    assert (status, body) == (200, b"ok"), (status, body)


@pytest.mark.parametrize("background", [True, False], ids=["background_refresh", "on_demand"])
def test_a_caller_removed_while_its_proxied_request_waits_for_a_first_token_is_refused_and_nothing_goes_upstream(
        tmp_path, background):
    """The proxied request was checked only as it arrived: a caller whose key was removed while it
    waited for the provider's first token still had its request sent upstream with that token
    (200 from the target), and one whose list lost the provider too."""
    issuer, upstream = HeldIssuer(), scripted_upstream()
    keys, callers = three_callers(tmp_path)
    try:
        with Broker(config(issuer, upstream, keys, background)) as broker:
            waiting = send_all(broker, callers)
            assert wait_until(lambda: broker.metric("token_broker_longpoll_waiters", provider="p") == 3, timeout=15)
            answers_after_the_keys_change(broker, keys, callers, issuer, waiting)
            assert [target for _, target in upstream.seen] == ["/api/kept"], "a refused caller's request went upstream"
            # Counted as the proxy's answers, and among the token listener's, as a token route's refusal is.
            for code in ("401", "403"):
                assert broker.metric("token_broker_http_requests_total", listener="token", route="/proxy/{name}",
                                     code=code) == 1, code
                assert broker.metric("token_broker_proxy_requests_total", proxy="api", code=code) == 1, code
    finally:
        issuer.release.set()
        issuer.close()
        upstream.close()


def test_a_caller_removed_while_the_retrier_refreshes_gets_no_retry(tmp_path):
    """The target refused the first token (401), the broker forced a refresh and, while it waited
    for the new token, the caller's key was removed: the request was sent again with the new token
    all the same. Now the caller gets the broker's 401 (or 403) and the target sees no retry."""
    issuer, upstream = HeldIssuer(held=2), scripted_upstream(refuse_first=True)
    keys, callers = three_callers(tmp_path)
    try:
        with Broker(config(issuer, upstream, keys)) as broker:
            assert wait_until(
                lambda: broker.request("GET", "/providers/p/token", headers=bearer(callers["kept"]))[0] == 200,
                timeout=15)
            waiting = send_all(broker, callers)
            # Each was refused once by the target; the one forced refresh they share is held.
            assert wait_until(lambda: len(upstream.seen) == 3 and issuer.requests == 2, timeout=15), \
                (upstream.seen, issuer.requests)
            answers_after_the_keys_change(broker, keys, callers, issuer, waiting)
            assert sorted(target for _, target in upstream.seen) == \
                ["/api/kept", "/api/kept", "/api/narrowed", "/api/removed"], upstream.seen
            assert broker.metric("token_broker_proxy_retries_total", proxy="api") == 1
    finally:
        issuer.release.set()
        issuer.close()
        upstream.close()
