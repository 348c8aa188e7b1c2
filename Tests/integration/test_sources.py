"""Upstream sources against a real OAuth 2.0 server (django-oauth-toolkit) and a broken issuer."""
import base64
import hashlib
import hmac
import json
import os
import subprocess
import time
import urllib.parse

import jwt
import pytest

from broker import BINARY, Broker
from issuers.faulty import FaultyIssuer
from issuers.process import OAuthServer
from issuers.raw import RawIssuer
from test_http_api import wait_until

SECRET = "s3cret-value-for-tests"


@pytest.fixture(scope="module")
def oauth(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("oauth")
    keys = []
    for kind, options in [("rsa", ["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"]), ("ec", ["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"])]:
        private, public = workdir / f"{kind}.pem", workdir / f"{kind}.pub.pem"
        subprocess.run(["openssl", "genpkey", *options, "-out", str(private)], check=True, capture_output=True)
        subprocess.run(["openssl", "pkey", "-in", str(private), "-pubout", "-out", str(public)], check=True, capture_output=True)
        keys.append((f"pk-{kind}", str(public)))
    server = OAuthServer(str(workdir), {"api": SECRET, "post": SECRET, "rotating": SECRET}, lifetime=4, pkjwt_keys=keys, api_key="k3y")
    server.private_keys = {"pk-rsa": str(workdir / "rsa.pem"), "pk-ec": str(workdir / "ec.pem")}
    yield server
    server.close()


def oauth_provider(server, client_id="api", auth="client_secret_basic", **extra):
    source = {"type": "oauth2", "tokenURL": server.base + "/o/token/", "clientID": client_id, "clientAuth": auth, "scope": "api", **extra}
    if auth != "private_key_jwt" and "clientSecretFile" not in extra:
        source["clientSecret"] = SECRET
    return {"name": client_id, "source": source, "maxErrorTokenRefreshDelayMsec": 500}


def test_tokens_flow_from_the_real_server_and_open_its_protected_resource(oauth):
    with Broker({"providers": [oauth_provider(oauth)]}) as broker:
        body, _ = broker.get_json("/token/ready?timeout=10")
        assert body["token_type"] == "Bearer" and body["scope"] == "api"
        assert 0 < body["expires_in"] <= 4
        assert oauth.get("/api/hello", body["access_token"]) == 200
        assert oauth.get("/api/hello", "forged") in (401, 403)
        assert SECRET not in broker.stderr() and body["access_token"] not in broker.stderr()
        assert broker.metric("token_broker_upstream_responses_total", provider="api", code="200") >= 1


def test_background_refresh_renews_tokens_before_they_expire(oauth):
    with Broker({"providers": [oauth_provider(oauth)]}) as broker:
        first, _ = broker.get_json("/token/ready?timeout=10")
        before = oauth.requests("oauth2", 200)
        seen = {first["access_token"]}
        deadline = time.monotonic() + 12
        while time.monotonic() < deadline:
            body, _ = broker.get_json("/token")
            assert body["expires_in"] >= 0 and body["stale"] is False
            seen.add(body["access_token"])
            time.sleep(0.25)
        # A 4 s token is renewed at 75–85 % of its life: about every 3.2 s, so 3 or 4 times in 12 s.
        renewals = oauth.requests("oauth2", 200) - before
        assert 3 <= renewals <= 5, renewals
        assert len(seen) >= 4


def test_client_secret_post_works(oauth):
    with Broker({"providers": [oauth_provider(oauth, "post", "client_secret_post")]}) as broker:
        body, _ = broker.get_json("/providers/post/token/ready?timeout=10")
        assert oauth.get("/api/hello", body["access_token"]) == 200


def test_a_wrong_secret_is_a_classified_credentials_error_shown_by_readyz(oauth, tmp_path):
    secret_file = tmp_path / "secret"
    secret_file.write_text("wrong-secret\n")
    provider = oauth_provider(oauth, "rotating", clientSecretFile=str(secret_file))
    with Broker({"providers": [provider]}) as broker:
        assert wait_until(lambda: broker.request("GET", "/readyz", listener="admin")[0] == 503
                          and "credentials_rejected" in broker.request("GET", "/readyz", listener="admin")[2].decode())
        status, _, body = broker.request("GET", "/readyz", listener="admin")
        detail = json.loads(body)["providers"][0]
        assert detail["last_error"] == "credentials_rejected" and "invalid_client" in detail["last_error_description"]
        status, _, body = broker.request("GET", "/token")
        assert status == 503 and "credentials_rejected" in json.loads(body)["error_description"]
        assert "wrong-secret" not in broker.stderr() + body.decode()
        assert broker.metric("token_broker_refreshes_total", provider="rotating", result="credentials_rejected") >= 1
        # The secret is rotated on disk: the next retry uses it, and the broker recovers by itself.
        secret_file.write_text(SECRET + "\n")
        body, _ = broker.get_json("/providers/rotating/token/ready?timeout=15")
        assert oauth.get("/api/hello", body["access_token"]) == 200


def test_the_broker_survives_the_server_going_away_serves_stale_then_recovers(oauth):
    with Broker({"providers": [oauth_provider(oauth)]}) as broker:
        first, _ = broker.get_json("/token/ready?timeout=10")
        oauth.stop()
        try:
            # Refresh fails at about 3.2 s; the cached token is served, stale, until it expires at 4 s.
            assert wait_until(lambda: broker.get_json("/token")[0]["stale"] if broker.request("GET", "/token")[0] == 200 else False, timeout=10)
            stale, _ = broker.get_json("/token")
            assert stale["access_token"] == first["access_token"] and stale["expires_in"] >= 0
            assert wait_until(lambda: broker.request("GET", "/token")[0] == 503, timeout=10)
            status, _, body = broker.request("GET", "/token")
            assert "unreachable" in json.loads(body)["error_description"]
        finally:
            oauth.start()
        # Recovery within one slow retry (maxErrorTokenRefreshDelayMsec is 500 ms here).
        assert wait_until(lambda: broker.request("GET", "/token")[0] == 200, timeout=10)
        fresh, _ = broker.get_json("/token")
        assert fresh["stale"] is False and fresh["version"] > first["version"]
        assert oauth.get("/api/hello", fresh["access_token"]) == 200


@pytest.mark.parametrize("client_id", ["pk-rsa", "pk-ec"])
def test_private_key_jwt_assertions_verify_with_pyjwt_at_the_issuer(oauth, client_id):
    provider = {"name": "pk", "source": {"type": "oauth2", "tokenURL": oauth.base + "/pkjwt/token", "clientID": client_id,
                                         "clientAuth": "private_key_jwt", "privateKeyFile": oauth.private_keys[client_id], "kid": "k1"}}
    before = oauth.requests("pkjwt", 200)
    with Broker({"providers": [provider]}) as broker:
        broker.get_json("/token/ready?timeout=10")
        broker.request("POST", "/token/refresh")
        assert oauth.requests("pkjwt", 200) == before + 2, "both assertions verified (and their jti differ)"
        assert oauth.requests("pkjwt", 401) == 0


def test_the_generic_http_source_reads_pointers_and_header_files(oauth, tmp_path):
    (tmp_path / "api-key").write_text("k3y\n")
    provider = {"name": "custom", "source": {"type": "http", "url": oauth.base + "/custom/token", "method": "GET",
                                             "headers": {"X-Api-Key": {"file": str(tmp_path / "api-key")}},
                                             "tokenPointer": "/data/token", "expiresInPointer": "/data/ttl"}}
    with Broker({"providers": [provider]}) as broker:
        body, _ = broker.get_json("/token/ready?timeout=10")
        assert body["access_token"].startswith("custom-") and 0 < body["expires_in"] <= 4
        assert "k3y" not in broker.stderr()


@pytest.mark.parametrize("mode,classification", [
    ("html", "bad_response"), ("no_token", "bad_response"), ("negative", "bad_response"), ("zero", "bad_response"),
    ("huge", "bad_response"), ("oversized", "bad_response"), ("slow", "timeout"), ("hang", "timeout"),
    ("reset", "unreachable"), ("status_500", "server_error"), ("status_429", "rate_limited"), ("redirect", "bad_response"),
])
def test_bad_upstream_answers_are_classified_retried_and_never_cached(mode, classification):
    issuer = FaultyIssuer()
    source = {"type": "oauth2", "tokenURL": issuer.url, "clientID": "c", "clientSecret": "s", "timeoutMsec": 1000}
    try:
        with Broker({"providers": [{"source": source, "maxErrorTokenRefreshDelayMsec": 200}]}) as broker:
            good, _ = broker.get_json("/token/ready?timeout=10")
            assert good["access_token"] == "good-1"
            issuer.mode = mode
            before = issuer.requests
            status, _, body = broker.request("POST", "/token/refresh?timeout=2", body=b'{"rejected_version": 1}')
            assert status == 304, body  # nothing newer came: as /token/ready?after=1
            assert wait_until(lambda: issuer.requests >= before + 2, timeout=15), "the failure is retried"
            detail = json.loads(broker.request("GET", "/readyz", listener="admin")[2])["providers"][0]
            assert detail["last_error"] == classification, detail
            served, _ = broker.get_json("/token")
            assert served["access_token"] == "good-1" and served["stale"] is True, "the good token stays, marked stale"
            assert broker.request("GET", "/healthz", listener="admin")[0] == 200
            issuer.mode = "ok"
            assert wait_until(lambda: broker.get_json("/token")[0]["access_token"] != "good-1", timeout=15)
    finally:
        issuer.close()


def raw_issuer_broker(answer):
    """A broker with one provider whose issuer answers every fetch with the bytes `answer`."""
    issuer = RawIssuer(answer)
    source = {"type": "oauth2", "tokenURL": issuer.url, "clientID": "c", "clientSecret": "s", "timeoutMsec": 2000}
    return issuer, Broker({"providers": [{"source": source, "maxErrorTokenRefreshDelayMsec": 200}]})


def readiness(broker):
    return json.loads(broker.request("GET", "/readyz", listener="admin")[2])["providers"][0]


RETRY_AFTER_NOT_IN_THE_HEAD = {
    # libcurl hands a chunked body's trailers to the header callback, after the body.
    "in a trailer": b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
                    b"Trailer: Retry-After\r\nConnection: close\r\n\r\n2\r\n{}\r\n0\r\nRetry-After: 3600\r\n\r\n",
    "twice, with different values": b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                                    b"Content-Length: 2\r\nRetry-After: 1\r\nRetry-After: 3600\r\nConnection: close\r\n\r\n{}",
}


@pytest.mark.parametrize("case", RETRY_AFTER_NOT_IN_THE_HEAD)
def test_a_retry_after_only_in_a_trailer_or_sent_twice_differently_holds_no_fetch_off(case):
    issuer, broker = raw_issuer_broker(RETRY_AFTER_NOT_IN_THE_HEAD[case])
    try:
        with broker:
            assert wait_until(lambda: issuer.requests >= 3), ("fetches go on as the backoff says", issuer.requests)
            assert readiness(broker)["last_error"] == "server_error", readiness(broker)
    finally:
        issuer.close()


def signed_jwt(claims):
    """A JWT signed by PyJWT (HS256). Claims given as bytes are signed as they are, through PyJWT's
    JWS layer, so that a claim can repeat, which PyJWT's JWT layer cannot write."""
    key = "a-test-key-of-32-bytes-or-more-0"
    if isinstance(claims, bytes):
        return jwt.api_jws.encode(claims, key, algorithm="HS256")
    return jwt.encode(claims, key, algorithm="HS256")


@pytest.mark.parametrize("source", ["oauth2", "http", "file"])
@pytest.mark.parametrize("claims,reason", [("past", "the token expired"), ("repeated", "appears twice"),
                                           ("string", "not a NumericDate")])
def test_a_jwt_past_its_exp_or_whose_exp_reads_two_ways_is_a_bad_response(tmp_path, source, claims, reason):
    now = int(time.time())
    claims = {"past": {"sub": "s", "exp": now - 3600}, "repeated": b'{"exp":%d,"exp":%d}' % (now + 600, now - 3600),
              "string": {"sub": "s", "exp": str(now - 3600)}}[claims]
    token = signed_jwt(claims)
    issuer = FaultyIssuer()
    issuer.mode, issuer.body = "body", {"access_token": token}
    token_file = tmp_path / "token"
    token_file.write_text(token)
    settings = {"oauth2": {"type": "oauth2", "tokenURL": issuer.url, "clientID": "c", "clientSecret": "s"},
                "http": {"type": "http", "url": issuer.url},
                "file": {"type": "file", "path": str(token_file), "lifetimeSec": 600}}[source]
    try:
        with Broker({"providers": [{"source": settings, "maxErrorTokenRefreshDelayMsec": 200}]}) as broker:
            def readiness():
                return json.loads(broker.request("GET", "/readyz", listener="admin")[2])["providers"][0]
            assert wait_until(lambda: readiness().get("last_error") == "bad_response"), readiness()
            assert reason in readiness()["last_error_description"], readiness()
            status, _, body = broker.request("GET", "/token")
            assert status == 503, body
            assert token not in broker.stderr()
    finally:
        issuer.close()


def expired_jwt(encoded_header):
    """An HS256 JWT, expired an hour ago, with `encoded_header` as its first part; and its key."""
    claims = json.dumps({"sub": "s", "exp": int(time.time()) - 3600}).encode()
    key = b"a-test-key-of-32-bytes-or-more-0"
    signing_input = encoded_header + b"." + jwt.utils.base64url_encode(claims)
    signature = jwt.utils.base64url_encode(hmac.new(key, signing_input, hashlib.sha256).digest())
    return (signing_input + b"." + signature).decode(), key


def check_refused_as_a_bad_jwt(tmp_path, source, token, description):
    """The broker, with `token` from an issuer (`oauth2`) or a file, reports a `bad_response`
    saying `description` and serves nothing."""
    issuer = FaultyIssuer()
    issuer.mode, issuer.body = "body", {"access_token": token}
    token_file = tmp_path / "token"
    token_file.write_text(token)
    settings = {"oauth2": {"type": "oauth2", "tokenURL": issuer.url, "clientID": "c", "clientSecret": "s"},
                "file": {"type": "file", "path": str(token_file), "lifetimeSec": 600}}[source]
    try:
        with Broker({"providers": [{"source": settings, "maxErrorTokenRefreshDelayMsec": 200}]}) as broker:
            assert wait_until(lambda: readiness(broker).get("last_error") == "bad_response"), readiness(broker)
            assert description in readiness(broker)["last_error_description"]
            status, _, body = broker.request("GET", "/token")
            assert status == 503, body
    finally:
        issuer.close()


@pytest.mark.parametrize("source", ["oauth2", "file"])
@pytest.mark.parametrize("encoding", ["utf-8-sig", "utf-16", "utf-16-be", "utf-32"])
def test_a_jwt_whose_header_is_not_utf8_is_still_a_jwt_and_is_refused_past_its_exp(tmp_path, source, encoding):
    """RFC 7515 wants the header in UTF-8 without a byte order mark, but readers decode other
    forms: PyJWT takes a header with a BOM, or in UTF-16 or UTF-32, and finds this token expired.
    The broker took it for an opaque token and served it, for its default lifetime or with no
    expiry at all."""
    token, key = expired_jwt(jwt.utils.base64url_encode(json.dumps({"alg": "HS256", "typ": "JWT"}).encode(encoding)))
    with pytest.raises(jwt.ExpiredSignatureError):
        jwt.decode(token, key, algorithms=["HS256"])
    check_refused_as_a_bad_jwt(tmp_path, source, token, "the token is a JWT whose header is not a JSON object")


@pytest.mark.parametrize("source", ["oauth2", "file"])
@pytest.mark.parametrize("stray", ["at-the-end", "inside"])
def test_a_jwt_whose_header_has_a_byte_outside_base64url_is_still_a_jwt_and_is_refused(tmp_path, source, stray):
    """Lenient base64 readers skip bytes outside the alphabet: Python's `urlsafe_b64decode`, which
    hand-written verifiers use, and Node's `Buffer.from(_, "base64url")`, which `jsonwebtoken`
    uses, read this header as a JWT's and find the token expired. The broker took it for an
    opaque token and served it, for its default lifetime (3,600 s) or with no expiry at all."""
    header = jwt.utils.base64url_encode(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    header = header + b"*" if stray == "at-the-end" else header[:5] + b"~" + header[5:]
    token, _ = expired_jwt(header)
    assert json.loads(base64.urlsafe_b64decode(header + b"=" * (-len(header) % 4)))["typ"] == "JWT"
    check_refused_as_a_bad_jwt(tmp_path, source, token, "the token is a JWT whose header is not base64url")


def test_an_issuers_answer_with_two_different_content_lengths_is_a_bad_response():
    # RFC 9112 §6.3 item 5: unrecoverable. libcurl alone frames the body by the last one.
    body = json.dumps({"access_token": "framed-by-the-last-length", "expires_in": 60}).encode()
    issuer, broker = raw_issuer_broker(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 5\r\n"
        + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
    try:
        with broker:
            assert wait_until(lambda: readiness(broker).get("last_error") == "bad_response"), readiness(broker)
            assert readiness(broker)["last_error_description"] == "bad_response: different Content-Length values"
            assert broker.request("GET", "/token")[0] == 503
    finally:
        issuer.close()


NOT_HTTP = {
    # What libcurl 7.88 fails each with (its code): UNSUPPORTED_PROTOCOL, for the first three.
    "garbage status line": (b"HELLO THERE\r\nContent-Length: 2\r\n\r\n{}", "the answer has no HTTP/1 status line"),
    "another version": (b"HTTP/9.9 200 OK\r\nContent-Length: 2\r\n\r\n{}", "the answer has no HTTP/1 status line"),
    "HTTP/0.9": (b'{"access_token": "no-head-at-all", "expires_in": 60}', "the answer has no HTTP/1 status line"),
    # WEIRD_SERVER_REPLY
    "a header line without a colon": (b"HTTP/1.1 200 OK\r\nNo colon here\r\nContent-Length: 2\r\n\r\n{}",
                                      "the answer's head is not HTTP"),
    # OUT_OF_MEMORY: a header line over libcurl's 100 KiB.
    "a 200 KB header line": (b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 200_000 + b"\r\nContent-Length: 2\r\n\r\n{}",
                             "a line of the answer's head is longer than libcurl takes"),
}


@pytest.mark.parametrize("case", NOT_HTTP)
def test_an_answer_that_is_not_http_is_a_bad_response_for_an_issuer_and_a_proxy(case):
    answer, problem = NOT_HTTP[case]
    issuer = RawIssuer(answer)
    source = {"type": "oauth2", "tokenURL": issuer.url, "clientID": "c", "clientSecret": "s", "timeoutMsec": 2000}
    config = {"providers": [{"source": source, "maxErrorTokenRefreshDelayMsec": 200}, {"name": "signer", "source": {"type": "jwt"}}],
              "proxies": [{"name": "raw", "target": issuer.url.rsplit("/", 1)[0] + "/", "provider": "signer"}]}
    try:
        with Broker(config) as broker:
            assert wait_until(lambda: readiness(broker).get("last_error") == "bad_response"), readiness(broker)
            assert readiness(broker)["last_error_description"].startswith(f"bad_response: {problem}"), readiness(broker)
            status, _, body = broker.request("GET", "/proxy/raw/token")
            assert status == 502 and f"bad_response: {problem}" in json.loads(body)["error_description"], (status, body)
    finally:
        issuer.close()


def test_without_expires_in_an_oauth2_jwt_lives_until_its_exp_not_the_default_lifetime():
    issuer = FaultyIssuer()
    issuer.mode, issuer.body = "body", {"access_token": signed_jwt({"sub": "s", "exp": int(time.time()) + 120})}
    source = {"type": "oauth2", "tokenURL": issuer.url, "clientID": "c", "clientSecret": "s", "defaultLifetimeSec": 3600}
    try:
        with Broker({"providers": [{"source": source}]}) as broker:
            body, _ = broker.get_json("/token/ready?timeout=10")
            assert jwt.decode(body["access_token"], options={"verify_signature": False})["exp"] > time.time()
            assert 0 < body["expires_in"] <= 120, body
            # An issuer that states a lifetime is taken at its word: expires_in counts from the
            # answer, so the clocks need not agree.
            issuer.body = {"access_token": signed_jwt({"sub": "s", "exp": int(time.time()) - 3600}), "expires_in": 300}
            status, _, _ = broker.request("POST", "/token/refresh?timeout=10", body=b'{"rejected_version": 1}')
            assert status == 200
            body, _ = broker.get_json("/token")
            assert body["version"] == 2 and 200 < body["expires_in"] <= 300, body
    finally:
        issuer.close()


def refused_then_served(bad, good, mentions):
    """An oauth2 provider whose issuer answers `bad`: the fetch is a bad_response whose
    description names `mentions`, and nothing is served; once the issuer answers `good`, its
    token is served. Returns the `/token` document then."""
    issuer = FaultyIssuer()
    issuer.mode, issuer.body = "body", bad
    source = {"type": "oauth2", "tokenURL": issuer.url, "clientID": "c", "clientSecret": "s"}
    try:
        with Broker({"providers": [{"source": source, "maxErrorTokenRefreshDelayMsec": 200}]}) as broker:
            assert wait_until(lambda: readiness(broker).get("last_error") == "bad_response"), readiness(broker)
            assert mentions in readiness(broker)["last_error_description"], readiness(broker)
            assert broker.request("GET", "/token")[0] == 503
            issuer.body = good
            assert wait_until(lambda: broker.request("GET", "/token")[0] == 200, timeout=15)
            return broker.get_json("/token")[0]
    finally:
        issuer.close()


@pytest.mark.parametrize("expires_in", [b"300.0", b"3e2", b"3.0e2"])
def test_an_expires_in_not_written_as_digits_is_a_bad_response_though_its_value_is_whole(expires_in):
    assert json.loads(expires_in) == 300
    served = refused_then_served(b'{"access_token": "written-as-300", "expires_in": ' + expires_in + b"}",
                                 json.dumps({"access_token": "written-as-300", "expires_in": 300}).encode(),
                                 "expires_in")
    assert served["access_token"] == "written-as-300" and 200 < served["expires_in"] <= 300, served


@pytest.mark.parametrize("scope", ["read\u202ewrite\x07", "read  write", "read " * 100_000 + "write"],
                         ids=["override-and-bel", "two-spaces", "half-a-mebibyte"])
def test_a_granted_scope_that_is_no_rfc_6749_scope_is_a_bad_response(scope):
    answer = {"access_token": "scoped", "token_type": "Bearer", "expires_in": 300}
    served = refused_then_served({**answer, "scope": scope}, {**answer, "scope": "read write"}, "scope")
    assert served["scope"] == "read write", served


def test_tls_is_always_verified_and_a_configured_ca_file_is_trusted(tmp_path):
    certificate, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(certificate)], check=True, capture_output=True)
    issuer = FaultyIssuer(tls=(str(certificate), str(key)))
    source = {"type": "oauth2", "tokenURL": issuer.url, "clientID": "c", "clientSecret": "s"}
    try:
        with Broker({"providers": [{"source": source, "maxErrorTokenRefreshDelayMsec": 200}]}) as broker:
            assert wait_until(lambda: broker.request("GET", "/readyz", listener="admin")[0] == 503
                              and json.loads(broker.request("GET", "/readyz", listener="admin")[2])["providers"][0].get("last_error") == "unreachable")
            detail = json.loads(broker.request("GET", "/readyz", listener="admin")[2])["providers"][0]
            assert "certificate" in detail["last_error_description"].lower()
            assert issuer.served == 0
        with Broker({"providers": [{"source": {**source, "caFile": str(certificate)}}]}) as broker:
            assert broker.get_json("/token/ready?timeout=10")[0]["access_token"] == "good-1"
    finally:
        issuer.close()


def openssl(*arguments):
    subprocess.run(["openssl", *arguments], check=True, capture_output=True)


def test_mutual_tls_presents_the_configured_client_certificate(tmp_path):
    # A CA made with the openssl command line signs the issuer's and the broker's certificates.
    ca_key, ca = tmp_path / "ca.key", tmp_path / "ca.pem"
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "1",
            "-subj", "/CN=test CA", "-keyout", str(ca_key), "-out", str(ca))
    for name, extension in [("server", "subjectAltName=IP:127.0.0.1"), ("client", "extendedKeyUsage=clientAuth")]:
        openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", f"/CN=broker-{name}",
                "-keyout", str(tmp_path / f"{name}.key"), "-out", str(tmp_path / f"{name}.csr"))
        (tmp_path / f"{name}.ext").write_text(extension + "\n")
        openssl("x509", "-req", "-in", str(tmp_path / f"{name}.csr"), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
                "-days", "1", "-extfile", str(tmp_path / f"{name}.ext"), "-out", str(tmp_path / f"{name}.pem"))
    (tmp_path / "client.key").chmod(0o600)
    issuer = FaultyIssuer(tls=(str(tmp_path / "server.pem"), str(tmp_path / "server.key")), client_ca=str(ca))
    source = {"type": "oauth2", "tokenURL": issuer.url, "clientID": "c", "clientSecret": "s", "caFile": str(ca)}
    try:
        with Broker({"providers": [{"source": source, "maxErrorTokenRefreshDelayMsec": 200}]}) as broker:
            assert wait_until(lambda: json.loads(broker.request("GET", "/readyz", listener="admin")[2])["providers"][0].get("last_error") == "unreachable")
            assert issuer.served == 0, "without a client certificate the handshake fails"
        mtls = {**source, "clientCertFile": str(tmp_path / "client.pem"), "clientKeyFile": str(tmp_path / "client.key")}
        with Broker({"providers": [{"source": mtls}]}) as broker:
            assert broker.get_json("/token/ready?timeout=10")[0]["access_token"].startswith("good-")
            assert issuer.client_subjects and set(issuer.client_subjects) == {"broker-client"}
    finally:
        issuer.close()


def make_ca(directory, name):
    """A CA made with the openssl command line: its certificate and key paths."""
    key, certificate = directory / f"{name}.key", directory / f"{name}.pem"
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "1",
            "-subj", f"/CN=test CA {name}", "-keyout", str(key), "-out", str(certificate))
    return certificate, key


def make_certificate(directory, ca, ca_key, name, subject, extension):
    """A certificate for `subject` (a CN) with `extension` (an openssl x509 extension line), signed
    by `ca`, as `name`.pem beside its key `name`.key (mode 0600): the two paths."""
    key, request, certificate = directory / f"{name}.key", directory / f"{name}.csr", directory / f"{name}.pem"
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", f"/CN={subject}",
            "-keyout", str(key), "-out", str(request))
    (directory / f"{name}.ext").write_text(extension + "\n")
    openssl("x509", "-req", "-in", str(request), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial", "-days", "1",
            "-extfile", str(directory / f"{name}.ext"), "-out", str(certificate))
    key.chmod(0o600)
    return certificate, key


def make_server_certificate(directory, ca, ca_key):
    """A certificate for 127.0.0.1 signed by `ca`: its certificate and key paths."""
    return make_certificate(directory, ca, ca_key, "server", "issuer", "subjectAltName=IP:127.0.0.1")


def make_client_certificate(directory, ca, ca_key):
    """A client certificate (CN broker-client) signed by `ca`: its certificate and key paths."""
    return make_certificate(directory, ca, ca_key, "client", "broker-client", "extendedKeyUsage=clientAuth")


def test_a_replaced_ca_file_is_used_from_the_next_connection_on(tmp_path):
    # The broker reads the CA file again when it changed (`stat`: another file, size or time) and
    # gives libcurl its bytes: replaced by another file, then rewritten in place with what it held.
    signer, signer_key = make_ca(tmp_path, "a")
    unrelated, _ = make_ca(tmp_path, "b")
    certificate, key = make_server_certificate(tmp_path, signer, signer_key)
    openssl("verify", "-CAfile", str(signer), str(certificate))
    assert subprocess.run(["openssl", "verify", "-CAfile", str(unrelated), str(certificate)], capture_output=True).returncode != 0
    ca_file = tmp_path / "trusted.pem"
    ca_file.write_bytes(signer.read_bytes())
    # One connection per fetch: the issuer speaks HTTP/1.0.
    issuer = FaultyIssuer(tls=(str(certificate), str(key)))
    source = {"type": "oauth2", "tokenURL": issuer.url, "clientID": "c", "clientSecret": "s", "caFile": str(ca_file)}
    try:
        with Broker({"providers": [{"source": source, "maxErrorTokenRefreshDelayMsec": 200}]}) as broker:
            def readiness():
                return json.loads(broker.request("GET", "/readyz", listener="admin")[2])["providers"][0]
            assert broker.get_json("/token/ready?timeout=10")[0]["access_token"] == "good-1"
            replacement = tmp_path / "replacement.pem"
            replacement.write_bytes(unrelated.read_bytes())
            os.replace(replacement, ca_file)
            broker.request("POST", "/token/refresh?timeout=2", body=b'{"rejected_version": 1}')
            assert wait_until(lambda: readiness().get("last_error") == "unreachable"), readiness()
            assert "certificate" in readiness()["last_error_description"].lower(), readiness()
            assert issuer.served == 1, "the unrelated CA does not trust the issuer"
            with open(ca_file, "wb") as handle:
                handle.write(signer.read_bytes())
            assert wait_until(lambda: broker.get_json("/token")[0]["access_token"] == "good-2"), readiness()
            assert issuer.served == 2
    finally:
        issuer.close()


def test_a_ca_file_replaces_the_system_ca_directory_instead_of_adding_to_it(tmp_path):
    # The system's CA directory (Debian's libcurl is built with /etc/ssl/certs) is replaced, in a
    # mount namespace of the broker's own, by one that holds only the CA that signed the issuer.
    if os.geteuid() != 0 or subprocess.run(["unshare", "-m", "--propagation", "private", "true"]).returncode != 0:
        pytest.skip("needs root, to give the broker a mount namespace of its own (unshare -m)")
    signer, signer_key = make_ca(tmp_path, "a")
    unrelated, _ = make_ca(tmp_path, "b")
    certificate, key = make_server_certificate(tmp_path, signer, signer_key)
    directory = tmp_path / "certs"
    directory.mkdir()
    (directory / "a.pem").write_bytes(signer.read_bytes())
    openssl("rehash", str(directory))
    # The openssl command line agrees: the directory trusts the issuer, the unrelated CA does not.
    openssl("verify", "-CApath", str(directory), str(certificate))
    assert subprocess.run(["openssl", "verify", "-CAfile", str(unrelated), str(certificate)], capture_output=True).returncode != 0
    wrapper = tmp_path / "broker-with-own-ca-directory"
    wrapper.write_text("#!/bin/sh\nexec unshare -m --propagation private sh -c "
                       "'mount --bind \"$0\" /etc/ssl/certs && exec \"$@\"' " + f"'{directory}' '{BINARY}' \"$@\"\n")
    wrapper.chmod(0o755)
    issuer = FaultyIssuer(tls=(str(certificate), str(key)))
    source = {"type": "oauth2", "tokenURL": issuer.url, "clientID": "c", "clientSecret": "s"}
    try:
        with Broker({"providers": [{"source": {**source, "caFile": str(unrelated)}, "maxErrorTokenRefreshDelayMsec": 200}]},
                    binary=str(wrapper)) as broker:
            def readiness():
                return json.loads(broker.request("GET", "/readyz", listener="admin")[2])["providers"][0]
            assert wait_until(lambda: readiness().get("last_error") == "unreachable"), (readiness(), issuer.served)
            detail = readiness()
            assert "certificate" in detail["last_error_description"].lower(), detail
            assert issuer.served == 0, "the CA directory's issuer is not trusted beside the caFile"
        with Broker({"providers": [{"source": {**source, "caFile": str(signer)}}]}, binary=str(wrapper)) as broker:
            assert broker.get_json("/token/ready?timeout=10")[0]["access_token"].startswith("good-")
    finally:
        issuer.close()


def test_a_client_key_replaced_by_an_encrypted_one_fails_its_connection_without_asking_a_terminal(tmp_path):
    # The key is checked when the configuration is loaded, but libcurl reads it again at each
    # connection. Given no pass phrase, OpenSSL would ask the controlling terminal for one and the
    # upstream client's thread would wait there: the broker runs with a pseudo-terminal as its own.
    ca, ca_key = make_ca(tmp_path, "ca")
    certificate, key = make_server_certificate(tmp_path, ca, ca_key)
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", "/CN=broker-client",
            "-keyout", str(tmp_path / "client.key"), "-out", str(tmp_path / "client.csr"))
    (tmp_path / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    openssl("x509", "-req", "-in", str(tmp_path / "client.csr"), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
            "-days", "1", "-extfile", str(tmp_path / "client.ext"), "-out", str(tmp_path / "client.pem"))
    openssl("pkey", "-in", str(tmp_path / "client.key"), "-aes256", "-passout", "pass:secret", "-out", str(tmp_path / "encrypted.key"))
    master, slave = os.openpty()
    wrapper = tmp_path / "broker-with-a-terminal"
    wrapper.write_text("#!/usr/bin/env python3\nimport os, sys\nos.setsid()\n"
                       f"os.open({os.ttyname(slave)!r}, os.O_RDWR)  # the first terminal opened: the controlling one\n"
                       f"os.execv({BINARY!r}, [{BINARY!r}] + sys.argv[1:])\n")
    wrapper.chmod(0o755)
    os.set_blocking(master, False)

    def terminal():
        try:
            return os.read(master, 4096).decode(errors="replace")
        except BlockingIOError:
            return ""

    # One connection per fetch: the issuer speaks HTTP/1.0.
    issuer = FaultyIssuer(tls=(str(certificate), str(key)), client_ca=str(ca))
    source = {"type": "oauth2", "tokenURL": issuer.url, "clientID": "c", "clientSecret": "s", "caFile": str(ca),
              "clientCertFile": str(tmp_path / "client.pem"), "clientKeyFile": str(tmp_path / "client.key")}
    try:
        with Broker({"providers": [{"source": source, "maxErrorTokenRefreshDelayMsec": 200}]}, binary=str(wrapper)) as broker:
            assert broker.get_json("/token/ready?timeout=10")[0]["access_token"] == "good-1"
            os.replace(tmp_path / "encrypted.key", tmp_path / "client.key")
            broker.request("POST", "/token/refresh?timeout=2", body=b'{"rejected_version": 1}')

            def readiness():
                return json.loads(broker.request("GET", "/readyz", listener="admin")[2])["providers"][0]
            shown = ""
            assert wait_until(lambda: readiness().get("last_error") == "unreachable"), (readiness(), terminal())
            shown += terminal()
            assert "pass phrase" not in shown.lower(), shown
            assert issuer.served == 1
    finally:
        issuer.close()
        os.close(master)
        os.close(slave)


def test_an_issuer_that_repeats_the_secrets_sent_gets_none_into_the_log_readyz_or_answers(tmp_path):
    secret, api_key = "s3cr3t/echoed+value", "api-key-from-a-file"
    key_file = tmp_path / "api-key"
    key_file.write_text(api_key + "\n")
    key_file.chmod(0o600)
    issuer = FaultyIssuer()
    issuer.mode = "echo"
    oauth2 = {"type": "oauth2", "tokenURL": issuer.url, "clientID": "c", "clientSecret": secret}
    providers = [
        {"name": "basic", "source": oauth2},
        {"name": "post", "source": {**oauth2, "clientAuth": "client_secret_post"}},
        {"name": "http", "source": {"type": "http", "url": issuer.url, "headers": {"X-Api-Key": {"file": str(key_file)}}}},
    ]
    hidden = [secret, "s3cr3t%2Fechoed%2Bvalue", base64.b64encode(b"c:s3cr3t%2Fechoed%2Bvalue").decode(), api_key]
    try:
        with Broker({"providers": [{**provider, "maxErrorTokenRefreshDelayMsec": 200} for provider in providers]}) as broker:
            def readiness():
                return json.loads(broker.request("GET", "/readyz", listener="admin")[2])["providers"]
            assert wait_until(lambda: all(p.get("last_error") == "credentials_rejected" for p in readiness())), readiness()
            texts = [broker.request("GET", "/readyz", listener="admin")[2].decode(), broker.stderr()]
            for provider in providers:
                status, _, body = broker.request("GET", f"/providers/{provider['name']}/token")
                assert status == 503, body
                texts.append(body.decode())
            for provider in readiness():
                assert "you sent" in provider["last_error_description"] and "[hidden]" in provider["last_error_description"], provider
            for text in texts:
                assert not any(value in text for value in hidden), text
                assert "\x7f" not in text and "\x9b" not in text
    finally:
        issuer.close()


@pytest.mark.parametrize("secret,fragments", [("Sup3r Secret/Value+42", ["Sup3r", "Value"]),
                                              ("50%dis/count k3y", ["dis/count", "dis%2Fcount", "k3y"])])
def test_a_secret_the_issuer_percent_encodes_again_stays_hidden(secret, fragments):
    """The issuer echoes the secret escaped three ways, the request's form of it escaped again,
    and for Basic the credentials without their padding. A secret holding '%' was shown whole
    when escaped (its '%' became '%25'), as were the last two forms."""
    issuer = FaultyIssuer()
    issuer.mode = "echo_encoded"
    oauth2 = {"type": "oauth2", "tokenURL": issuer.url, "clientID": "c", "clientSecret": secret}
    providers = [{"name": "basic", "source": oauth2}, {"name": "post", "source": {**oauth2, "clientAuth": "client_secret_post"}}]
    # What the issuer writes, made here by Python's urllib and base64 as the issuer makes them.
    form = urllib.parse.quote_plus(secret)
    basic = base64.b64encode(f"c:{form}".encode()).decode()
    hidden = [secret, urllib.parse.quote(secret), urllib.parse.quote(secret, safe="").lower(), form,
              urllib.parse.quote(form, safe=""), basic.rstrip("="), *fragments]
    forms = {"basic": 5, "post": 4}
    try:
        with Broker({"providers": [{**provider, "maxErrorTokenRefreshDelayMsec": 200} for provider in providers]}) as broker:
            def readiness():
                return json.loads(broker.request("GET", "/readyz", listener="admin")[2])["providers"]
            assert wait_until(lambda: all(p.get("last_error") == "credentials_rejected" for p in readiness())), readiness()
            texts = [broker.request("GET", "/readyz", listener="admin")[2].decode(), broker.stderr()]
            texts += [broker.request("GET", f"/providers/{provider['name']}/token")[2].decode() for provider in providers]
            for provider in readiness():
                shown = "you sent " + " and ".join(["[hidden]"] * forms[provider["name"]])
                assert provider["last_error_description"].endswith(shown), provider
            for text in texts:
                assert not any(value in text for value in hidden), text
    finally:
        issuer.close()


def test_a_secret_file_readable_by_others_gives_one_warning_at_start(oauth, tmp_path):
    secret_file = tmp_path / "secret"
    secret_file.write_text(SECRET)
    secret_file.chmod(0o644)
    with Broker({"providers": [oauth_provider(oauth, clientSecretFile=str(secret_file))]}) as broker:
        broker.get_json("/token/ready?timeout=10")
        assert broker.stderr().count("a secret file can be read by other users") == 1
        assert f"path={secret_file}" in broker.stderr() and "mode=0644" in broker.stderr()
    secret_file.chmod(0o600)
    with Broker({"providers": [oauth_provider(oauth, clientSecretFile=str(secret_file))]}) as broker:
        broker.get_json("/token/ready?timeout=10")
        assert "can be read by other users" not in broker.stderr()
