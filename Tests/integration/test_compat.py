"""Stock cloud SDKs get their tokens from the broker unchanged: the compatibility protocols.

What this proves, against the real `token-broker` binary with the real OAuth server
(django-oauth-toolkit, issuers/oauth_server.py) as the upstream:

- google-auth (pinned in requirements.txt), pointed at the broker by `GCE_METADATA_HOST` and
  `GCE_METADATA_IP` alone, finds the configured project with `google.auth.default(scopes=…)`,
  refreshes to the broker's token for those scopes (the issuer saw that scope: the token is
  traced back to its request by its SHA-256), and `id_token.fetch_id_token` returns a JWT for the
  audience, verified by PyJWT against the broker's JWKS;
- azure-identity with msal (pinned), pointed at the broker by `IDENTITY_ENDPOINT` and
  `IDENTITY_HEADER` (App Service), then by `AZURE_POD_IDENTITY_AUTHORITY_HOST` (IMDS):
  `ManagedIdentityCredential().get_token(…)` returns the broker's token for the resource with the
  broker's expiry; a wrong identity header, and an unknown user-assigned identity, fail;
- the protocols' own guards, error statuses and headers, on the wire (http.client): they are
  what the SDKs rely on (`Metadata-Flavor` on every answer, 400 and never 404 for an unknown
  Azure identity) and what keeps them safe (403 without `Metadata-Flavor`, 401 without the
  identity header, no fetch for a value outside an allow-list); caller keys do not apply; each
  protocol can have a listener of its own; the expiry margins of the SDKs are kept.

The SDKs read their environment at import time, so each SDK scenario runs in a subprocess of
this virtual environment's Python, with an environment built from nothing but PATH, HOME,
NO_PROXY and the protocol's variables; it prints its results as JSON, and the assertions are
made here. Only 127.0.0.1 is contacted; every subprocess, wait and loop is bounded.
"""
import calendar
import hashlib
import http.client
import json
import os
import re
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from urllib.parse import quote

import jwt
import pytest

from broker import Broker, run_broker
from issuers.process import OAuthServer

SECRET = "compat-secret-for-tests"
# Far above the SDKs' margins (225 s for google-auth, 300 s for msal): no test meets a refresh
# it did not ask for.
LIFETIME = 3600
PROJECT = "compat-project"
NUMERIC_PROJECT = "123456789012"
EMAIL = "broker@compat-project.iam.gserviceaccount.com"
# The issuer (django-oauth-toolkit) knows the scopes read, write and api only; Google's scope
# names are opaque to the broker and to google-auth alike.
ACCOUNT_SCOPES = ["api"]
AUDIENCE = "https://run.example/orders"
OTHER_AUDIENCE = "https://run.example/billing"
VAULT = "https://vault.azure.net"
USER_CLIENT_ID = "11111111-2222-3333-4444-555555555555"
USER_OBJECT_ID = "66666666-7777-8888-9999-000000000000"
USER_RESOURCE_ID = "/subscriptions/0/resourceGroups/rg/providers/Microsoft.ManagedIdentity/userAssignedIdentities/orders"
UNKNOWN_CLIENT_ID = "99999999-9999-9999-9999-999999999999"
GOOGLE = {"Metadata-Flavor": "Google"}
ACCOUNT = "/computeMetadata/v1/instance/service-accounts"
IMDS = "/metadata/identity/oauth2/token"
SUBPROCESS_TIMEOUT = 180


# The upstream, the configuration, the broker

@pytest.fixture(scope="module")
def issuer(tmp_path_factory):
    server = OAuthServer(str(tmp_path_factory.mktemp("compat")), {"compat": SECRET}, lifetime=LIFETIME)
    yield server
    server.close()


@pytest.fixture
def identity_header(tmp_path):
    """The App Service secret, in a file with a trailing newline (which the broker drops)."""
    secret = secrets.token_urlsafe(24)
    path = tmp_path / "identity-header"
    path.write_text(secret + "\n")
    path.chmod(0o600)
    return secret, str(path)


def oauth_template(issuer, name, per_request, allowed_key, allowed):
    return {"name": name, "perRequest": [per_request], allowed_key: allowed, "maxErrorTokenRefreshDelayMsec": 500,
            "source": {"type": "oauth2", "tokenURL": issuer.base + "/o/token/", "clientID": "compat",
                       "clientSecret": SECRET, "scope": "api"}}


def signer_template(name, per_request, allowed_key, allowed, key_file, lifetime=LIFETIME):
    return {"name": name, "perRequest": [per_request], allowed_key: allowed,
            "source": {"type": "jwt", "keyFile": key_file, "lifetimeSec": lifetime}}


def compat_config(issuer, tmp_key, header_file, gce=None, azure=None, id_lifetime=LIFETIME, user_lifetime=LIFETIME, **top):
    """Four templates and both protocols on the token listener:

    - `gcp`: the OAuth server, a child per scope set (GCE access tokens);
    - `gcp-id`: the local signer, a child per audience (GCE identity tokens), of two exact ones:
      with a prefix, a client of the routes could fill it (start and `--check-config` warn);
    - `azure`: the OAuth server, a child per resource (the system-assigned identity);
    - `azure-user`: the local signer, a child per scope set (a user-assigned identity), so that a
      resource reaches it as the scope `R/.default`.

    With `header_file` (None: none), App Service's route is served, and IMDS's only with
    `azure={"imds": True}`.
    """
    key = tmp_key("ec")
    return {
        "providers": [
            oauth_template(issuer, "gcp", "scope", "allowedScopes", ["read", "write", "api"]),
            signer_template("gcp-id", "audience", "allowedAudiences", [AUDIENCE, OTHER_AUDIENCE], key, id_lifetime),
            oauth_template(issuer, "azure", "resource", "allowedResources", [VAULT, "https://management.azure.com"]),
            signer_template("azure-user", "scope", "allowedScopes", [VAULT + "/.default"], key, user_lifetime),
        ],
        "compat": {
            "gce": {"provider": "gcp", "identityProvider": "gcp-id", "projectId": PROJECT,
                    "numericProjectId": NUMERIC_PROJECT, "serviceAccountEmail": EMAIL, "scopes": ACCOUNT_SCOPES,
                    "universeDomain": "googleapis.com", **(gce or {})},
            "azure": {"identities": [{"provider": "azure"},
                                     {"provider": "azure-user", "clientId": USER_CLIENT_ID, "objectId": USER_OBJECT_ID,
                                      "resourceId": USER_RESOURCE_ID}],
                      **({"identityHeaderFile": header_file} if header_file else {}), **(azure or {})},
        },
        **top,
    }


def listener_address(broker, name, timeout=15):
    """The address a protocol's own listener logged (`msg=listening listener=NAME address=…`)."""
    pattern = re.compile(rf"msg=listening listener={name} address=(\S+)")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = pattern.search(broker.stderr())
        if found:
            return found.group(1)
        time.sleep(0.02)
    raise AssertionError(f"no `listener={name}` line in {timeout}s:\n{broker.stderr()}")


def call(address, path, method="GET", headers=None, timeout=70):
    """One request, without the broker's request guard: (status, headers with lower-case names, body)."""
    host, _, port = address.rpartition(":")
    connection = http.client.HTTPConnection(host.strip("[]"), int(port), timeout=timeout)
    try:
        connection.request(method, path, headers=headers or {})
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


def google(address, path, expect=200, **kwargs):
    """A GCE metadata request with `Metadata-Flavor: Google`; checks the status and the header every answer carries."""
    headers = {**GOOGLE, **kwargs.pop("headers", {})}
    status, answer_headers, body = call(address, path, headers=headers, **kwargs)
    assert status == expect, (path, status, body)
    assert answer_headers.get("metadata-flavor") == "Google", (path, answer_headers)
    assert answer_headers.get("content-type"), (path, answer_headers)
    return answer_headers, body


def azure(address, path, expect=200, headers=None):
    status, answer_headers, body = call(address, path, headers=headers or {})
    assert status == expect, (path, status, body)
    assert answer_headers.get("content-type", "").startswith("application/json"), (path, answer_headers)
    return json.loads(body)


def msi(resource=VAULT, **values):
    """An App Service path: `/msi/token?api-version=2019-08-01&resource=R&…`."""
    values = {"api-version": "2019-08-01", "resource": resource, **values}
    return "/msi/token?" + "&".join(f"{k}={quote(v, safe='')}" for k, v in values.items() if v is not None)


def imds(resource=VAULT, **values):
    """An IMDS path: `/metadata/identity/oauth2/token?api-version=2018-02-01&resource=R&…`."""
    values = {"api-version": "2018-02-01", "resource": resource, **values}
    return IMDS + "?" + "&".join(f"{k}={quote(v, safe='')}" for k, v in values.items() if v is not None)


def sha256(text):
    return hashlib.sha256(text.encode()).hexdigest()


def epoch(rfc3339):
    return calendar.timegm(time.strptime(rfc3339, "%Y-%m-%dT%H:%M:%SZ"))


def broker_child(broker, provider, **values):
    """The broker's own `/providers/{provider}/token?…` answer for a template's child."""
    path = f"/providers/{provider}/token?" + "&".join(f"{k}={quote(v, safe='')}" for k, v in values.items())
    return broker.get_json(path, timeout=70)[0]


def verifier(address):
    """verify(token, audience) -> claims, checked by PyJWT against the broker's JWKS."""
    status, _, body = call(address, "/.well-known/jwks.json")
    assert status == 200, body
    keys = {key["kid"]: jwt.PyJWK(key) for key in json.loads(body)["keys"]}

    def verify(token, audience):
        key = keys[jwt.get_unverified_header(token)["kid"]]
        return jwt.decode(token, key.key, algorithms=["ES256"], audience=audience, issuer="token-broker",
                          options={"require": ["exp", "iat", "aud", "iss"]})

    return verify


# The SDKs, each in a subprocess of its own

GOOGLE_SCRIPT = r"""
import datetime, json, sys
arguments = json.loads(sys.argv[1])
result = {}
try:
    import google.auth
    import google.auth.transport.requests
    from google.oauth2 import id_token
    request = google.auth.transport.requests.Request()
    if arguments.get("default", True):
        credentials, project = google.auth.default(scopes=arguments.get("scopes"))
        credentials.refresh(request)
        result.update(project=project, token=credentials.token, email=credentials.service_account_email,
                      expiry=credentials.expiry.replace(tzinfo=datetime.timezone.utc).timestamp(),
                      universe_domain=credentials.universe_domain,
                      kind=type(credentials).__module__ + "." + type(credentials).__name__)
    if arguments.get("audience"):
        result["id_token"] = id_token.fetch_id_token(request, arguments["audience"])
except Exception as error:
    result = {"error": type(error).__name__, "message": str(error)}
print(json.dumps(result))
"""

AZURE_SCRIPT = r"""
import json, sys
arguments = json.loads(sys.argv[1])
try:
    from azure.identity import ManagedIdentityCredential
    options = {"client_id": arguments["client_id"]} if arguments.get("client_id") else {}
    credential = ManagedIdentityCredential(**options)
    token = credential.get_token(arguments["scope"])
    result = {"token": token.token, "expires_on": token.expires_on,
              "kind": type(getattr(credential, "_credential", None)).__name__}
except Exception as error:
    result = {"error": type(error).__name__, "message": str(error)}
print(json.dumps(result))
"""


def run_sdk(script, variables, arguments):
    """Runs `script` in this venv's Python with only PATH, HOME, NO_PROXY and `variables` set;
    returns the JSON it printed last. The script catches the SDK's exceptions and prints them as
    {"error", "message"}: a subprocess that fails otherwise (an import error) fails the test."""
    with tempfile.TemporaryDirectory(prefix="token-broker-sdk-home-") as home:
        environment = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": home,
                       "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost", **variables}
        result = subprocess.run([sys.executable, "-c", script, json.dumps(arguments)], env=environment, cwd=home,
                                capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT)
    assert result.returncode == 0 and result.stdout.strip(), (result.returncode, result.stdout, result.stderr)
    return json.loads(result.stdout.strip().splitlines()[-1])


def google_sdk(address, **arguments):
    return run_sdk(GOOGLE_SCRIPT, {"GCE_METADATA_HOST": address, "GCE_METADATA_IP": address}, arguments)


def app_service_sdk(address, header, **arguments):
    variables = {"IDENTITY_ENDPOINT": f"http://{address}/msi/token", "IDENTITY_HEADER": header}
    return run_sdk(AZURE_SCRIPT, variables, {"scope": VAULT + "/.default", **arguments})


def imds_sdk(address, **arguments):
    return run_sdk(AZURE_SCRIPT, {"AZURE_POD_IDENTITY_AUTHORITY_HOST": f"http://{address}"},
                   {"scope": VAULT + "/.default", **arguments})


# google-auth

def test_google_auth_default_finds_the_project_and_refreshes_to_the_broker_s_token_for_its_scopes(issuer, tmp_key, identity_header):
    with Broker(compat_config(issuer, tmp_key, identity_header[1])) as broker:
        address = broker.addresses["token"]
        started = time.time()
        out = google_sdk(address, scopes=["read", "write"])
        assert "error" not in out, out
        assert out["kind"] == "google.auth.compute_engine.credentials.Credentials", out
        assert (out["project"], out["email"], out["universe_domain"]) == (PROJECT, EMAIL, "googleapis.com"), out
        # The issuer issued that token for that scope set, on the one request the broker made.
        [record] = issuer.token_requests(since=started)
        assert record["token_sha256"] == sha256(out["token"]), "the SDK holds the token the issuer issued"
        assert set(record["scope"][0].split()) == {"read", "write"} and len(record["scope"]) == 1, record
        assert issuer.get("/api/hello", out["token"]) == 200
        # The broker's own answer for that child is the same token, and the SDK's expiry is the broker's.
        child = broker_child(broker, "gcp", scope="write read")
        assert child["access_token"] == out["token"]
        assert abs(out["expiry"] - epoch(child["expires_at"])) <= 60, (out["expiry"], child["expires_at"])

        # Without scopes, google-auth asks for the account's scopes, read from the metadata server.
        started = time.time()
        plain = google_sdk(address)
        assert "error" not in plain, plain
        [record] = issuer.token_requests(since=started)
        assert record["token_sha256"] == sha256(plain["token"]) and record["scope"] == ACCOUNT_SCOPES, record


def test_google_fetch_id_token_returns_a_jwt_for_the_audience_verified_with_the_broker_s_jwks(issuer, tmp_key, identity_header):
    with Broker(compat_config(issuer, tmp_key, identity_header[1])) as broker:
        address = broker.addresses["token"]
        started = time.time()
        out = google_sdk(address, default=False, audience=AUDIENCE)
        assert "error" not in out, out
        verify = verifier(address)
        claims = verify(out["id_token"], AUDIENCE)
        assert claims["aud"] == AUDIENCE
        with pytest.raises(jwt.InvalidAudienceError):
            verify(out["id_token"], OTHER_AUDIENCE)
        assert broker_child(broker, "gcp-id", audience=AUDIENCE)["access_token"] == out["id_token"]
        assert issuer.token_requests(since=started) == [], "identity tokens come from the local signer"
        # Another audience, another child.
        other = google_sdk(address, default=False, audience=OTHER_AUDIENCE)
        assert verify(other["id_token"], OTHER_AUDIENCE)["aud"] == OTHER_AUDIENCE


# azure-identity

def test_azure_managed_identity_in_app_service_mode_gets_the_broker_s_token_and_expiry(issuer, tmp_key, identity_header):
    secret, header_file = identity_header
    with Broker(compat_config(issuer, tmp_key, header_file)) as broker:
        address = broker.addresses["token"]
        started = time.time()
        out = app_service_sdk(address, secret)
        assert "error" not in out, out
        assert out["kind"] == "AppServiceCredential", out
        [record] = issuer.token_requests(since=started)
        assert record["token_sha256"] == sha256(out["token"]) and record["resource"] == [VAULT], record
        child = broker_child(broker, "azure", resource=VAULT)
        assert child["access_token"] == out["token"]
        assert abs(out["expires_on"] - epoch(child["expires_at"])) <= 60, (out["expires_on"], child["expires_at"])
        # On the wire: expires_on is the token's expiry, exactly, as an integer.
        document = azure(address, msi(), headers={"X-IDENTITY-HEADER": secret})
        assert document["access_token"] == out["token"] and document["resource"] == VAULT
        assert document["token_type"] == "Bearer"
        assert type(document["expires_on"]) is int and document["expires_on"] == epoch(child["expires_at"]), document


def test_azure_managed_identity_in_imds_mode_gets_the_broker_s_token_and_expiry(issuer, tmp_key):
    # IMDS as deployed: no identityHeaderFile, so IMDS is served by default.
    with Broker(compat_config(issuer, tmp_key, None)) as broker:
        address = broker.addresses["token"]
        started = time.time()
        out = imds_sdk(address)
        assert "error" not in out, out
        assert out["kind"] == "ImdsCredential", out
        [record] = issuer.token_requests(since=started)
        assert record["token_sha256"] == sha256(out["token"]) and record["resource"] == [VAULT], record
        child = broker_child(broker, "azure", resource=VAULT)
        assert child["access_token"] == out["token"]
        assert abs(out["expires_on"] - epoch(child["expires_at"])) <= 60, (out["expires_on"], child["expires_at"])
        document = azure(address, imds(), headers={"Metadata": "true"})
        assert document["access_token"] == out["token"] and document["resource"] == VAULT
        assert document["token_type"] == "Bearer"
        assert type(document["expires_in"]) is int and 0 < document["expires_in"] <= LIFETIME, document
        assert type(document["expires_on"]) is int and document["expires_on"] == epoch(child["expires_at"]), document


def test_a_full_template_fails_an_azure_sdk_within_its_own_retries_not_after_the_children_s_idle_time(issuer, tmp_key):
    """A template with `maxChildren` children says, on the broker's own route, when its earliest
    child can be dropped: up to `childIdleSec`, an hour here. azure-core sleeps for whatever
    `Retry-After` says, so the SDK asking the full template hung for that hour (one request,
    then nothing). The protocols' answers now say at most 5 s: the SDK retries and fails with
    the broker's words. The metadata server's answer is capped the same way."""
    config = compat_config(issuer, tmp_key, None)
    for template in config["providers"]:
        if template["name"] in ("azure", "gcp"):
            template["maxChildren"] = 1
    with Broker(config) as broker:
        address = broker.addresses["token"]
        azure(address, imds(resource="https://management.azure.com"), headers={"Metadata": "true"})
        google(address, f"{ACCOUNT}/default/token?scopes=read")
        for path, headers in [(imds(), {"Metadata": "true"}), (f"{ACCOUNT}/default/token?scopes=write", GOOGLE)]:
            status, answer_headers, body = call(address, path, headers=headers)
            assert status == 503 and json.loads(body)["error"] == "too_many_children", (path, status, body)
            assert 1 <= int(answer_headers["retry-after"]) <= 5, (path, answer_headers)
        status, answer_headers, body = broker.request("GET", "/providers/azure/token?resource=" + quote(VAULT, safe=""))
        assert status == 503 and json.loads(body)["error"] == "too_many_children", body
        assert int(answer_headers["retry-after"]) > 3000, "the broker's own route says the real wait"
        before = broker.metric("token_broker_http_requests_total", listener="token", route=IMDS, code="503")
        out = imds_sdk(address)  # within SUBPROCESS_TIMEOUT, or the subprocess times out and the test fails
        assert out.get("error") and "too_many_children" in out["message"], out
        asked = broker.metric("token_broker_http_requests_total", listener="token", route=IMDS, code="503") - before
        assert asked >= 2, f"the SDK asked {asked} time(s): it did not retry"


def test_azure_imds_is_not_served_beside_app_service_s_secret_unless_asked_for(issuer, tmp_key, identity_header, tmp_path):
    """IMDS has no secret: served beside App Service's route, `Metadata: true` alone would get the
    tokens the secret guards. With `identityHeaderFile`, IMDS is 404 unless `imds` is true, and
    then `--check-config` warns."""
    secret, header_file = identity_header
    with Broker(compat_config(issuer, tmp_key, header_file)) as broker:
        address = broker.addresses["token"]
        started = time.time()
        status, _, body = call(address, imds(), headers={"Metadata": "true"})
        assert status == 404 and json.loads(body)["error"] == "not_found", (status, body)
        out = imds_sdk(address)
        assert "token" not in out and out.get("error"), out
        assert issuer.token_requests(since=started) == [], "nothing is fetched for a route not served"
        assert azure(address, msi(), headers={"X-IDENTITY-HEADER": secret})["access_token"]
    config = compat_config(issuer, tmp_key, header_file, azure={"imds": True})
    with Broker(config) as broker:
        address = broker.addresses["token"]
        assert azure(address, imds(), headers={"Metadata": "true"})["access_token"]
    result = run_broker("--check-config", "--config", write_config(tmp_path, config))
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if " level=warn " in line]
    assert any("compat.azure.imds" in line and "identityHeaderFile" in line for line in warnings), result.stderr
    assert secret not in result.stderr


def test_azure_a_wrong_identity_header_fails(issuer, tmp_key, identity_header):
    secret, header_file = identity_header
    with Broker(compat_config(issuer, tmp_key, header_file)) as broker:
        started = time.time()
        out = app_service_sdk(broker.addresses["token"], secret + "-wrong")
        assert "token" not in out and out.get("error"), out
        assert "401" in out["message"], out
        assert issuer.token_requests(since=started) == []


def test_azure_the_identity_header_is_compared_as_the_bytes_sent(issuer, tmp_key, tmp_path):
    """The secret is matched by its own bytes alone. HTTP lets a header value carry bytes that are
    not ASCII (obs-text); the secret's bytes followed by such a byte, or with its last character
    replaced by one, are not the secret."""
    secret = secrets.token_urlsafe(24)
    header_file = tmp_path / "identity-header"
    header_file.write_bytes(secret.encode() + b"\n")
    header_file.chmod(0o600)
    with Broker(compat_config(issuer, tmp_key, str(header_file))) as broker:
        address = broker.addresses["token"]
        started = time.time()
        for sent in (
            secret.encode() + b"\xff",  # a byte beyond ASCII after the secret
            secret[:-1].encode() + b"\xe9",  # the last character replaced by é in Latin-1
            secret[:-1].encode(),  # the secret cut short by a character
        ):
            document = azure(address, msi(), expect=401, headers={"X-IDENTITY-HEADER": sent})
            assert document.get("statusCode") == 401, (sent, document)
        assert issuer.token_requests(since=started) == [], "no refused request reaches the issuer"
        assert azure(address, msi(), headers={"X-IDENTITY-HEADER": secret.encode()})["access_token"]


@pytest.mark.parametrize("secret", [" padded-secret", "padded-secret ", "inner space", "tab\tsecret",
                                    "s\u00e9cret-beyond-ascii", "bell\x07secret"])
def test_an_identity_header_no_client_can_send_is_refused_at_start_without_printing_it(issuer, tmp_key, tmp_path, secret):
    header_file = tmp_path / "identity-header"
    header_file.write_bytes(secret.encode() + b"\n")
    header_file.chmod(0o600)
    config = compat_config(issuer, tmp_key, str(header_file))
    result = run_broker("--check-config", "--config", write_config(tmp_path, config))
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "identityHeaderFile" in result.stderr and "visible ASCII" in result.stderr, result.stderr
    assert secret.strip() not in result.stderr and secret.strip() not in result.stdout


def test_an_identity_header_shorter_than_16_bytes_is_refused_at_start_without_printing_it(issuer, tmp_key, tmp_path):
    """A local process may try secrets as fast as the broker answers: a short one would be found."""
    for secret, refused in [("Qz7", True), ("fifteen-bytes-Q", True), ("sixteen-bytes-Qz", False)]:
        header_file = tmp_path / "identity-header"
        header_file.write_bytes(secret.encode() + b"\n")
        header_file.chmod(0o600)
        result = run_broker("--check-config", "--config", write_config(tmp_path, compat_config(issuer, tmp_key, str(header_file))))
        assert result.returncode == (2 if refused else 0), (secret, result.stdout, result.stderr)
        assert ("is too short" in result.stderr and "at least 16 bytes" in result.stderr) == refused, result.stderr
        assert secret not in result.stderr + result.stdout


def test_azure_a_user_assigned_identity_by_client_id_works_and_an_unknown_one_fails(issuer, tmp_key, identity_header):
    secret, header_file = identity_header
    with Broker(compat_config(issuer, tmp_key, header_file, azure={"imds": True})) as broker:
        address = broker.addresses["token"]
        verify = verifier(address)
        for out in (app_service_sdk(address, secret, client_id=USER_CLIENT_ID), imds_sdk(address, client_id=USER_CLIENT_ID)):
            assert "error" not in out, out
            # The user-assigned identity's template takes scopes: the resource reached it as R/.default.
            claims = verify(out["token"], "token-broker")
            assert claims["scope"] == VAULT + "/.default", claims
            assert abs(out["expires_on"] - claims["exp"]) <= 60, (out["expires_on"], claims["exp"])
        document = azure(address, msi(client_id=USER_CLIENT_ID), headers={"X-IDENTITY-HEADER": secret})
        assert document["expires_on"] == verify(document["access_token"], "token-broker")["exp"], document
        started = time.time()
        for out in (app_service_sdk(address, secret, client_id=UNKNOWN_CLIENT_ID),
                    imds_sdk(address, client_id=UNKNOWN_CLIENT_ID)):
            assert "token" not in out and out.get("error"), out
        assert issuer.token_requests(since=started) == []


# The Google metadata routes on the wire

def test_gce_metadata_routes_answer_as_the_metadata_server_does(issuer, tmp_key, identity_header):
    with Broker(compat_config(issuer, tmp_key, identity_header[1])) as broker:
        address = broker.addresses["token"]
        headers, body = google(address, "/")
        assert headers["content-type"].startswith("text/plain") and body == b"computeMetadata/\n"
        for path, text in [("/computeMetadata/v1/project/project-id", PROJECT),
                           ("/computeMetadata/v1/project/numeric-project-id", NUMERIC_PROJECT),
                           ("/computeMetadata/v1/universe/universe-domain", "googleapis.com"),
                           (f"{ACCOUNT}/", f"default/\n{EMAIL}/\n")]:
            headers, body = google(address, path)
            assert headers["content-type"].startswith("text/plain") and body.decode() == text, (path, body)
        for account in ("default", EMAIL):
            headers, body = google(address, f"{ACCOUNT}/{account}/?recursive=true")
            assert headers["content-type"].startswith("application/json")
            assert json.loads(body) == {"aliases": ["default"], "email": EMAIL, "scopes": ACCOUNT_SCOPES}
            assert google(address, f"{ACCOUNT}/{account}/email")[1].decode() == EMAIL
            assert google(address, f"{ACCOUNT}/{account}/aliases")[1].decode().strip() == "default"
            assert google(address, f"{ACCOUNT}/{account}/scopes")[1].decode().split() == ACCOUNT_SCOPES
            listing = google(address, f"{ACCOUNT}/{account}/")[1].decode().split()
            assert set(listing) >= {"aliases", "email", "identity", "scopes", "token"}, listing
        # The token: a JSON number for expires_in, the same token under both account names.
        started = time.time()
        headers, body = google(address, f"{ACCOUNT}/default/token?scopes=read,api")
        assert headers["content-type"].startswith("application/json")
        document = json.loads(body)
        assert document["token_type"] == "Bearer" and type(document["expires_in"]) is int, document
        assert 0 < document["expires_in"] <= LIFETIME
        again = json.loads(google(address, f"{ACCOUNT}/{EMAIL}/token?scopes=api%2Cread")[1])
        assert again["access_token"] == document["access_token"], "one child for one scope set"
        [record] = issuer.token_requests(since=started)
        assert record["token_sha256"] == sha256(document["access_token"])
        assert set(record["scope"][0].split()) == {"read", "api"}
        # The identity token: the bare JWT, not JSON.
        headers, body = google(address, f"{ACCOUNT}/default/identity?audience={quote(AUDIENCE, safe='')}&format=full&licenses=FALSE")
        assert not headers["content-type"].startswith("application/json"), headers
        assert verifier(address)(body.decode(), AUDIENCE)["aud"] == AUDIENCE
        # HEAD is served as GET is, without a body.
        status, headers, body = call(address, "/computeMetadata/v1/project/project-id", method="HEAD", headers=GOOGLE)
        assert status == 200 and body == b"" and headers.get("metadata-flavor") == "Google"


def test_every_gce_answer_carries_metadata_flavor_and_a_content_type_and_errors_have_their_statuses(issuer, tmp_key, identity_header):
    with Broker(compat_config(issuer, tmp_key, identity_header[1])) as broker:
        address = broker.addresses["token"]
        started = time.time()
        for path, headers, method, expect, code in [
            ("/", {}, "GET", 403, "missing_metadata_flavor"),
            ("/computeMetadata/v1/project/project-id", {}, "GET", 403, "missing_metadata_flavor"),
            (f"{ACCOUNT}/default/token", {"Metadata-Flavor": "google-ish"}, "GET", 403, "missing_metadata_flavor"),
            (f"{ACCOUNT}/default/token", {**GOOGLE, "X-Forwarded-For": "203.0.113.9"}, "GET", 403, "forwarded_request"),
            (f"{ACCOUNT}/default/token", {**GOOGLE, "Forwarded": "for=203.0.113.9"}, "GET", 403, "forwarded_request"),
            ("/", {**GOOGLE, "forwarded": ""}, "GET", 403, "forwarded_request"),
            ("/computeMetadata/v1/project/attributes/ssh-keys", GOOGLE, "GET", 404, "not_found"),
            (f"{ACCOUNT}/someone-else@example.com/token", GOOGLE, "GET", 404, "not_found"),
            (f"{ACCOUNT}/default/identity", GOOGLE, "GET", 400, None),
            (f"{ACCOUNT}/default/token?scopes=admin", GOOGLE, "GET", 400, "value_not_allowed"),
            (f"{ACCOUNT}/default/token?scopes=read,admin", GOOGLE, "GET", 400, "value_not_allowed"),
            (f"{ACCOUNT}/default/identity?audience={quote('https://evil.example/x', safe='')}", GOOGLE, "GET", 400, "value_not_allowed"),
            (f"{ACCOUNT}/default/token", GOOGLE, "POST", 405, None),
            ("/computeMetadata/v1/project/project-id", GOOGLE, "DELETE", 405, None),
        ]:
            status, answer, body = call(address, path, method=method, headers=headers)
            assert status == expect, (method, path, headers, status, body)
            assert answer.get("metadata-flavor") == "Google", (path, answer)
            assert answer.get("content-type", "").startswith("application/json"), (path, answer)
            document = json.loads(body)
            if code:
                assert document["error"] == code, (path, document)
            if status == 405:
                assert "GET" in answer.get("allow", ""), answer
        assert issuer.token_requests(since=started) == [], "a refused scope never causes a fetch"
    # An unconfigured optional route is 404, with the header too (google-auth reads 404 as googleapis.com).
    config = compat_config(issuer, tmp_key, identity_header[1])
    for key in ("numericProjectId", "universeDomain", "identityProvider"):
        del config["compat"]["gce"][key]
    with Broker(config) as broker:
        address = broker.addresses["token"]
        for path in ("/computeMetadata/v1/project/numeric-project-id", "/computeMetadata/v1/universe/universe-domain",
                     f"{ACCOUNT}/default/identity?audience={quote(AUDIENCE, safe='')}"):
            google(address, path, expect=404)
        out = google_sdk(address, scopes=["read"])
        assert "error" not in out and out["universe_domain"] == "googleapis.com", out


def raw_status_and_headers(address, request):
    """Sends `request` (bytes) as it is and reads the answer's status and headers (lower-case names)."""
    host, _, port = address.rpartition(":")
    with socket.create_connection((host.strip("[]"), int(port)), timeout=30) as connection:
        connection.sendall(request)
        received = b""
        while b"\r\n\r\n" not in received:
            chunk = connection.recv(65536)
            if not chunk:
                break
            received += chunk
    head = received.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    headers = {}
    for line in head[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(head[0].split()[1]), headers


def test_a_head_refused_before_routing_carries_metadata_flavor_only_on_a_listener_of_its_own(issuer, tmp_key, identity_header):
    """The server refuses an ambiguous head (two `Host` headers) before any route sees the path:
    on the token listener it cannot tell a metadata request, and answers as the broker does; on
    `compat.gce.listen` every answer is the metadata server's, this one too (README: the routes)."""
    request = (f"GET {ACCOUNT}/default/token HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: 127.0.0.2\r\n"
               "Metadata-Flavor: Google\r\n\r\n").encode()
    with Broker(compat_config(issuer, tmp_key, identity_header[1], gce={"listen": "127.0.0.1:0"})) as broker:
        status, headers = raw_status_and_headers(listener_address(broker, "gce"), request)
        assert status == 400 and headers.get("metadata-flavor") == "Google", (status, headers)
        status, headers = raw_status_and_headers(broker.addresses["token"], request)
        assert status == 400 and "metadata-flavor" not in headers, (status, headers)


def test_repeated_compat_requests_are_served_from_one_fetch_per_child(issuer, tmp_key, identity_header):
    secret, header_file = identity_header
    with Broker(compat_config(issuer, tmp_key, header_file, azure={"imds": True})) as broker:
        address = broker.addresses["token"]
        started = time.time()
        google_tokens = {json.loads(google(address, f"{ACCOUNT}/default/token?scopes=write")[1])["access_token"]
                         for _ in range(20)}
        azure_tokens = {azure(address, msi(), headers={"X-IDENTITY-HEADER": secret})["access_token"] for _ in range(10)}
        azure_tokens |= {azure(address, imds(), headers={"Metadata": "true"})["access_token"] for _ in range(10)}
        assert len(google_tokens) == 1 and len(azure_tokens) == 1
        records = issuer.token_requests(since=started)
        assert len(records) == 2, records
        assert {sha256(next(iter(google_tokens))), sha256(next(iter(azure_tokens)))} == {r["token_sha256"] for r in records}


# The Azure managed identity routes on the wire

def test_azure_refusals_have_their_statuses_in_azure_s_error_shape_and_never_fetch(issuer, tmp_key, identity_header):
    secret, header_file = identity_header
    header = {"X-IDENTITY-HEADER": secret}
    metadata = {"Metadata": "true"}
    with Broker(compat_config(issuer, tmp_key, header_file, azure={"imds": True})) as broker:
        address = broker.addresses["token"]
        started = time.time()
        for path, headers, expect, code in [
            (msi(), {}, 401, None),
            (msi(), {"X-IDENTITY-HEADER": secret + "x"}, 401, None),
            (msi(), {"X-IDENTITY-HEADER": secret[:-1]}, 401, None),
            (imds(), {}, 400, None),
            (imds(), {"Metadata": "false"}, 400, None),
            (msi(client_id=UNKNOWN_CLIENT_ID), header, 400, "identity_not_found"),
            (msi(object_id=UNKNOWN_CLIENT_ID), header, 400, "identity_not_found"),
            (msi(mi_res_id=USER_RESOURCE_ID + "-other"), header, 400, "identity_not_found"),
            (imds(client_id=UNKNOWN_CLIENT_ID), metadata, 400, "identity_not_found"),
            (imds(object_id=UNKNOWN_CLIENT_ID), metadata, 400, "identity_not_found"),
            (imds(msi_res_id=USER_RESOURCE_ID + "-other"), metadata, 400, "identity_not_found"),
            (msi(client_id=USER_CLIENT_ID, object_id=USER_OBJECT_ID), header, 400, None),
            (imds(client_id=USER_CLIENT_ID, object_id=USER_OBJECT_ID), metadata, 400, None),
            (msi(**{"api-version": "2018-02-01"}), header, 400, None),
            (msi(**{"api-version": None}), header, 400, None),
            (imds(**{"api-version": "2019-08-01"}), metadata, 400, None),
            (msi(resource=None), header, 400, None),
            (imds(resource=None), metadata, 400, None),
            (msi(resource="https://evil.example"), header, 400, None),
            (imds(resource="https://evil.example"), metadata, 400, None),
            (msi(), {**header, "X-Forwarded-For": "203.0.113.9"}, 403, None),
            (msi(), {**header, "Forwarded": "for=203.0.113.9"}, 403, "forwarded_request"),
            (imds(), {**metadata, "FORWARDED": "for=203.0.113.9;proto=http"}, 403, "forwarded_request"),
        ]:
            document = azure(address, path, expect=expect, headers=headers)
            assert isinstance(document.get("error"), str) and isinstance(document.get("error_description"), str), document
            assert document.get("statusCode") == expect and isinstance(document.get("message"), str), (path, document)
            if code:
                assert document["error"] == code, (path, document)
        for path, headers in [(msi(), header), (imds(), metadata)]:
            status, answer, body = call(address, path, method="POST", headers=headers)
            assert status == 405 and "GET" in answer.get("allow", ""), (path, status, answer, body)
        assert issuer.token_requests(since=started) == [], "no refused request reaches the issuer"
        # The user-assigned identity by each of its names, in both protocols: one child, one token.
        tokens = {azure(address, msi(**names), headers=header)["access_token"]
                  for names in ({"client_id": USER_CLIENT_ID}, {"object_id": USER_OBJECT_ID}, {"mi_res_id": USER_RESOURCE_ID})}
        tokens |= {azure(address, imds(**names), headers=metadata)["access_token"]
                   for names in ({"client_id": USER_CLIENT_ID}, {"object_id": USER_OBJECT_ID}, {"msi_res_id": USER_RESOURCE_ID})}
        assert len(tokens) == 1, tokens
    # No system-assigned entry: a request naming no identity has none.
    config = compat_config(issuer, tmp_key, header_file, azure={"imds": True})
    config["compat"]["azure"]["identities"] = config["compat"]["azure"]["identities"][1:]
    with Broker(config) as broker:
        address = broker.addresses["token"]
        assert azure(address, msi(), expect=400, headers=header)["error"] == "identity_not_found"
        assert azure(address, imds(), expect=400, headers=metadata)["error"] == "identity_not_found"
        assert azure(address, msi(client_id=USER_CLIENT_ID), headers=header)["access_token"]
    # Without identityHeaderFile, /msi/token is not served.
    del config["compat"]["azure"]["identityHeaderFile"]
    with Broker(config) as broker:
        status, _, body = call(broker.addresses["token"], msi(client_id=USER_CLIENT_ID), headers=header)
        assert status == 404, (status, body)


# Guards that do not apply, listeners of their own

def test_caller_keys_and_the_request_guard_do_not_apply_to_the_compatibility_routes(issuer, tmp_key, identity_header, tmp_path):
    secret, header_file = identity_header
    key = "caller-" + secrets.token_hex(16)
    keys = tmp_path / "callers.json"
    keys.write_text(json.dumps({"keys": [{"name": "app", "sha256": sha256(key), "providers": ["*"]}]}))
    with Broker(compat_config(issuer, tmp_key, header_file, azure={"imds": True}, clientKeysFile=str(keys))) as broker:
        address = broker.addresses["token"]
        status, _, body = broker.request("GET", "/providers/gcp/token?scope=read")
        assert status == 401 and json.loads(body)["error"] == "missing_caller_key", "the token routes want a key"
        # No key, no Token-Broker-Request header: the protocols' own headers are their guards.
        assert json.loads(google(address, f"{ACCOUNT}/default/token?scopes=read")[1])["access_token"]
        assert azure(address, msi(), headers={"X-IDENTITY-HEADER": secret})["access_token"]
        assert azure(address, imds(), headers={"Metadata": "true"})["access_token"]
        # A key sent anyway changes nothing, and the SDKs (which send none) are served.
        assert json.loads(google(address, f"{ACCOUNT}/default/token?scopes=read",
                                 headers={"Authorization": "Bearer not-a-caller-key"})[1])["access_token"]
        out = google_sdk(address, scopes=["read"])
        assert "error" not in out, out


def test_each_protocol_can_have_a_listener_of_its_own(issuer, tmp_key, identity_header):
    secret, header_file = identity_header
    config = compat_config(issuer, tmp_key, header_file, gce={"listen": "127.0.0.1:0"}, azure={"listen": "127.0.0.1:0", "imds": True})
    with Broker(config) as broker:
        gce_address, azure_address = listener_address(broker, "gce"), listener_address(broker, "azure")
        token_address = broker.addresses["token"]
        assert len({gce_address, azure_address, token_address}) == 3
        assert google(gce_address, "/computeMetadata/v1/project/project-id")[1].decode() == PROJECT
        assert azure(azure_address, msi(), headers={"X-IDENTITY-HEADER": secret})["access_token"]
        assert azure(azure_address, imds(), headers={"Metadata": "true"})["access_token"]
        # Their paths are not on the token listener, nor on each other's.
        for address, path, headers in [(token_address, "/computeMetadata/v1/project/project-id", GOOGLE),
                                       (token_address, msi(), {"X-IDENTITY-HEADER": secret}),
                                       (token_address, imds(), {"Metadata": "true"}),
                                       (azure_address, "/computeMetadata/v1/project/project-id", GOOGLE),
                                       (gce_address, imds(), {"Metadata": "true", **GOOGLE})]:
            status, _, body = call(address, path, headers=headers)
            assert status == 404, (address, path, status, body)
        # The SDKs, pointed at those listeners.
        out = google_sdk(gce_address, scopes=["read"])
        assert "error" not in out and out["project"] == PROJECT, out
        out = app_service_sdk(azure_address, secret)
        assert "error" not in out, out


def test_a_protocols_own_listener_makes_room_near_the_connection_limit_and_counts_it(issuer, tmp_key, identity_header):
    """A listener of its own closes idle connections near `connectionLimit` as the token listener
    does, and token_broker_connections_evicted_total has its series (it had none: only the token
    and admin listeners' were registered)."""
    config = {**compat_config(issuer, tmp_key, identity_header[1], gce={"listen": "127.0.0.1:0"}), "connectionLimit": 16}
    with Broker(config) as broker:
        host, port = listener_address(broker, "gce").rsplit(":", 1)
        assert ("token_broker_connections_evicted_total", (("listener", "gce"),)) in broker.metrics()
        idle = []
        try:
            for _ in range(30):
                idle.append(socket.create_connection((host, int(port)), timeout=10))
                time.sleep(0.01)
            assert google(f"{host}:{port}", "/computeMetadata/v1/project/project-id")[1].decode() == PROJECT
        finally:
            for connection in idle:
                connection.close()
        assert broker.metric("token_broker_connections_evicted_total", listener="gce") >= 1


# The SDKs' expiry margins

def test_a_token_with_less_than_an_sdk_s_margin_left_is_renewed_before_it_is_served(issuer, tmp_key, identity_header):
    """google-auth treats a token with under 225 s left as expired, msal under 300 s. With
    lifetimes a little above those, after a few seconds the cached tokens are inside the margins:
    the compatibility routes renew them before answering."""
    secret, header_file = identity_header
    config = compat_config(issuer, tmp_key, header_file, id_lifetime=235, user_lifetime=310)
    with Broker(config) as broker:
        address = broker.addresses["token"]
        verify = verifier(address)
        identity = f"{ACCOUNT}/default/identity?audience={quote(AUDIENCE, safe='')}"
        first_id = google(address, identity)[1].decode()
        first_user = azure(address, msi(client_id=USER_CLIENT_ID), headers={"X-IDENTITY-HEADER": secret})
        first_iat = min(verify(first_id, AUDIENCE)["iat"], verify(first_user["access_token"], "token-broker")["iat"])
        # Wait (bounded) until both cached tokens have less than the margins left.
        deadline = time.monotonic() + 60
        while time.time() < first_iat + 14 and time.monotonic() < deadline:
            time.sleep(0.2)
        asked = time.time()
        renewed_id = google(address, identity)[1].decode()
        renewed_user = azure(address, msi(client_id=USER_CLIENT_ID), headers={"X-IDENTITY-HEADER": secret})
        assert renewed_id != first_id and renewed_user["access_token"] != first_user["access_token"]
        assert verify(renewed_id, AUDIENCE)["exp"] >= asked + 225, "served inside google-auth's margin"
        assert verify(renewed_user["access_token"], "token-broker")["exp"] >= asked + 300, "served inside msal's margin"
        assert renewed_user["expires_on"] == verify(renewed_user["access_token"], "token-broker")["exp"]
        # The SDK takes it as a valid token (google-auth reads exp from the JWT).
        out = google_sdk(address, default=False, audience=AUDIENCE)
        assert "error" not in out and verify(out["id_token"], AUDIENCE)["exp"] >= asked + 225, out



def test_callers_forcing_refreshes_on_a_template_s_children_do_not_keep_an_sdk_s_margin_refresh_out(issuer, tmp_key, identity_header):
    """The renewal inside an SDK's margin counted in the template's shared window of forced
    refreshes: a caller who forced refreshes on another child (three places) and on the SDK's
    child (a fourth, after which the window is shut to that child) left the SDK, for the rest of
    the 30 s, a token it treats as expired. The renewal now has a window of its own."""
    config = compat_config(issuer, tmp_key, identity_header[1], id_lifetime=235)
    with Broker(config) as broker:
        address = broker.addresses["token"]
        verify = verifier(address)
        identity = f"{ACCOUNT}/default/identity?audience={quote(AUDIENCE, safe='')}"
        google(address, identity)

        def force(audience):
            status, _, body = broker.request("POST", f"/providers/gcp-id/token/refresh?audience={quote(audience, safe='')}")
            return status, json.loads(body)

        for _ in range(3):
            assert force(OTHER_AUDIENCE)[0] == 200
        status, document = force(AUDIENCE)
        assert status == 200, document
        forced_iat = verify(document["access_token"], AUDIENCE)["iat"]
        status, document = force(AUDIENCE)
        assert status == 429 and document["error"] == "excessive_refresh", document
        # Wait (bounded) until the child's token has less than google-auth's 225 s left.
        deadline = time.monotonic() + 30
        while time.time() < forced_iat + 12 and time.monotonic() < deadline:
            time.sleep(0.2)
        asked = time.time()
        assert asked < forced_iat + 25, "still inside the retrier's 30 s window"
        served = google(address, identity)[1].decode()
        assert verify(served, AUDIENCE)["exp"] >= asked + 225, "served inside google-auth's margin"



def test_the_sdk_routes_early_refreshes_are_bounded_for_the_template_as_a_whole(issuer, tmp_key, identity_header):
    """The routes need no secret, so a local client chooses which children exist. With tokens
    that live just over google-auth's margin (226 s), every child's token is inside it a second
    after its fetch: with a window of early refreshes per child, twelve children made the issuer
    fetch a dozen times a second round. The window is the template's, as the retrier's is: at
    most five early fetches per 30 s, however many children."""
    config = compat_config(issuer, tmp_key, identity_header[1])
    identity_template = next(p for p in config["providers"] if p["name"] == "gcp-id")
    identity_template["allowedAudiences"] = ["https://run.example/*"]
    identity_template["source"]["lifetimeSec"] = 226
    with Broker(config) as broker:
        address = broker.addresses["token"]
        audiences = [f"https://run.example/{index}" for index in range(12)]

        def identity(audience):
            return google(address, f"{ACCOUNT}/default/identity?audience={quote(audience, safe='')}")[1]

        def fetches():
            return sum(value for (name, labels), value in broker.metrics().items()
                       if name == "token_broker_refreshes_total" and ("provider", "gcp-id") in labels)

        for audience in audiences:
            identity(audience)
        first = fetches()
        assert first >= len(audiences), first
        time.sleep(2)  # every token now has 225 s or less left
        started = time.monotonic()
        for _ in range(3):
            for audience in audiences:
                identity(audience)
        assert time.monotonic() - started < 25, "the rounds fit in one 30 s window"
        early = fetches() - first
        assert 1 <= early <= 5, f"{early} early fetches for the template in one window"


# Configuration

def write_config(tmp_path, config):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return str(path)


def test_check_config_warns_when_a_local_signer_s_lifetime_cannot_stay_above_an_sdk_s_margin(issuer, tmp_key, identity_header, tmp_path):
    good = run_broker("--check-config", "--config", write_config(tmp_path, compat_config(issuer, tmp_key, identity_header[1])))
    assert good.returncode == 0 and " level=warn " not in good.stderr, good.stderr
    config = compat_config(issuer, tmp_key, identity_header[1], id_lifetime=200, user_lifetime=280)
    result = run_broker("--check-config", "--config", write_config(tmp_path, config))
    assert result.returncode == 0, result.stderr
    # The broker's warning lines: `level=warn msg=compat problem="provider \"NAME\": …"`.
    warnings = [line for line in result.stderr.splitlines() if " level=warn " in line]
    assert any(r'provider \"gcp-id\"' in line and "225 s" in line for line in warnings), result.stderr
    assert any(r'provider \"azure-user\"' in line and "300 s" in line for line in warnings), result.stderr


@pytest.mark.parametrize("protocol", ["gce", "azure"])
def test_check_config_warns_of_a_protocol_listener_other_machines_can_reach(issuer, tmp_key, identity_header, tmp_path,
                                                                             protocol):
    # The SDKs' routes take no caller key, so a listener of their own off loopback serves its
    # templates' tokens to any machine that reaches it. Checked, not started: nothing binds.
    config = compat_config(issuer, tmp_key, identity_header[1])
    config["compat"][protocol]["listen"] = "127.0.0.1:9"
    quiet = run_broker("--check-config", "--config", write_config(tmp_path, config))
    assert quiet.returncode == 0 and " level=warn " not in quiet.stderr, quiet.stderr
    config["compat"][protocol]["listen"] = "0.0.0.0:9"
    result = run_broker("--check-config", "--config", write_config(tmp_path, config))
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if " level=warn " in line]
    assert any(f"compat.{protocol} listens on 0.0.0.0:9, which other machines can reach" in line
               for line in warnings), result.stderr


BAD_CONFIGURATIONS = {
    "unknown gce key": (lambda c: c["compat"]["gce"].update(color="blue"), "color"),
    "unknown protocol": (lambda c: c["compat"].update(aws={}), "aws"),
    "no projectId": (lambda c: c["compat"]["gce"].pop("projectId"), "projectId"),
    "projectId with a space": (lambda c: c["compat"]["gce"].update(projectId="has space"), "projectId"),
    "numericProjectId not digits": (lambda c: c["compat"]["gce"].update(numericProjectId="12ab"), "numericProjectId"),
    "gce provider unknown": (lambda c: c["compat"]["gce"].update(provider="nope"), "provider"),
    "gce provider takes no scope": (lambda c: c["compat"]["gce"].update(provider="gcp-id"), "provider"),
    "gce scope outside the allow-list": (lambda c: c["compat"]["gce"].update(scopes=["admin"]), "scopes"),
    "no azure identity": (lambda c: c["compat"]["azure"].update(identities=[]), "identities"),
    "two system-assigned identities": (
        lambda c: c["compat"]["azure"].update(identities=[{"provider": "azure"}, {"provider": "azure"}]), "identities"),
    "unknown identity key": (lambda c: c["compat"]["azure"]["identities"][1].update(color="blue"), "color"),
    "identity provider takes neither resource nor scope": (
        lambda c: c["compat"]["azure"]["identities"][1].update(provider="gcp-id"), "provider"),
    "imds not a boolean": (lambda c: c["compat"]["azure"].update(imds="yes"), "imds"),
    "imds false without identityHeaderFile": (
        lambda c: (c["compat"]["azure"].pop("identityHeaderFile"), c["compat"]["azure"].update(imds=False)), "imds"),
}


@pytest.mark.parametrize("case", BAD_CONFIGURATIONS)
def test_a_bad_compat_configuration_is_refused_at_start_naming_the_key(issuer, tmp_key, identity_header, tmp_path, case):
    change, key = BAD_CONFIGURATIONS[case]
    config = compat_config(issuer, tmp_key, identity_header[1])
    change(config)
    result = run_broker("--check-config", "--config", write_config(tmp_path, config))
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert key in result.stderr, result.stderr
