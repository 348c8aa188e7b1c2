"""Provider templates (`perRequest`): tokens per audience, scope and resource, made on request.

Against the real OAuth server (django-oauth-toolkit), which records what each token request asked
for (`audience`, `scope`, `resource`) and the SHA-256 of the token it issued: a token the broker
serves is traced back to the request that made it. Local signer children are verified by PyJWT
against the broker's JWKS.
"""
import hashlib
import json
import secrets
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import quote

import jwt
import pytest

from broker import Broker, run_broker
from issuers.process import OAuthServer
from test_http_api import wait_until

SECRET = "template-secret-for-tests"
API_KEY = "template-api-key"
# Long enough that no child refreshes in the background while a test counts fetches.
LIFETIME = 300
AUDIENCES = [f"https://api.example/svc{index}" for index in range(10)]
ALLOWED = {
    "audience": ["https://api.example/*", "https://exact.example"],
    "scope": ["read", "write", "api"],
    "resource": ["https://storage.example/*"],
}
ALLOW_KEYS = {"audience": "allowedAudiences", "scope": "allowedScopes", "resource": "allowedResources"}


@pytest.fixture(scope="module")
def issuer(tmp_path_factory):
    server = OAuthServer(str(tmp_path_factory.mktemp("templates")), {"tmpl": SECRET}, lifetime=LIFETIME, api_key=API_KEY)
    yield server
    server.close()


def oauth_template(issuer, name="orders", per_request=("audience",), source=None, **extra):
    """A template on the OAuth server, with `scope: api` configured as the default scope."""
    provider = {"name": name, "perRequest": list(per_request), "maxErrorTokenRefreshDelayMsec": 500,
                "source": {"type": "oauth2", "tokenURL": issuer.base + "/o/token/", "clientID": "tmpl",
                           "clientSecret": SECRET, "scope": "api", **(source or {})}}
    for parameter in per_request:
        provider[ALLOW_KEYS[parameter]] = ALLOWED[parameter]
    provider.update(extra)
    return provider


def query(**values):
    """`?audience=…&scope=…`, each value percent-encoded whole (a space as %20)."""
    return "?" + "&".join(f"{name}={quote(value, safe='')}" for name, value in values.items()) if values else ""


def sha256(text):
    return hashlib.sha256(text.encode()).hexdigest()


def token_for(broker, name="orders", route="token", **values):
    """GET /providers/{name}/{route} with the values; asserts 200 and returns the body."""
    status, _, body = broker.request("GET", f"/providers/{name}/{route}{query(**values)}", timeout=70)
    assert status == 200, (values, status, body)
    return json.loads(body)


def template_readiness(broker, name="orders"):
    """The template's entry in /readyz: {"name", "children", "ready", "max_children"}."""
    _, _, body = broker.request("GET", "/readyz", listener="admin")
    entries = [entry for entry in json.loads(body).get("templates", []) if entry.get("name") == name]
    assert len(entries) == 1, body
    return entries[0]


def error(broker, path, method="GET", expect=400):
    status, headers, body = broker.request(method, path)
    assert status == expect, (path, status, body)
    return json.loads(body), headers


def fetched_for(issuer, since, **values):
    """The issuer's token requests after `since` that asked for exactly these form values."""
    return [r for r in issuer.token_requests(since=since)
            if all(r[name] == ([value] if value is not None else []) for name, value in values.items())]


# Ten audiences, a hundred callers each

def test_ten_audiences_asked_a_hundred_times_each_make_ten_fetches_and_each_caller_gets_its_own(issuer):
    started = time.time()
    with Broker({"providers": [oauth_template(issuer)]}) as broker:
        # Round-robin order: the first fifty requests in flight hold five first requests of each audience.
        wanted = [AUDIENCES[index % len(AUDIENCES)] for index in range(1000)]

        def ask(audience):
            status, _, body = broker.request("GET", f"/providers/orders/token{query(audience=audience)}", timeout=70)
            return audience, status, body

        with ThreadPoolExecutor(max_workers=50) as pool:
            answers = list(pool.map(ask, wanted))

        assert [status for _, status, _ in answers] == [200] * 1000, [body for _, status, body in answers if status != 200][:3]
        requests = issuer.token_requests(since=started)
        assert len(requests) == 10, [(r["audience"], r["status"]) for r in requests]
        assert sorted(r["audience"][0] for r in requests if r["audience"]) == sorted(AUDIENCES), "one fetch per audience"
        assert all(r["status"] == 200 and r["scope"] == ["api"] for r in requests), "the configured scope is the default"
        issued = {r["token_sha256"]: r["audience"] for r in requests}
        tokens = {}
        for audience, _, body in answers:
            token = json.loads(body)["access_token"]
            assert issued.get(sha256(token)) == [audience], f"a caller asking for {audience} got another audience's token"
            tokens.setdefault(audience, set()).add(token)
        assert all(len(seen) == 1 for seen in tokens.values()), "each audience's callers share its one token"
        assert issuer.get("/api/hello", next(iter(tokens[AUDIENCES[0]]))) == 200

        readiness = template_readiness(broker)
        assert (readiness["children"], readiness["ready"], readiness["max_children"]) == (10, 10, 100)
        assert broker.metric("token_broker_template_children", provider="orders") == 10
        assert broker.metric("token_broker_template_children_ready", provider="orders") == 10
        # Labels carry the template's name, never a requested value.
        for name, labels in broker.metrics():
            for _, value in labels:
                assert "example" not in value, (name, labels)
        status, _, body = broker.request("GET", "/readyz", listener="admin")
        assert b"api.example" not in body


def test_a_child_is_served_read_and_refreshed_on_its_own_and_the_first_template_answers_token(issuer):
    config = {"providers": [oauth_template(issuer), {"name": "plain"}]}
    with Broker(config) as broker:
        started = time.time()
        first = token_for(broker, "orders", "token/ready", audience=AUDIENCES[0])
        other = token_for(broker, audience=AUDIENCES[1])
        assert first["access_token"] != other["access_token"]
        # /token is the first provider, here the template: with a value, the same child.
        status, _, body = broker.request("GET", "/token" + query(audience=AUDIENCES[0]))
        assert status == 200 and json.loads(body)["access_token"] == first["access_token"]
        # Nothing newer: 304, as for a configured provider.
        path = f"/providers/orders/token/ready{query(audience=AUDIENCES[0])}&after={first['version']}&timeout=1"
        status, headers, _ = broker.request("GET", path)
        assert status == 304 and headers["etag"] == f'"{first["version"]}"'
        # The retrier renews this child only.
        status, _, body = broker.request("POST", f"/providers/orders/token/refresh{query(audience=AUDIENCES[0])}",
                                         body=json.dumps({"rejected_version": first["version"]}).encode())
        assert status == 200, body
        renewed = json.loads(body)
        assert renewed["version"] > first["version"] and renewed["access_token"] != first["access_token"]
        assert len(fetched_for(issuer, started, audience=AUDIENCES[0])) == 2
        assert len(fetched_for(issuer, started, audience=AUDIENCES[1])) == 1
        assert token_for(broker, audience=AUDIENCES[1])["access_token"] == other["access_token"]
        assert issuer.issued()[sha256(renewed["access_token"])]["audience"] == [AUDIENCES[0]]
        # No value: the template's default child, which sends the configured defaults only.
        default = broker.get_json("/token", timeout=70)[0]
        record = issuer.issued()[sha256(default["access_token"])]
        assert record["audience"] == [] and record["scope"] == ["api"] and record["resource"] == []
        assert template_readiness(broker)["children"] == 3


def test_scope_is_a_set_so_its_spellings_are_one_child_with_one_fetch(issuer):
    started = time.time()
    with Broker({"providers": [oauth_template(issuer, per_request=("scope",))]}) as broker:
        spellings = ["read api", "api read", "read api read"]
        with ThreadPoolExecutor(max_workers=len(spellings)) as pool:
            answers = list(pool.map(lambda scope: token_for(broker, scope=scope), spellings))
        assert len({answer["access_token"] for answer in answers}) == 1
        narrower = token_for(broker, scope="read")
        assert narrower["access_token"] != answers[0]["access_token"]
        requests = issuer.token_requests(since=started)
        assert len(requests) == 2, [r["scope"] for r in requests]
        issued = issuer.issued()
        assert set(issued[sha256(answers[0]["access_token"])]["scope"][0].split()) == {"read", "api"}
        assert set(issued[sha256(answers[0]["access_token"])]["issued_scope"].split()) == {"read", "api"}
        assert issued[sha256(narrower["access_token"])]["scope"] == ["read"]
        assert template_readiness(broker)["children"] == 2


def test_audience_scope_and_resource_reach_the_issuer_together(issuer):
    started = time.time()
    provider = oauth_template(issuer, per_request=("audience", "scope", "resource"))
    with Broker({"providers": [provider]}) as broker:
        values = {"audience": "https://exact.example", "scope": "read write", "resource": "https://storage.example/bucket-a"}
        body = token_for(broker, **values)
        [record] = issuer.token_requests(since=started)
        assert record["audience"] == ["https://exact.example"]
        assert set(record["scope"][0].split()) == {"read", "write"} and len(record["scope"]) == 1
        assert record["resource"] == ["https://storage.example/bucket-a"]
        assert record["token_sha256"] == sha256(body["access_token"])
        # django-oauth-toolkit bound the token to that resource (RFC 8707): elsewhere it is refused.
        assert issuer.get("/api/hello", body["access_token"]) in (401, 403)
        # A value left out takes the configured default (scope), or none (audience, resource).
        only_audience = token_for(broker, audience="https://exact.example")
        record = issuer.issued()[sha256(only_audience["access_token"])]
        assert record["audience"] == ["https://exact.example"] and record["scope"] == ["api"] and record["resource"] == []


def test_an_http_source_gets_the_values_through_its_placeholders(issuer):
    started = time.time()
    provider = {"name": "custom", "perRequest": ["audience", "scope"],
                "allowedAudiences": ["orders", "billing"], "allowedScopes": ["read", "write"],
                "source": {"type": "http", "url": issuer.base + "/custom/token?aud={{audience}}", "method": "POST",
                           "headers": {"X-Api-Key": API_KEY, "X-Scope": "{{scope}}", "Content-Type": "application/json"},
                           "body": '{"audience": "{{audience}}", "scope": "{{scope}}"}',
                           "tokenPointer": "/data/token", "expiresInPointer": "/data/ttl"}}
    with Broker({"providers": [provider]}) as broker:
        orders = token_for(broker, "custom", audience="orders", scope="write read")
        billing = token_for(broker, "custom", audience="billing", scope="read")
        requests = {r["token_sha256"]: r for r in issuer.token_requests("custom", since=started)}
        assert len(requests) == 2
        sent = requests[sha256(orders["access_token"])]
        assert sent["query"]["aud"] == ["orders"]
        assert set(sent["headers"]["X-Scope"].split()) == {"read", "write"}
        document = json.loads(sent["body"])
        assert document["audience"] == "orders" and set(document["scope"].split()) == {"read", "write"}
        sent = requests[sha256(billing["access_token"])]
        assert sent["query"]["aud"] == ["billing"] and sent["headers"]["X-Scope"] == "read"
        assert json.loads(sent["body"]) == {"audience": "billing", "scope": "read"}


def test_an_http_template_needs_every_value_its_placeholders_use_and_never_fetches_without_them(issuer, tmp_path):
    # The placeholders have no configured default: a value left out would go out empty, past the allow-list.
    provider = {"name": "custom", "perRequest": ["audience", "scope"],
                "allowedAudiences": ["orders", "billing"], "allowedScopes": ["read", "write"],
                "source": {"type": "http", "url": issuer.base + "/custom/token?aud={{audience}}", "method": "POST",
                           "headers": {"X-Api-Key": API_KEY, "Content-Type": "application/json"},
                           "body": '{"scope": "{{scope}}"}',
                           "tokenPointer": "/data/token", "expiresInPointer": "/data/ttl"}}
    with Broker({"providers": [provider]}) as broker:
        started = time.time()
        for path, parameter in [
            ("/providers/custom/token", "audience"),
            ("/token", "audience"),
            ("/providers/custom/token" + query(scope="read"), "audience"),
            ("/providers/custom/token/ready" + query(scope="read"), "audience"),
            ("/providers/custom/token" + query(audience="orders"), "scope"),
        ]:
            document, _ = error(broker, path)
            assert document["error"] == "invalid_request" and document["parameter"] == parameter, (path, document)
            assert document["error_description"].startswith(f"{parameter} is required by this template"), document
        document, _ = error(broker, "/providers/custom/token/refresh" + query(scope="read"), method="POST")
        assert document["parameter"] == "audience", document
        # Named without a value (no `=`): malformed, not left out.
        document, _ = error(broker, "/providers/custom/token?audience&scope=read")
        assert document["error"] == "invalid_request" and document["parameter"] == "audience", document
        assert "required" not in document["error_description"], document
        assert issuer.token_requests("custom", since=started) == [], "a value left out never causes a fetch"
        assert template_readiness(broker, "custom")["children"] == 0
        # Both named: the child fetches with them.
        served = token_for(broker, "custom", audience="orders", scope="read")
        [sent] = issuer.token_requests("custom", since=started)
        assert sent["token_sha256"] == sha256(served["access_token"]) and sent["query"]["aud"] == ["orders"]
    # A sink on the template that leaves a value out is refused at start, naming it.
    config = {"providers": [provider], "sinks": [{"provider": "custom", "path": str(tmp_path / "t.token"),
                                                    "scope": "read"}]}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    result = run_broker("--check-config", "--config", str(path))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "sinks[0].audience" in result.stderr and "required" in result.stderr, result.stderr


# The local signer

def test_local_signer_children_carry_the_requested_audience_and_scope_verified_with_the_jwks(tmp_key):
    provider = {"name": "signer", "perRequest": ["audience", "scope"], "allowedAudiences": ALLOWED["audience"],
                "allowedScopes": ALLOWED["scope"], "source": {"type": "jwt", "keyFile": tmp_key("ec"), "lifetimeSec": 300}}
    with Broker({"providers": [provider]}) as broker:
        jwks, _ = broker.get_json("/.well-known/jwks.json")
        keys = {key["kid"]: jwt.PyJWK(key) for key in jwks["keys"]}

        def verify(token, audience):
            key = keys[jwt.get_unverified_header(token)["kid"]]
            return jwt.decode(token, key.key, algorithms=["ES256"], audience=audience, issuer="token-broker",
                              options={"require": ["exp", "iat", "aud", "iss"]})

        orders = token_for(broker, "signer", audience="https://api.example/orders", scope="write read")
        claims = verify(orders["access_token"], "https://api.example/orders")
        assert set(claims["scope"].split()) == {"read", "write"} and len(claims["scope"].split()) == 2
        with pytest.raises(jwt.InvalidAudienceError):
            verify(orders["access_token"], "https://api.example/storage")

        same = token_for(broker, "signer", audience="https://api.example/orders", scope="read write")
        assert same["access_token"] == orders["access_token"], "one child for both spellings of the scope set"

        storage = token_for(broker, "signer", audience="https://api.example/storage")
        claims = verify(storage["access_token"], "https://api.example/storage")
        assert "scope" not in claims, "no scope asked for, none configured"
        with pytest.raises(jwt.InvalidAudienceError):
            verify(storage["access_token"], "https://api.example/orders")

        default = token_for(broker, "signer")
        claims = verify(default["access_token"], "token-broker")
        assert "scope" not in claims
        assert template_readiness(broker, "signer")["children"] == 3


# Refusals: each names its parameter, and none reaches the issuer

@pytest.mark.parametrize("values,parameter,code", [
    ({"audience": "https://evil.example/"}, "audience", "value_not_allowed"),
    ({"audience": "https://api.example"}, "audience", "value_not_allowed"),  # the prefix needs its slash
    ({"audience": "https://exact.example/more"}, "audience", "value_not_allowed"),  # exact means exact
    ({"audience": "https://api.example/svc0/../admin"}, "audience", "value_not_allowed"),  # no dot segment
    ({"audience": "https://api.example/svc0\\admin"}, "audience", "value_not_allowed"),  # nor a backslash
    # Escapes the value still holds once the query is decoded, as a normalizing server reads them.
    ({"audience": "https://api.example/%2e%2e/admin"}, "audience", "value_not_allowed"),
    ({"audience": "https://api.example/svc0/..%2Fadmin"}, "audience", "value_not_allowed"),
    ({"audience": "https://api.example/%252e%252e/admin"}, "audience", "value_not_allowed"),
    ({"scope": "read admin"}, "scope", "value_not_allowed"),
    ({"resource": "https://elsewhere.example/x"}, "resource", "value_not_allowed"),
    ({"audience": ""}, "audience", "invalid_request"),
    ({"audience": "https://api.example/a b"}, "audience", "invalid_request"),
    ({"audience": "https://api.example/\x01"}, "audience", "invalid_request"),
    ({"audience": "https://api.example/" + "a" * 1100}, "audience", "invalid_request"),
    ({"scope": "read  api"}, "scope", "invalid_request"),
    ({"scope": " read"}, "scope", "invalid_request"),
    ({"scope": 'read "api"'}, "scope", "invalid_request"),
    ({"scope": "read\\api"}, "scope", "invalid_request"),
    ({"resource": ""}, "resource", "invalid_request"),
])
def test_a_refused_value_gets_400_naming_the_parameter_and_never_a_fetch(issuer, values, parameter, code):
    provider = oauth_template(issuer, per_request=("audience", "scope", "resource"))
    with Broker({"providers": [provider]}) as broker:
        started = time.time()
        for path in ("/providers/orders/token", "/providers/orders/token/ready", "/token"):
            document, _ = error(broker, path + query(**values))
            assert document["error"] == code and document["parameter"] == parameter, document
            assert parameter in document["error_description"]
        document, _ = error(broker, "/providers/orders/token/refresh" + query(**values), method="POST")
        assert document["error"] == code and document["parameter"] == parameter
        assert issuer.token_requests(since=started) == [], "a refused value never causes a fetch"
        assert template_readiness(broker)["children"] == 0
        assert broker.metric("token_broker_template_children", provider="orders") == 0


def test_parameters_a_provider_does_not_take_and_repeated_ones_get_invalid_request(issuer):
    config = {"providers": [oauth_template(issuer), {"name": "plain"}]}
    with Broker(config) as broker:
        started = time.time()
        for path, parameter in [
            ("/providers/orders/token" + query(resource="https://storage.example/a"), "resource"),
            ("/providers/orders/token" + query(scope="read"), "scope"),
            ("/providers/plain/token" + query(audience=AUDIENCES[0]), "audience"),
            ("/providers/plain/token/ready" + query(audience=AUDIENCES[0]), "audience"),
        ]:
            document, _ = error(broker, path)
            assert document["error"] == "invalid_request" and document["parameter"] == parameter, (path, document)
        # A parameter given twice is refused as any repeated parameter is.
        document, _ = error(broker, f"/providers/orders/token{query(audience=AUDIENCES[0])}&audience={quote(AUDIENCES[1], safe='')}")
        assert document["error"] == "invalid_request" and "audience" in document["error_description"], document
        assert issuer.token_requests(since=started) == []
        assert template_readiness(broker)["children"] == 0


# Bounds

def test_past_max_children_a_new_child_gets_503_with_retry_after_and_no_fetch(issuer):
    with Broker({"providers": [oauth_template(issuer, maxChildren=2)]}) as broker:
        started = time.time()
        kept = [token_for(broker, audience=audience) for audience in AUDIENCES[:2]]
        status, headers, body = broker.request("GET", f"/providers/orders/token{query(audience=AUDIENCES[2])}")
        assert status == 503, body
        document = json.loads(body)
        assert document["error"] == "too_many_children" and "maxChildren" in document["error_description"]
        assert int(headers["retry-after"]) >= 1
        assert fetched_for(issuer, started, audience=AUDIENCES[2]) == []
        assert len(issuer.token_requests(since=started)) == 2
        # The children already made are served as before, without a fetch.
        assert [token_for(broker, audience=a)["access_token"] for a in AUDIENCES[:2]] == [k["access_token"] for k in kept]
        assert len(issuer.token_requests(since=started)) == 2
        readiness = template_readiness(broker)
        assert (readiness["children"], readiness["ready"], readiness["max_children"]) == (2, 2, 2)
        assert broker.metric("token_broker_template_children_refused_total", provider="orders") == 1


def test_the_children_share_the_template_s_window_of_forced_refreshes(issuer):
    """One caller refusing twenty children's tokens six times each: the template makes
    forcedRefreshMaxAttempts (5) forced fetches per forcedRefreshWindowSec between its children,
    not five per child (a hundred). One child takes three of the five places while the others take
    none, so that two are left for the first refresh of two other children. The window is 300 s
    here, so that no place leaves it while the test runs, however slow the machine."""
    audiences = [f"https://api.example/forced{index}" for index in range(20)]
    config = {"providers": [oauth_template(issuer, maxChildren=50, forcedRefreshWindowSec=300)]}
    with Broker(config) as broker:
        versions = {audience: token_for(broker, audience=audience)["version"] for audience in audiences}
        started = time.time()
        answers = {}
        for audience in audiences:
            for _ in range(6):
                status, headers, body = broker.request(
                    "POST", f"/providers/orders/token/refresh{query(audience=audience)}", timeout=70)
                answers.setdefault(audience, []).append(status)
                if status == 200:
                    refreshed = json.loads(body)
                    assert refreshed["version"] > versions[audience], body
                    versions[audience] = refreshed["version"]
                else:
                    assert status == 429, body
                    document = json.loads(body)
                    assert document["error"] == "excessive_refresh", body
                    assert 1 <= int(headers["retry-after"]) <= 300
        forced = issuer.token_requests(since=started)
        assert len(forced) == 5, f"the issuer's token requests for forced refreshes: {len(forced)}; answers {answers}"
        assert [answers[audience].count(200) for audience in audiences] == [3, 1, 1] + [0] * 17, answers
        assert broker.metric("token_broker_excessive_refreshes_total", provider="orders") == 115


def test_a_request_refused_for_its_route_s_parameters_makes_no_child_and_no_fetch(issuer):
    """`after`, `timeout`, `If-None-Match` and the retrier's body are read before the child is
    made. They were read after: three requests answered 400 each made a child, each child
    fetched a token, and with maxChildren 3 a caller's new audience then got 503
    too_many_children for up to childIdleSec."""
    audiences = [f"https://api.example/refused{index}" for index in range(6)]
    with Broker({"providers": [oauth_template(issuer, maxChildren=3)]}) as broker:
        started = time.time()
        refused = [
            ("GET", f"/providers/orders/token/ready{query(audience=audiences[0])}&after=x", None),
            ("GET", f"/token/ready{query(audience=audiences[1])}&timeout=-1", None),
            ("POST", f"/token/refresh{query(audience=audiences[2])}", b"not json"),
            ("POST", f"/providers/orders/token/refresh{query(audience=audiences[3])}&timeout=0", b"{}"),
            ("GET", f"/token/ready{query(audience=audiences[4])}&after=1&after=2", None),
            ("POST", f"/token/refresh{query(audience=audiences[5])}", b'{"rejected_version": "1"}'),
        ]
        for method, path, body in refused:
            status, _, payload = broker.request(method, path, body=body)
            assert status == 400 and json.loads(payload)["error"] == "invalid_request", (path, status, payload)
        assert template_readiness(broker)["children"] == 0
        assert [r for r in issuer.token_requests(since=started) if set(r["audience"]) & set(audiences)] == []
        # All of maxChildren is left for requests that are answered.
        for audience in audiences[:3]:
            assert token_for(broker, route="token/ready", audience=audience)["version"] >= 1
        assert template_readiness(broker)["children"] == 3


def test_a_child_whose_first_fetch_fails_answers_503_after_waiting_then_recovers(issuer):
    config = {"maxWaitSec": 3, "providers": [oauth_template(issuer)]}
    with Broker(config) as broker:
        issuer.fault("5xx")
        try:
            status, headers, body = broker.request("GET", f"/providers/orders/token{query(audience=AUDIENCES[3])}", timeout=30)
            assert status == 503, body
            document = json.loads(body)
            assert document["error"] == "token_unavailable" and "server_error" in document["error_description"].replace(" ", "_")
            assert int(headers["retry-after"]) >= 1
            readiness = template_readiness(broker)
            assert readiness["children"] == 1 and readiness["ready"] == 0
            assert broker.request("GET", "/readyz", listener="admin")[0] == 200, \
                "a child made by a request, failing, does not make the broker unready"
        finally:
            issuer.fault("none")
        # The child retries on its own policy (maxErrorTokenRefreshDelayMsec 500 ms).
        assert wait_until(lambda: broker.request("GET", f"/providers/orders/token{query(audience=AUDIENCES[3])}")[0] == 200,
                          timeout=20)
        body = token_for(broker, audience=AUDIENCES[3])
        assert issuer.issued()[sha256(body["access_token"])]["audience"] == [AUDIENCES[3]]
        assert template_readiness(broker)["ready"] == 1


def test_idle_children_are_dropped_with_their_tokens_and_a_read_one_and_a_sink_s_one_stay(issuer, tmp_path):
    """The one slow test: childIdleSec is at least 60 s."""
    sinks = tmp_path / "sinks"
    sinks.mkdir(mode=0o700)
    sink_audience = AUDIENCES[9]
    config = {"providers": [oauth_template(issuer, childIdleSec=60)],
              "sinks": [{"provider": "orders", "audience": sink_audience, "path": str(sinks / "orders.token"),
                         "format": "token", "mode": "0600"}]}
    started = time.time()
    with Broker(config) as broker:
        assert wait_until(lambda: (sinks / "orders.token").exists(), timeout=20)
        idle = token_for(broker, audience=AUDIENCES[0])
        read = token_for(broker, audience=AUDIENCES[1])
        assert template_readiness(broker)["children"] == 3
        assert broker.metric("token_broker_template_children", provider="orders") == 3

        stop = threading.Event()

        def keep_reading():
            while not stop.wait(5):
                broker.request("GET", f"/providers/orders/token{query(audience=AUDIENCES[1])}")

        reader = threading.Thread(target=keep_reading, daemon=True)
        reader.start()
        try:
            assert wait_until(lambda: template_readiness(broker)["children"] == 2, timeout=150, interval=1), \
                "the unread child was not dropped"
        finally:
            stop.set()
            reader.join(30)
        assert broker.metric("token_broker_template_children", provider="orders") == 2
        assert broker.metric("token_broker_template_children_dropped_total", provider="orders") == 1
        # The child read every 5 s and the sink's child stayed, with their tokens: no new fetch.
        assert token_for(broker, audience=AUDIENCES[1])["access_token"] == read["access_token"]
        sink_token = (sinks / "orders.token").read_text()
        assert token_for(broker, audience=sink_audience)["access_token"] == sink_token
        assert len(fetched_for(issuer, started, audience=sink_audience)) == 1
        assert len(fetched_for(issuer, started, audience=AUDIENCES[1])) == 1
        # The dropped child's token went with it: the next request fetches anew.
        again = token_for(broker, audience=AUDIENCES[0])
        assert again["access_token"] != idle["access_token"]
        assert len(fetched_for(issuer, started, audience=AUDIENCES[0])) == 2
        assert template_readiness(broker)["children"] == 3


# Caller keys

def test_a_caller_allowed_a_template_reads_its_children_and_another_gets_403_without_making_one(issuer, tmp_path):
    allowed, other = "caller-" + secrets.token_hex(16), "caller-" + secrets.token_hex(16)
    keys = tmp_path / "callers.json"
    keys.write_text(json.dumps({"keys": [
        {"name": "orders-app", "sha256": sha256(allowed), "providers": ["orders"]},
        {"name": "plain-app", "sha256": sha256(other), "providers": ["plain"]},
    ]}))
    config = {"clientKeysFile": str(keys), "providers": [oauth_template(issuer, maxChildren=1), {"name": "plain"}]}
    with Broker(config) as broker:
        started = time.time()
        path = f"/providers/orders/token{query(audience=AUDIENCES[4])}"
        status, _, body = broker.request("GET", path, headers={"Authorization": f"Bearer {other}"})
        assert status == 403 and json.loads(body)["error"] == "provider_not_allowed"
        status, _, body = broker.request("GET", path)
        assert status == 401 and json.loads(body)["error"] == "missing_caller_key"
        assert issuer.token_requests(since=started) == [] and template_readiness(broker)["children"] == 0, \
            "a caller not allowed the template makes no child (maxChildren is 1 here)"
        status, _, body = broker.request("GET", path, headers={"Authorization": f"Bearer {allowed}"}, timeout=70)
        assert status == 200, body
        assert issuer.issued()[sha256(json.loads(body)["access_token"])]["audience"] == [AUDIENCES[4]]


# Configuration

@pytest.mark.parametrize("change,key", [
    ({"perRequest": ["audience"]}, "allowedAudiences"),
    ({"perRequest": ["tenant"], "allowedAudiences": ["a"]}, "perRequest"),
    ({"perRequest": [], "allowedAudiences": ["a"]}, "perRequest"),
    ({"perRequest": ["audience"], "allowedAudiences": ["*"]}, "allowedAudiences"),
    ({"perRequest": ["audience"], "allowedAudiences": []}, "allowedAudiences"),
    ({"perRequest": ["audience"], "allowedAudiences": ["a*b"]}, "allowedAudiences"),
    ({"perRequest": ["audience"], "allowedAudiences": ["a"], "allowedScopes": ["read"]}, "allowedScopes"),
    ({"perRequest": ["audience"], "allowedAudiences": ["a"], "maxChildren": 0}, "maxChildren"),
    ({"perRequest": ["audience"], "allowedAudiences": ["a"], "maxChildren": 10001}, "maxChildren"),
    ({"perRequest": ["audience"], "allowedAudiences": ["a"], "childIdleSec": 59}, "childIdleSec"),
    ({"perRequest": ["audience"], "allowedAudiences": ["a"], "childIdleSec": 86401}, "childIdleSec"),
    ({"maxChildren": 5}, "maxChildren"),
    ({"source": {"type": "file", "path": "/dev/null"}, "perRequest": ["audience"], "allowedAudiences": ["a"]}, "perRequest"),
    ({"source": {"type": "jwt"}, "perRequest": ["resource"], "allowedResources": ["https://a.example/"]}, "resource"),
])
def test_a_bad_template_configuration_is_refused_at_start_naming_the_key(tmp_path, change, key):
    provider = {"name": "t", "source": {"type": "oauth2", "tokenURL": "http://127.0.0.1:9/token", "clientID": "c",
                                        "clientSecret": "s"}, **change}
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"providers": [provider]}))
    for args in (["--check-config", "--config", str(path)], ["--config", str(path)]):
        result = run_broker(*args, env={"TOKEN_BROKER_LISTEN": "127.0.0.1:0", "TOKEN_BROKER_ADMIN_LISTEN": "127.0.0.1:0"})
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert key in result.stderr, result.stderr


@pytest.mark.parametrize("url,per_request", [
    ("http://127.0.0.1:9/token?aud={{tenant}}", ["audience"]),
    ("http://127.0.0.1:9/token?aud={{audience", ["audience"]),
    ("http://127.0.0.1:9/token?res={{resource}}", ["audience"]),
])
def test_an_http_source_s_unknown_or_unrequested_placeholder_is_refused_naming_the_key(tmp_path, url, per_request):
    provider = {"name": "t", "perRequest": per_request, "allowedAudiences": ["a"], "source": {"type": "http", "url": url}}
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"providers": [provider]}))
    result = run_broker("--check-config", "--config", str(path))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "providers[0].source.url" in result.stderr, result.stderr


def test_a_proxy_cannot_use_a_template(tmp_path, issuer):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"providers": [oauth_template(issuer)],
                                "proxies": [{"name": "orders-api", "target": "http://127.0.0.1:9/api"}]}))
    result = run_broker("--check-config", "--config", str(path))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "proxies[0]" in result.stderr, result.stderr


def test_a_good_template_configuration_passes_the_check(tmp_path, issuer):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"providers": [oauth_template(issuer, per_request=("audience", "scope", "resource"),
                                                             maxChildren=10000, childIdleSec=86400)]}))
    result = run_broker("--check-config", "--config", str(path))
    assert result.returncode == 0, result.stderr


# Templates that callers without a secret can fill

def signer_template(name, per_request, max_children=100, **allowed):
    """A local-signer template (no upstream to contact) taking `per_request`, with `allowed`
    (allowedAudiences=[…], allowedScopes=[…]) and `max_children`."""
    return {"name": name, "perRequest": list(per_request), "maxChildren": max_children, "source": {"type": "jwt"},
            **allowed}


def template_warnings(stderr):
    """The broker's warnings about templates that callers without a secret can fill:
    `level=warn msg=template problem="template \"NAME\": …"`."""
    return [line for line in stderr.splitlines() if " level=warn " in line and " msg=template " in line]


def checked(tmp_path, config):
    """--check-config of `config`, which must pass; its template warnings."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    result = run_broker("--check-config", "--config", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    return template_warnings(result.stderr)


SEVEN_SCOPES = [f"scope{index}" for index in range(7)]  # 2^7 - 1 = 127 scope sets


def test_check_config_warns_of_a_template_any_client_can_fill_without_a_key(tmp_path):
    """Without clientKeysFile, the token listener's routes take no key: a template whose
    allow-lists admit more combinations than maxChildren can be filled by any local client, and
    every other caller then gets too_many_children for a new one."""
    prefixed = checked(tmp_path, {"providers": [
        signer_template("orders", ["audience"], allowedAudiences=["https://api.example/*"])]})
    assert len(prefixed) == 1, prefixed
    line = prefixed[0]
    assert r'template \"orders\": its allow-lists admit unboundedly many combinations of values' in line, line
    assert "allowedAudiences" in line and "more than its maxChildren (100)" in line, line
    assert "the token listener's routes (no clientKeysFile" in line, line
    assert "503 too_many_children for up to childIdleSec (3600 s)" in line, line
    assert "Allow exact values only" in line and "raise maxChildren" in line, line
    # 7 exact scope tokens: 127 sets, and the request that names none (the template's default):
    # 128 children against maxChildren.
    for max_children, warned in [(127, True), (128, False)]:
        warnings = checked(tmp_path, {"providers": [
            signer_template("apis", ["scope"], max_children, allowedScopes=SEVEN_SCOPES)]})
        assert len(warnings) == warned, (max_children, warnings)
        assert all("admit 128 combinations" in line and f"maxChildren ({max_children})" in line
                   for line in warnings), warnings


def test_a_template_behind_caller_keys_is_not_warned_about_unless_a_protocol_serves_it(tmp_path):
    keys = tmp_path / "callers.json"
    keys.write_text(json.dumps({"keys": [
        {"name": "app", "sha256": sha256("caller-" + secrets.token_hex(16)), "providers": ["*"]}]}))
    orders = signer_template("orders", ["audience"], allowedAudiences=["https://api.example/*"])
    assert checked(tmp_path, {"clientKeysFile": str(keys), "providers": [orders]}) == []
    # compat.gce's token route takes no key: its template's 127 scope sets (it always names a set) count.
    for max_children, warned in [(100, True), (127, False)]:
        gcp = signer_template("gcp", ["scope"], max_children, allowedScopes=SEVEN_SCOPES)
        warnings = checked(tmp_path, {
            "clientKeysFile": str(keys), "providers": [orders, gcp],
            "compat": {"gce": {"provider": "gcp", "projectId": "p", "serviceAccountEmail": "a@p",
                               "scopes": ["scope0"], "listen": "127.0.0.1:9"}}})
        assert len(warnings) == warned, (max_children, warnings)
        assert all(r'template \"gcp\"' in line and "admit 127 combinations" in line
                   and "no secret: compat.gce's token route." in line for line in warnings), warnings


def test_the_combinations_warned_about_at_start_are_the_children_a_client_without_a_key_can_make():
    # read, write, "read write" and none (the template's default): 4 children, 1 more than maxChildren.
    config = {"providers": [signer_template("orders", ["scope"], 3, allowedScopes=["read", "write"])]}
    with Broker(config) as broker:
        warnings = template_warnings(broker.stderr())
        assert len(warnings) == 1 and "admit 4 combinations" in warnings[0], broker.stderr()
        for values in ({}, {"scope": "read"}, {"scope": "write"}):
            token_for(broker, **values)
        for scope in ("read write", "write read"):
            status, _, body = broker.request("GET", f"/providers/orders/token{query(scope=scope)}")
            assert status == 503 and json.loads(body)["error"] == "too_many_children", (scope, status, body)
    config["providers"][0]["maxChildren"] = 4
    with Broker(config) as broker:
        assert template_warnings(broker.stderr()) == [], broker.stderr()
