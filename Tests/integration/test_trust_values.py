"""Values a hostile issuer, token file or careless operator may give the broker: numbers that no
integer holds, tokens that would break out of a cookie, token types that would break out of a
header, and lifetimes the broker must neither overstate nor understate.

The broker must stay up (a trapping conversion ends the process with SIGILL), keep its previous
token, and say what was wrong: exit 2 naming the key for configuration, `bad_response` for a
fetched value.
"""
import base64
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from broker import Broker, run_broker
from issuers.faulty import FaultyIssuer
from test_http_api import wait_until


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def jwt_text(payload_json):
    """A compact JWS whose payload is exactly `payload_json`; the file source reads, never verifies."""
    return b64url(b'{"alg":"none","typ":"JWT"}') + "." + b64url(payload_json.encode()) + ".c2lnbmF0dXJl"


def replace_file(path, text):
    """Writes `text` to `path` in one step, as a token agent would (write, then rename)."""
    temporary = f"{path}.new"
    with open(temporary, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(temporary, path)


def readiness(broker):
    return json.loads(broker.request("GET", "/readyz", listener="admin")[2])["providers"][0]


def refresh_and_settle(broker, tokens_before):
    """Forces one refresh and waits until the provider either reports an error or holds a new token."""
    broker.request("POST", "/token/refresh?timeout=2", body=json.dumps({"rejected_version": tokens_before}).encode())

    def settled():
        detail = readiness(broker)
        return detail.get("last_error") is not None or detail.get("version", 0) > tokens_before

    assert wait_until(settled, timeout=15), broker.stderr()


# MARK: - Crashes from numbers


@pytest.mark.parametrize("exp", ["1e16", "-1e300", "-1e19", "1e300"])
def test_a_token_file_whose_exp_no_integer_holds_is_a_bad_response_and_the_broker_keeps_serving(tmp_path, exp):
    path = tmp_path / "token"
    good = jwt_text(json.dumps({"sub": "svc", "exp": int(time.time()) + 600}))
    replace_file(path, good)
    config = {"providers": [{"source": {"type": "file", "path": str(path)}, "maxErrorTokenRefreshDelayMsec": 200}]}
    with Broker(config) as broker:
        first, _ = broker.get_json("/token/ready?timeout=10")
        assert first["access_token"] == good
        replace_file(path, jwt_text('{"sub":"svc","exp":' + exp + "}"))
        refresh_and_settle(broker, first["version"])
        assert broker.process.poll() is None, f"the broker died with {broker.process.returncode}:\n{broker.stderr()}"
        detail = readiness(broker)
        assert detail["last_error"] == "bad_response", detail
        served, _ = broker.get_json("/token")
        assert served["access_token"] == good and served["version"] == first["version"], "the previous token stays"
        assert broker.request("GET", "/healthz", listener="admin")[0] == 200


@pytest.mark.parametrize("value", ["1e19", "99999999999999999999", "1e300", "-1e19"])
def test_retry_on_that_no_integer_holds_exits_2_naming_the_key(tmp_path, value):
    path = tmp_path / "config.json"
    # Written by hand: the point is the number's spelling, which json.dumps would change.
    path.write_text('{"proxies": [{"name": "api", "target": "http://127.0.0.1:9/", "retryOn": [' + value + "]}]}")
    for arguments in (["--check-config", "--config", str(path)], ["--config", str(path)]):
        result = run_broker(*arguments, env={"TOKEN_BROKER_LISTEN": "127.0.0.1:0", "TOKEN_BROKER_ADMIN_LISTEN": "127.0.0.1:0"}, timeout=20)
        assert result.returncode == 2, (arguments, result.returncode, result.stderr)
        assert "proxies[0].retryOn[0]" in result.stderr and "100–599" in result.stderr, result.stderr


# MARK: - Values that reach headers


class Recorder:
    """An upstream on 127.0.0.1 that answers 200 to everything and records the headers it got."""

    def __init__(self):
        self.seen = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                owner.seen.append(self.headers.get_all("Cookie") or [])
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.base = f"http://127.0.0.1:{self.server.server_port}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_a_token_that_is_no_cookie_value_is_never_injected_as_a_cookie(tmp_path):
    path = tmp_path / "token"
    replace_file(path, "tok;admin=1")
    upstream = Recorder()
    config = {"providers": [{"source": {"type": "file", "path": str(path), "lifetimeSec": 600}}],
              "proxies": [{"name": "api", "target": upstream.base, "inject": "cookie"}]}
    try:
        with Broker(config) as broker:
            assert broker.get_json("/token/ready?timeout=10")[0]["access_token"] == "tok;admin=1", "fine as a bearer token"
            status, _, body = broker.request("GET", "/proxy/api/x", headers={"Cookie": "session=1"})
            assert status == 502, (status, body)
            assert json.loads(body)["error"] == "token_not_cookie_safe"
            assert upstream.seen == [], "nothing was forwarded"
            # A cookie-safe token goes in as before.
            replace_file(path, "tok-2")
            refresh_and_settle(broker, 1)
            status, _, body = broker.request("GET", "/proxy/api/x", headers={"Cookie": "session=1"})
            assert status == 200, body
            assert upstream.seen == [["session=1; aws-waf-token=tok-2"]]
    finally:
        upstream.close()


@pytest.mark.parametrize("bad", ["abc;Domain=evil.example;Max-Age=99999999", 'a"b', "a,b", "a\\b"])
def test_with_set_token_cookie_a_token_that_is_no_cookie_value_is_refused_at_fetch(tmp_path, bad):
    path = tmp_path / "token"
    replace_file(path, "good-token")
    config = {"providers": [{"source": {"type": "file", "path": str(path), "lifetimeSec": 600},
                             "setTokenCookie": True, "domainName": "app.example", "maxErrorTokenRefreshDelayMsec": 200}]}
    with Broker(config) as broker:
        first, _ = broker.get_json("/token/ready?timeout=10")
        assert first["set_cookie"].startswith("aws-waf-token=good-token; Domain=app.example; Path=/; Max-Age=")
        replace_file(path, bad)
        refresh_and_settle(broker, first["version"])
        assert readiness(broker)["last_error"] == "bad_response"
        served, _ = broker.get_json("/token")
        assert served["access_token"] == "good-token" and served["version"] == first["version"]
        assert "evil" not in served["set_cookie"] and served["cookie"] == "aws-waf-token=good-token"
        assert bad not in broker.stderr(), "the refused token is not logged"


@pytest.mark.parametrize("contents", ["tok\x01en", "tok\x7fen", "caf\u00e9", "a" * (16 * 1024 + 1)])
def test_the_file_source_gets_the_token_rules_of_the_other_sources(tmp_path, contents):
    path = tmp_path / "token"
    replace_file(path, "good-token")
    config = {"providers": [{"source": {"type": "file", "path": str(path), "lifetimeSec": 600}, "maxErrorTokenRefreshDelayMsec": 200}]}
    with Broker(config) as broker:
        first, _ = broker.get_json("/token/ready?timeout=10")
        replace_file(path, contents)
        refresh_and_settle(broker, first["version"])
        assert readiness(broker)["last_error"] == "bad_response"
        assert broker.get_json("/token")[0]["access_token"] == "good-token"


def test_a_token_file_that_claims_a_hundred_years_is_refused(tmp_path):
    path = tmp_path / "token"
    replace_file(path, jwt_text(json.dumps({"exp": int(time.time()) + 100 * 365 * 86400})))
    config = {"providers": [{"source": {"type": "file", "path": str(path)}, "maxErrorTokenRefreshDelayMsec": 200}]}
    with Broker(config) as broker:
        status, _, body = broker.request("GET", "/token/ready?timeout=2")
        assert status == 503, body
        assert wait_until(lambda: readiness(broker).get("last_error") == "bad_response", timeout=15)
        assert "more than a year" in readiness(broker)["last_error_description"]


def issuer_answering(body):
    """A fake issuer that answers `good-1` first, then `body` to every later request."""
    issuer = FaultyIssuer()
    answers = {"count": 0}

    def answer(handler):
        answers["count"] += 1
        if answers["count"] == 1:
            issuer.send(handler, 200, {"access_token": "good-1", "token_type": "bearer", "expires_in": 300})
        else:
            issuer.send(handler, 200, body)

    issuer.answer = answer
    return issuer


def oauth2_broker(issuer):
    source = {"type": "oauth2", "tokenURL": issuer.url, "clientID": "c", "clientSecret": "s", "timeoutMsec": 2000}
    return Broker({"providers": [{"source": source, "maxErrorTokenRefreshDelayMsec": 200}]})


@pytest.mark.parametrize("token_type", ["Bearer\r\nX-Injected: 1", "Bearer\u0000", "B" + "\u0301" * 2000, "Bearer x"])
def test_a_token_type_that_is_no_rfc6749_name_is_a_bad_response(token_type):
    issuer = issuer_answering({"access_token": "bad-2", "token_type": token_type, "expires_in": 300})
    try:
        with oauth2_broker(issuer) as broker:
            first, _ = broker.get_json("/token/ready?timeout=10")
            assert first["access_token"] == "good-1" and first["token_type"] == "Bearer"
            refresh_and_settle(broker, first["version"])
            assert readiness(broker)["last_error"] == "bad_response"
            served, _ = broker.get_json("/token")
            assert served["access_token"] == "good-1" and served["token_type"] == "Bearer"
    finally:
        issuer.close()


def test_token_types_are_served_normalised():
    issuer = issuer_answering({"access_token": "dpop-2", "token_type": "DPOP", "expires_in": 300})
    try:
        with oauth2_broker(issuer) as broker:
            first, _ = broker.get_json("/token/ready?timeout=10")
            assert first["token_type"] == "Bearer", "bearer is served as Bearer"
            refresh_and_settle(broker, first["version"])
            served, _ = broker.get_json("/token")
            assert served["access_token"] == "dpop-2" and served["token_type"] == "DPoP", served
    finally:
        issuer.close()


@pytest.mark.parametrize("expires_in", ["0x1p4", "+300", "3e2", "300.0", 300.5])
def test_expires_in_that_is_not_digits_is_a_bad_response(expires_in):
    issuer = issuer_answering({"access_token": "bad-2", "token_type": "Bearer", "expires_in": expires_in})
    try:
        with oauth2_broker(issuer) as broker:
            first, _ = broker.get_json("/token/ready?timeout=10")
            refresh_and_settle(broker, first["version"])
            assert readiness(broker)["last_error"] == "bad_response"
            assert broker.get_json("/token")[0]["access_token"] == "good-1"
    finally:
        issuer.close()


def test_expires_in_as_a_string_of_digits_is_accepted():
    issuer = issuer_answering({"access_token": "good-2", "token_type": "Bearer", "expires_in": "300"})
    try:
        with oauth2_broker(issuer) as broker:
            first, _ = broker.get_json("/token/ready?timeout=10")
            refresh_and_settle(broker, first["version"])
            served, _ = broker.get_json("/token")
            assert served["access_token"] == "good-2" and 299 <= served["expires_in"] <= 300
    finally:
        issuer.close()


def test_a_token_in_its_last_second_never_reads_expires_in_0(tmp_path):
    """Polls one short-lived token until it is gone: every answer that serves it says at least 1 s."""
    path = tmp_path / "token"
    token = jwt_text(json.dumps({"exp": int(time.time()) + 3}))
    replace_file(path, token)
    config = {"providers": [{"source": {"type": "file", "path": str(path)}, "setTokenCookie": True,
                             "maxErrorTokenRefreshDelayMsec": 200}]}
    with Broker(config) as broker:
        assert broker.get_json("/token/ready?timeout=10")[0]["access_token"] == token
        seen = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            status, _, body = broker.request("GET", "/token")
            if status != 200:
                break
            answer = json.loads(body)
            seen.append((answer["expires_in"], answer["set_cookie"]))
            time.sleep(0.01)
        assert seen, "the token was served"
        assert status == 503, "the token expired within the bound"
        assert all(expires_in >= 1 for expires_in, _ in seen), sorted({e for e, _ in seen})
        assert all("Max-Age=0;" not in cookie for _, cookie in seen)
        assert seen[-1][0] == 1, "the last answers say 1 s"
