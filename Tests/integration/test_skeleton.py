"""The first slice end to end: the real binary, real HTTP on loopback, real signals."""
import json
import os
import signal
import socket
import time

import jwt
import pytest

from broker import GUARD, Broker, run_broker


def verify_with_jwks(broker, token, audience="token-broker", algorithms=("ES256", "RS256")):
    """Verifies a served JWT against the served JWKS with PyJWT, independently of the broker's code."""
    client = jwt.PyJWKClient(broker.url("/.well-known/jwks.json"), cache_keys=False)
    key = client.get_signing_key_from_jwt(token)
    return jwt.decode(token, key.key, algorithms=list(algorithms), audience=audience, issuer="token-broker")


def test_the_embedded_default_serves_an_es256_jwt_that_verifies_against_its_jwks(broker):
    body, headers = broker.get_json("/token")
    assert body["token_type"] == "Bearer"
    assert body["provider"] == "default"
    assert body["version"] == 1
    assert body["stale"] is False
    assert jwt.get_unverified_header(body["access_token"])["alg"] == "ES256"
    claims = verify_with_jwks(broker, body["access_token"])
    assert claims["exp"] - claims["iat"] == 900
    assert 880 <= body["expires_in"] <= 900
    assert body["expires_at"] == time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(claims["exp"]))
    assert body["issued_at"] == time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(claims["iat"]))
    assert headers["etag"] == '"1"'
    assert headers["cache-control"] == "no-store"
    assert headers["content-type"] == "application/json"


def test_a_tampered_token_does_not_verify(broker):
    body, _ = broker.get_json("/token")
    header, payload, signature = body["access_token"].split(".")
    forged = jwt.utils.base64url_encode(json.dumps({"iss": "token-broker", "aud": "token-broker", "exp": 4102444800}).encode())
    with pytest.raises(jwt.InvalidSignatureError):
        verify_with_jwks(broker, f"{header}.{forged.decode()}.{signature}")


@pytest.mark.parametrize("algorithm,kind", [("ES256", "ec"), ("RS256", "rsa")])
def test_a_configured_key_file_signs_and_its_public_half_is_published(tmp_key, algorithm, kind):
    key = tmp_key(kind)
    config = {"providers": [{"name": "api", "source": {"type": "jwt", "algorithm": algorithm, "keyFile": key, "audience": "api", "lifetimeSec": 120}}]}
    with Broker(config) as broker:
        body, _ = broker.get_json("/providers/api/token")
        claims = verify_with_jwks(broker, body["access_token"], audience="api")
        assert claims["exp"] - claims["iat"] == 120
        # The same key, read by PyJWT from the file, verifies it too.
        with open(key, "rb") as handle:
            private = jwt.algorithms.get_default_algorithms()[algorithm].prepare_key(handle.read())
        jwt.decode(body["access_token"], private.public_key(), algorithms=[algorithm], audience="api")
        assert broker.get_json("/token")[0]["provider"] == "api", "the first provider answers /token"


def test_hs256_tokens_verify_with_the_shared_secret_and_the_secret_is_not_published(tmp_path):
    secret = os.urandom(32).hex()
    (tmp_path / "secret").write_text(secret + "\n")
    config = {"providers": [{"source": {"algorithm": "HS256", "keyFile": str(tmp_path / "secret")}}]}
    with Broker(config) as broker:
        body, _ = broker.get_json("/token")
        jwt.decode(body["access_token"], secret, algorithms=["HS256"], audience="token-broker")
        assert broker.get_json("/.well-known/jwks.json")[0] == {"keys": []}
        assert secret not in broker.stderr()


def test_the_version_grows_with_every_new_token_and_the_body_follows_it():
    config = {"providers": [{"source": {"lifetimeSec": 2}, "tokenRefreshDelaySec": 1}]}
    with Broker(config) as broker:
        first, headers = broker.get_json("/token")
        deadline = time.monotonic() + 15
        latest = first
        while latest["version"] < first["version"] + 2 and time.monotonic() < deadline:
            time.sleep(0.2)
            latest, headers = broker.get_json("/token")
        assert latest["version"] >= first["version"] + 2
        assert latest["access_token"] != first["access_token"]
        assert headers["etag"] == f'"{latest["version"]}"'
        verify_with_jwks(broker, latest["access_token"])


def test_without_background_refresh_every_request_gets_a_new_token():
    with Broker({"providers": [{"backgroundRefreshEnabled": False}]}) as broker:
        tokens = [broker.get_json("/token")[0] for _ in range(3)]
        assert [t["version"] for t in tokens] == [1, 2, 3]
        assert len({t["access_token"] for t in tokens}) == 3


def test_errors_are_json_with_the_right_status(broker):
    status, headers, body = broker.request("POST", "/token")
    assert status == 405
    assert headers["allow"] == "GET, HEAD"
    assert json.loads(body)["error"] == "method_not_allowed"
    for path, code in [("/nope", "not_found"), ("/providers/ghost/token", "unknown_provider"), ("/providers/default/nope", "not_found")]:
        status, headers, body = broker.request("GET", path)
        assert status == 404, path
        assert headers["content-type"] == "application/json"
        document = json.loads(body)
        assert document["error"] == code and document["error_description"]
    status, _, body = broker.request("GET", "/healthz", listener="admin")
    assert status == 200 and json.loads(body) == {"status": "ok"}
    status, _, body = broker.request("GET", "/token", listener="admin")
    assert status == 404, "tokens are never served on the admin listener"
    status, _, body = broker.request("HEAD", "/token")
    assert status == 200 and body == b""


def test_keep_alive_serves_many_requests_on_one_connection(broker):
    connection = broker.connection()
    try:
        for _ in range(5):
            connection.request("GET", "/token", headers=GUARD)
            response = connection.getresponse()
            assert response.status == 200
            response.read()
        assert response.getheader("connection", "").lower() != "close"
    finally:
        connection.close()


def test_the_ipv6_loopback_listener_works():
    with Broker(listen="[::1]:0") as broker:
        assert broker.addresses["token"].startswith("[::1]:")
        assert broker.get_json("/token")[0]["version"] == 1


def test_sigterm_and_sigint_stop_the_broker_cleanly():
    for sig in (signal.SIGTERM, signal.SIGINT):
        with Broker() as broker:
            broker.get_json("/token")
            assert broker.stop(sig) == 0
            assert "msg=stopped" in broker.stderr()


def test_a_busy_address_is_refused_with_the_address_and_the_reason():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = "127.0.0.1:%d" % taken.getsockname()[1]
        result = run_broker(env={"TOKEN_BROKER_LISTEN": address, "TOKEN_BROKER_ADMIN_LISTEN": "127.0.0.1:0"})
    assert result.returncode == 1
    assert f"cannot listen on {address}: Address already in use" in result.stderr


def test_check_config_accepts_a_valid_file_and_names_the_bad_key_otherwise(tmp_path):
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"providers": [{"name": "a", "maxRetryCount": 2}]}))
    result = run_broker("--check-config", "--config", str(good))
    assert result.returncode == 0, result.stderr
    assert "configuration OK" in result.stdout

    for document, expected in [
        ({"providers": [{"maxRetryCount": 11}]}, "providers[0].maxRetryCount: 11 is out of range; allowed: 0–10"),
        ({"providers": [{"name": "a", "colour": "red"}]}, "providers[0].colour: unknown key; allowed: name, source"),
        ({"providers": [{"source": {"algorithm": "PS256"}}]}, "allowed: ES256, RS256, HS256"),
        ({"providers": [{"name": "x"}, {"name": "x"}]}, 'duplicate provider name \\"x\\"'),
    ]:
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps(document))
        result = run_broker("--check-config", "--config", str(bad))
        assert result.returncode == 2, document
        assert expected in result.stderr, result.stderr
    missing_key = tmp_path / "missing.json"
    missing_key.write_text(json.dumps({"providers": [{"source": {"keyFile": str(tmp_path / "nope.pem")}}]}))
    result = run_broker("--check-config", "--config", str(missing_key))
    assert result.returncode == 2 and "nope.pem" in result.stderr


def test_the_environment_names_the_file_and_overrides_its_listeners(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"listen": "127.0.0.1:1", "adminListen": "127.0.0.1:2", "providers": [{"name": "from-env"}]}))
    with Broker(env={"TOKEN_BROKER_CONFIG": str(path)}, fetching=["from-env"]) as broker:
        assert broker.get_json("/token")[0]["provider"] == "from-env"
    result = run_broker("--check-config", env={"TOKEN_BROKER_CONFIG": str(path), "TOKEN_BROKER_LISTEN": "nowhere"})
    assert result.returncode == 2 and "TOKEN_BROKER_LISTEN" in result.stderr


def test_help_version_and_bad_arguments():
    assert run_broker("--help").returncode == 0
    version = run_broker("--version")
    assert version.returncode == 0 and version.stdout.startswith("token-broker ")
    bad = run_broker("--frobnicate")
    assert bad.returncode == 2 and "--frobnicate" in bad.stderr


def test_the_healthcheck_command_asks_the_admin_listener(broker):
    assert run_broker("healthcheck", broker.url("/healthz", "admin")).returncode == 0
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    assert run_broker("healthcheck", f"http://127.0.0.1:{port}/healthz").returncode == 1
    assert run_broker("healthcheck", env={"TOKEN_BROKER_ADMIN_LISTEN": broker.addresses["admin"]}).returncode == 0


def test_tokens_never_appear_in_the_log_only_their_fingerprints(broker):
    tokens = [broker.get_json("/token")[0]["access_token"]]
    log = broker.stderr()
    assert "token=sha256:" in log
    for token in tokens:
        for part in token.split("."):
            assert part not in log
