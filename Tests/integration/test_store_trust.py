"""What a broker trusts in a shared store's records: only tokens fetched with its own credentials,
and only for as long as they live by a clock other than the writer's.

Brokers share one configuration, one store key and one Redis (a redis-server of the test's own,
on a Unix socket), as a fleet's pods do; what differs is what they read at the same path: each
pod mounts its own API key, client secret or token file there. Here the file is rewritten between
two brokers' starts (and before a reload), which is the same path holding other contents. The
issuer is a small one of the test's own that names each token after the credential it was shown,
so a token tells whose it is. A broker whose wall clock runs ahead is made with a preloaded
library (preload/clock_skew.c).
"""
import base64
import hashlib
import json
import os
import re
import threading
import time
import urllib.parse
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from broker import Broker
from test_fleet import redis, write_key  # noqa: F401 (redis: the fixture, a redis-server per test)
from test_http_api import wait_until
from test_reload import preload_library

SEEN = set()  # credentials and tokens: never in a broker's log
# A provider's first token: fetched (or not), its record served, or the fleet's record; a record
# refused is followed by a fetch, whose line is the one to wait for.
PROGRESS = r'msg="(token fetch(ed| failed)|stored token served|token from the fleet)"'


class CredentialIssuer:
    """A token endpoint on 127.0.0.1 that names each token after the credential it was shown (the
    `X-Api-Key` header, or an OAuth 2.0 client's secret, Basic or in the form): `tok-<8 hex of its
    SHA-256>-<n>`, living `lifetime` seconds. Keeps each issue: (time.time(), credential, token)."""

    def __init__(self, lifetime=300):
        self.lifetime, self.issued, self.lock = lifetime, [], threading.Lock()
        issuer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
                credential = self.headers.get("X-Api-Key")
                authorization = self.headers.get("Authorization", "")
                if credential is None and authorization.startswith("Basic "):
                    credential = urllib.parse.unquote(base64.b64decode(authorization[6:]).decode().split(":", 1)[1])
                if credential is None:
                    credential = urllib.parse.parse_qs(body).get("client_secret", [None])[0]
                if not credential:
                    self.send_response(401)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                with issuer.lock:
                    token = f"tok-{credential_name(credential)}-{len(issuer.issued) + 1}"
                    issuer.issued.append((time.time(), credential, token))
                answer = json.dumps({"access_token": token, "token_type": "Bearer",
                                     "expires_in": issuer.lifetime}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/token"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def issue_of(self, token):
        """(time.time() at the issue, credential) of `token`."""
        with self.lock:
            return next((at, credential) for at, credential, issued in self.issued if issued == token)

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def credential_name(credential):
    return hashlib.sha256(credential.encode()).hexdigest()[:8]


class StoreBroker(Broker):
    """A Broker whose start ends once each provider has its first token, or failed to get one."""

    def _wait_for_first_fetches(self, config, timeout=20):
        names = [provider["name"] for provider in config["providers"]]
        patterns = [re.compile(PROGRESS + rf" provider={re.escape(name)}( |$)", re.M) for name in names]
        wait_until(lambda: self.process.poll() is not None or all(p.search(self.stderr()) for p in patterns), timeout)


@pytest.fixture
def issuer():
    server = CredentialIssuer()
    yield server
    server.close()


@pytest.fixture
def store(redis, tmp_path):
    """The `store` every broker of a test shares: its Redis and one key file."""
    key_file = tmp_path / "store.key"
    write_key(key_file)
    return {"type": "redis", "address": "unix:" + redis.socket, "keyFile": str(key_file)}


@pytest.fixture(autouse=True)
def nothing_secret_is_logged():
    SEEN.clear()
    yield
    for broker in Broker.started:
        leaked = sorted(secret[:10] + "…" for secret in SEEN if secret in broker.stderr())
        assert not leaked, f"the broker's log ({broker.log_path}) holds secrets: {leaked}"


def secret_file(path, value):
    """Writes `value` (and a newline) at `path`, mode 0600, as a mounted secret is."""
    path.write_text(value + "\n")
    path.chmod(0o600)
    SEEN.add(value)
    return str(path)


def token(broker, provider):
    body, _ = broker.get_json(f"/providers/{provider}/token", timeout=30)
    SEEN.add(body["access_token"])
    return body


def log_lines(broker, message, provider):
    return [line for line in broker.stderr().splitlines() if f'msg="{message}" provider={provider} ' in line + " "]


def record_key(provider):
    return "token-broker:record:" + hashlib.sha256(provider.encode()).hexdigest()


# Credentials: the settings a record is made under hold the credentials' contents, not their paths

def http_provider(issuer, key_file):
    return {"name": "waf", "source": {"type": "http", "url": issuer.url, "expiresInPointer": "/expires_in",
                                      "headers": {"X-Api-Key": {"file": key_file}}}}


def oauth_provider(issuer, secret_path):
    return {"name": "api", "source": {"type": "oauth2", "tokenURL": issuer.url, "clientID": "tenant",
                                      "clientSecretFile": secret_path}}


@pytest.mark.parametrize("kind", ["http header file", "oauth2 client secret file"])
def test_brokers_with_other_secrets_at_the_same_path_never_serve_each_others_tokens(issuer, store, tmp_path, kind):
    """Tenant A's broker and tenant B's, one configuration and one store key, each with its own
    secret at the same path: B told A's record from its own by the path alone, and served A's
    token (a review: "tenant B serves A-tenant-A-key-59"). B now refuses it, as made under other settings,
    and fetches with its own secret; A, still running, goes on serving its own, and leaves B's
    record alone when the channel brings it."""
    path = tmp_path / "mounted-secret"
    secret_file(path, "tenant-a-secret")
    provider = http_provider(issuer, str(path)) if kind == "http header file" else oauth_provider(issuer, str(path))
    name = provider["name"]
    config = {"providers": [provider], "store": store}
    with StoreBroker(config) as tenant_a:
        a_token = token(tenant_a, name)["access_token"]
        assert a_token.startswith("tok-" + credential_name("tenant-a-secret")), a_token
        # Tenant B's pod: its own secret at the same path.
        secret_file(path, "tenant-b-secret")
        with StoreBroker(config) as tenant_b:
            b_token = token(tenant_b, name)["access_token"]
            assert b_token != a_token, "tenant B serves tenant A's token"
            assert b_token.startswith("tok-" + credential_name("tenant-b-secret")), b_token
            refused = log_lines(tenant_b, "stored record refused; fetching", name)
            assert len(refused) == 1 and "other settings" in refused[0], tenant_b.stderr()
            assert not log_lines(tenant_b, "stored token served", name), tenant_b.stderr()
            # B's record is in Redis, and on the channel: A leaves it alone.
            assert wait_until(lambda: log_lines(tenant_b, "token fetched", name), timeout=10)
            time.sleep(1)
            assert token(tenant_a, name)["access_token"] == a_token, "tenant A took tenant B's token"
            assert not log_lines(tenant_a, "token from the fleet", name)


def test_a_reload_after_the_secret_file_changed_fetches_with_the_new_secret(issuer, store, tmp_path):
    """A reload replaces a provider whose secret file changed; the replacement read the stored
    record, made with the old secret, as its own, and served that token: a reload that should
    have shown whether the new secret works (its replacement gets a first token, or the reload
    is abandoned) showed nothing. Its records are now made under the new secret's digest."""
    path = tmp_path / "api-key"
    secret_file(path, "first-api-key")
    config = {"providers": [http_provider(issuer, str(path))], "store": store}
    with StoreBroker(config) as broker:
        before = token(broker, "waf")
        assert before["access_token"].startswith("tok-" + credential_name("first-api-key"))
        secret_file(path, "rotated-api-key")
        status, _, body = broker.request("POST", "/reload", listener="admin", timeout=90)
        assert status == 200 and json.loads(body)["changed"] == ["waf"], body
        after = token(broker, "waf")
        assert after["access_token"].startswith("tok-" + credential_name("rotated-api-key")), \
            "the replacement serves the token fetched with the old key"
        assert after["version"] == before["version"] + 1
        assert len(log_lines(broker, "stored record refused; fetching", "waf")) == 1, broker.stderr()


def test_a_file_sources_token_is_not_shared_through_the_store(redis, store, tmp_path):
    """A file source's token is its host's file (a pod's own projected service-account token),
    and its path is all a record could name it by: tenant B's broker served the token of tenant A's
    file (a review: "token-of-workload-A"). Its tokens are now never stored: each broker
    serves its own file's, and says so at start."""
    path = tmp_path / "token"

    def mount(value):
        path.write_text(value + "\n")
        SEEN.add(value)

    mount("token-of-workload-A")
    config = {"providers": [{"name": "k8s", "source": {"type": "file", "path": str(path), "lifetimeSec": 600}}],
              "store": store}
    with StoreBroker(config) as tenant_a:
        assert token(tenant_a, "k8s")["access_token"] == "token-of-workload-A"
        mount("token-of-workload-B")
        with StoreBroker(config) as tenant_b:
            assert token(tenant_b, "k8s")["access_token"] == "token-of-workload-B", "B serves A's file's token"
            for broker in (tenant_a, tenant_b):
                said = log_lines(broker, "tokens not stored: a file source reads this host's token file at each refresh",
                                 "k8s")
                assert len(said) == 1, broker.stderr()
            assert redis.command("EXISTS", record_key("k8s")) == 0, "a record of a token file is in Redis"


# Clocks: a record from a broker whose clock runs ahead is served until its token expires, no longer

def test_a_record_from_a_clock_running_ahead_is_not_served_past_its_expiry(issuer, store, tmp_path):
    """A broker whose wall clock runs 40 s ahead fetches a 300 s token and stores it; a broker
    with the right clock starts a few seconds later and serves that record. Dated by the writer's
    clock, the record looked 40 s younger than it was, and was served for its whole lifetime from
    then on, past its expiry (a review: 17 s past it, "stale": false). The reader now
    places it by Redis's clock (the record's time to live): what it says is left, `expires_in` and
    `expires_at`, ends by the issuer's expiry."""
    path = tmp_path / "api-key"
    secret_file(path, "skewed-fleet-key")
    config = {"providers": [http_provider(issuer, str(path))], "store": store}
    environment = {"LD_PRELOAD": preload_library(tmp_path, "clock_skew"), "CLOCK_SKEW_SECONDS": "40"}
    if os.environ.get("ASAN_OPTIONS") is not None:
        environment["ASAN_OPTIONS"] = os.environ["ASAN_OPTIONS"] + ":verify_asan_link_order=0"
    with StoreBroker(config, env=environment) as writer:
        written = token(writer, "waf")
        issued_at, _ = issuer.issue_of(written["access_token"])
        expiry = issued_at + issuer.lifetime  # by the issuer's clock, which is right
        assert epoch(written["expires_at"]) > expiry + 30, "the writer's clock runs ahead"
        assert writer.stop() == 0
    # Long enough that the token's age shows: the reader's error was the writer's lead while the
    # record is younger than that lead.
    time.sleep(5)
    with StoreBroker(config) as reader:
        asked = time.time()
        served = token(reader, "waf")
        assert served["access_token"] == written["access_token"], "the reader serves the stored record"
        assert log_lines(reader, "stored token served", "waf") and not log_lines(reader, "token fetched", "waf")
        # One second for `expires_in`'s whole seconds and the time the request took.
        assert asked + served["expires_in"] <= expiry + 1, \
            f"served with {served['expires_in']} s left, {asked + served['expires_in'] - expiry:.1f} s past its expiry"
        assert epoch(served["expires_at"]) <= expiry + 1, (served["expires_at"], expiry)
        assert not served["stale"]


def epoch(rfc3339):
    """/token's `expires_at` (RFC 3339, UTC, whole seconds) as seconds since 1970."""
    return datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()
