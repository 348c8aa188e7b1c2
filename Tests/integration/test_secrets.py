"""Secrets stay secret: a whole scenario, then a search of everything the broker printed and answered.

Client secrets, private keys, the HMAC secret, header secrets and caller keys must appear nowhere:
not in the log, error bodies, metrics, /readyz, or any header. Tokens may appear only in the
successful token answers that exist to carry them.
"""
import base64
import hashlib
import json
import os
import secrets
import subprocess

import pytest

from broker import Broker
from issuers.process import OAuthServer
from test_http_api import wait_until


@pytest.fixture(scope="module", params=["logfmt", "json"])
def scenario(request, tmp_path_factory):
    """The whole scenario, once with each log format."""
    workdir = tmp_path_factory.mktemp("secrets")
    values = {
        "client secret": "cs-" + secrets.token_urlsafe(24),
        "wrong client secret": "wrong-" + secrets.token_urlsafe(24),
        "api key": "ak-" + secrets.token_urlsafe(24),
        "hmac secret": secrets.token_hex(32),
        "caller key": "caller-" + secrets.token_urlsafe(32),
        "other caller key": "caller-" + secrets.token_urlsafe(32),
    }
    private = workdir / "client.pem"
    subprocess.run(["openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(private)],
                   check=True, capture_output=True)
    subprocess.run(["openssl", "pkey", "-in", str(private), "-pubout", "-out", str(workdir / "client.pub.pem")],
                   check=True, capture_output=True)
    # The private key's base64 lines, and its raw scalar as hex and base64url: none may leak.
    pem_lines = [line for line in private.read_text().splitlines() if not line.startswith("-----")]
    der = subprocess.run(["openssl", "pkey", "-in", str(private), "-outform", "DER"], check=True, capture_output=True).stdout
    values.update({f"private key line {index}": line for index, line in enumerate(pem_lines) if len(line) >= 16})
    values["private key (DER base64url)"] = base64.urlsafe_b64encode(der).decode().rstrip("=")[:40]

    issuer = OAuthServer(str(workdir), {"api": values["client secret"]}, lifetime=30,
                         pkjwt_keys=[("pk", str(workdir / "client.pub.pem"))], api_key=values["api key"])
    for name, value in [("client-secret", values["client secret"]), ("wrong-secret", values["wrong client secret"]),
                        ("api-key", values["api key"]), ("hmac", values["hmac secret"])]:
        (workdir / name).write_text(value + "\n")
        (workdir / name).chmod(0o600)
    (workdir / "callers.json").write_text(json.dumps({"keys": [
        {"name": "app", "sha256": hashlib.sha256(values["caller key"].encode()).hexdigest(), "providers": ["*"]},
        {"name": "narrow", "sha256": hashlib.sha256(values["other caller key"].encode()).hexdigest(), "providers": ["signed"]},
    ]}))
    config = {"logFormat": request.param, "clientKeysFile": str(workdir / "callers.json"), "providers": [
        {"name": "oauth", "source": {"type": "oauth2", "tokenURL": issuer.base + "/o/token/", "clientID": "api",
                                     "clientSecretFile": str(workdir / "client-secret"), "scope": "api"}},
        {"name": "wrong", "maxErrorTokenRefreshDelayMsec": 200,
         "source": {"type": "oauth2", "tokenURL": issuer.base + "/o/token/", "clientID": "api",
                    "clientSecretFile": str(workdir / "wrong-secret"), "clientAuth": "client_secret_post"}},
        {"name": "pkjwt", "source": {"type": "oauth2", "tokenURL": issuer.base + "/pkjwt/token", "clientID": "pk",
                                     "clientAuth": "private_key_jwt", "privateKeyFile": str(private)}},
        {"name": "custom", "source": {"type": "http", "url": issuer.base + "/custom/token", "method": "GET",
                                      "headers": {"X-Api-Key": {"file": str(workdir / "api-key")}},
                                      "tokenPointer": "/data/token", "expiresInPointer": "/data/ttl"}},
        {"name": "signed", "source": {"algorithm": "HS256", "keyFile": str(workdir / "hmac")}},
    ]}
    answers, tokens = [], set()
    try:
        with Broker(config) as broker:
            me = {"Authorization": "Bearer " + values["caller key"]}

            def record(method, path, listener="token", headers=None, body=None, guard=True):
                status, response_headers, payload = broker.request(method, path, listener=listener, headers=headers, body=body, guard=guard)
                answers.append((path, status, response_headers, payload))
                return status, payload

            for name in ("oauth", "pkjwt", "custom", "signed"):
                status, payload = record("GET", f"/providers/{name}/token/ready?timeout=10", headers=me)
                assert status == 200, payload
                tokens.add(json.loads(payload)["access_token"])
                status, payload = record("POST", f"/providers/{name}/token/refresh", headers=me,
                                         body=json.dumps({"rejected_version": json.loads(payload)["version"]}).encode())
                assert status == 200, payload
                tokens.add(json.loads(payload)["access_token"])
            assert wait_until(lambda: broker.metric("token_broker_refreshes_total", provider="wrong", result="credentials_rejected") >= 2)
            # Error answers of every kind.
            record("GET", "/providers/wrong/token", headers=me)
            record("GET", "/providers/oauth/token", headers={"Authorization": "Bearer " + values["caller key"][:-1]})
            record("GET", "/providers/oauth/token", headers={"Authorization": "Bearer " + values["other caller key"]})
            record("GET", "/providers/oauth/token")
            record("GET", "/providers/oauth/token", headers=me, guard=False)
            record("GET", "/providers/oauth/token/ready?after=x", headers=me)
            record("POST", "/providers/oauth/token/refresh", headers=me, body=b"{bad")
            record("GET", "/readyz", listener="admin")
            record("GET", "/metrics", listener="admin")
            record("GET", "/healthz", listener="admin")
            record("GET", "/.well-known/jwks.json", guard=False)
            broker.stop()
            log = broker.stderr() + broker.process.stdout.read().decode()
            if request.param == "json":
                lines = broker.stderr().splitlines()
                assert lines and all(json.loads(line)["msg"] for line in lines), "every line is a JSON object"
    finally:
        issuer.close()
    return values, tokens, answers, log


def places(scenario):
    """Every place a secret must never be, by name."""
    values, tokens, answers, log = scenario
    found = [("the log", log)]
    for path, status, headers, payload in answers:
        carries_token = status == 200 and "/token" in path
        found.append((f"headers of {path} ({status})", json.dumps(headers)))
        if not carries_token:
            found.append((f"body of {path} ({status})", payload.decode("utf-8", "replace")))
    return found


def test_no_secret_appears_in_logs_answers_metrics_or_readyz(scenario):
    values, _, answers, log = scenario
    assert "token fetched" in log and "credentials_rejected" in log, "the scenario ran"
    assert any(status == 401 for _, status, _, _ in answers) and any(status == 403 for _, status, _, _ in answers)
    for name, value in values.items():
        for where, text in places(scenario):
            assert value not in text, f"the {name} appears in {where}"
        # Not even in the successful token answers.
        for path, status, _, payload in answers:
            assert value.encode() not in payload, f"the {name} appears in the answer to {path}"


def test_tokens_appear_only_in_the_answers_that_carry_them(scenario):
    _, tokens, _, log = scenario
    assert len(tokens) == 8
    for token in tokens:
        for where, text in places(scenario):
            assert token not in text, f"a token appears in {where}"
        fingerprint = "sha256:" + hashlib.sha256(token.encode()).hexdigest()[:12]
        assert fingerprint in log, "the log names each token by its fingerprint"
