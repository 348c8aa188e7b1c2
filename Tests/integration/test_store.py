"""The token store (`"store": {"type": "file"}`): tokens that outlive a restart, sealed.

Against the real OAuth server (django-oauth-toolkit), whose own count of token requests says
whether the broker fetched: a restarted broker serves its stored token without a fetch, with the
same version; an expired record is never served. The record format is checked independently with
Python's `cryptography` (AES-256-GCM) in both directions: the broker's records are opened here, and
records sealed here are served by the broker. Records that do not authenticate (another key,
another provider's, changed, truncated) are refused with one warning and a normal fetch; local
signers with a generated key store nothing; bad store configurations exit 2. No token, client
secret or store key ever appears in a broker's log.
"""
import hashlib
import json
import os
import re
import secrets
import signal
import stat
import threading
import time
from datetime import datetime

import jwt
import pytest
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from broker import Broker, run_broker
from issuers.process import OAuthServer
from test_http_api import wait_until
from test_sinks import ACL_CASES, set_acl

SECRET = "store-client-secret-Vq3xT9"
LIFETIME = 300
SHORT_LIFETIME = 4
OPS = "token_broker_store_operations_total"
# What must never reach a broker's log in this test: every access token seen, the client secret, store keys.
SEEN = set()
LISTEN = {"TOKEN_BROKER_LISTEN": "127.0.0.1:0", "TOKEN_BROKER_ADMIN_LISTEN": "127.0.0.1:0"}


@pytest.fixture(scope="module")
def issuer(tmp_path_factory):
    server = OAuthServer(str(tmp_path_factory.mktemp("store")), {"store": SECRET}, lifetime=LIFETIME)
    yield server
    server.close()


@pytest.fixture(scope="module")
def short_issuer(tmp_path_factory):
    server = OAuthServer(str(tmp_path_factory.mktemp("store-short")), {"store": SECRET}, lifetime=SHORT_LIFETIME)
    yield server
    server.close()


@pytest.fixture(scope="module")
def default_settings(issuer, tmp_path_factory):
    """The `settings` digest of `oauth(issuer)`'s records, as a broker writes it: opaque here, read
    from a record of a broker run once with a store of its own, so that records sealed here are
    ones that provider would serve."""
    store = Store(tmp_path_factory.mktemp("settings"))
    with StoreBroker(configuration(store, oauth(issuer))) as broker:
        token(broker)
        assert broker.stop() == 0
    settings = store.read("default")[1]["settings"]
    assert re.fullmatch(r"[0-9a-f]{64}", settings), settings
    return settings


@pytest.fixture(autouse=True)
def nothing_secret_is_logged():
    """After each test, no broker's stderr holds a token seen, the client secret or a store key."""
    SEEN.clear()
    SEEN.add(SECRET)
    yield
    for broker in Broker.started:
        log = broker.stderr()
        leaked = sorted(secret[:12] + "…" for secret in SEEN if secret in log)
        assert not leaked, f"the broker's log ({broker.log_path}) holds secrets: {leaked}"


def sha256(text):
    return hashlib.sha256(text.encode()).hexdigest()


def fingerprint(token):
    return "sha256:" + sha256(token)[:12]


def seal(key, key_text, version, document):
    """A record as documented: TBSTORE1 ‖ version ‖ nonce ‖ ciphertext ‖ tag; AD = header ‖ key text."""
    header = b"TBSTORE1" + version.to_bytes(8, "big")
    nonce = os.urandom(12)
    return header + nonce + AESGCM(key).encrypt(nonce, json.dumps(document).encode(), header + key_text.encode())


def open_record(key, key_text, data):
    """(version, plaintext document) of a record; raises cryptography's InvalidTag when it does not authenticate."""
    assert data[:8] == b"TBSTORE1", data[:16]
    plaintext = AESGCM(key).decrypt(data[16:28], data[28:], data[:16] + key_text.encode())
    return int.from_bytes(data[8:16], "big"), json.loads(plaintext)


class Store:
    """A store directory (0700) and its key file: 64 hex digits and a newline, or 32 raw bytes."""

    def __init__(self, root, directory="store", key_name="store.key", raw=False):
        self.directory = root / directory
        self.directory.mkdir(mode=0o700, exist_ok=True)
        self.key = os.urandom(32)
        self.key_file = root / key_name
        self.key_file.write_bytes(self.key if raw else (self.key.hex() + "\n").encode())
        self.key_file.chmod(0o600)
        SEEN.add(self.key.hex())

    def settings(self):
        return {"type": "file", "path": str(self.directory), "keyFile": str(self.key_file)}

    def path(self, key_text):
        return self.directory / (sha256(key_text) + ".record")

    def read(self, key_text):
        return open_record(self.key, key_text, self.path(key_text).read_bytes())

    def write(self, key_text, version, document):
        self.path(key_text).write_bytes(seal(self.key, key_text, version, document))
        self.path(key_text).chmod(0o600)


@pytest.fixture
def store(tmp_path):
    return Store(tmp_path)


class StoreBroker(Broker):
    """A Broker whose start also waits for a provider's first token served from the store."""

    def _wait_for_first_fetches(self, config, timeout=10):
        names = [provider["name"] for provider in config["providers"] if not provider.get("perRequest")]
        patterns = [re.compile(rf'msg="(token fetch(ed| failed)|stored token served)" provider={re.escape(name)}( |$)', re.M)
                    for name in names]
        wait_until(lambda: self.process.poll() is not None or all(p.search(self.stderr()) for p in patterns), timeout)


def oauth(issuer, name="default", **extra):
    return {"name": name, "maxErrorTokenRefreshDelayMsec": 500, **extra,
            "source": {"type": "oauth2", "tokenURL": issuer.base + "/o/token/", "clientID": "store",
                       "clientSecret": SECRET, "scope": "api"}}


def configuration(store, *providers):
    return {"providers": list(providers), "store": store.settings()}


def token(broker, name="default", query=""):
    body, _ = broker.get_json(f"/providers/{name}/token{query}", timeout=30)
    SEEN.add(body["access_token"])
    return body


def ops(broker, operation, result):
    return broker.metric(OPS, operation=operation, result=result)


def log_lines(broker, message, provider):
    return [line for line in broker.stderr().splitlines() if f'msg="{message}" provider={provider} ' in line + " "]


def epoch(iso):
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


# Restart

def test_a_broker_started_again_serves_its_stored_token_and_version_before_any_fetch(issuer, store):
    config = configuration(store, oauth(issuer))
    with StoreBroker(config) as first:
        before = token(first)
        assert sha256(before["access_token"]) in issuer.issued(), "the first token comes from the issuer"
        assert ops(first, "load", "missing") == 1
        assert first.stop() == 0
    fetched = issuer.requests()
    with StoreBroker(config) as second:
        served = token(second)
        assert issuer.requests() == fetched, "the restarted broker asked the issuer for a token"
        assert (served["access_token"], served["version"], served["token_type"], served["issued_at"]) == \
            (before["access_token"], before["version"], before["token_type"], before["issued_at"])
        assert 0 < served["expires_in"] <= before["expires_in"]
        assert len(log_lines(second, "stored token served", "default")) == 1, second.stderr()
        assert f'version={before["version"]} token={fingerprint(before["access_token"])}' in second.stderr()
        assert 'msg="token fetched"' not in second.stderr()
        assert (ops(second, "load", "served"), ops(second, "load", "missing")) == (1, 0)
        ready, _ = second.get_json("/readyz", listener="admin")
        assert ready["ready"] is True, ready
        # The token has minutes left: its refresh is not due, so nothing is fetched while we look.
        assert not wait_until(lambda: issuer.requests() > fetched, timeout=2), "a fetch followed the stored token"
        assert issuer.get("/api/hello", served["access_token"]) == 200, "the stored token still works at the issuer"
        status, _, body = second.request("POST", "/token/refresh", body=json.dumps({"rejected_version": before["version"]}).encode())
        assert status == 200, (status, body)
        renewed = json.loads(body)
        SEEN.add(renewed["access_token"])
        assert renewed["version"] == before["version"] + 1 and issuer.requests() == fetched + 1, "the retrier renews it"


def test_a_stored_token_past_its_refresh_point_is_served_then_renewed_with_the_next_version(
        issuer, store, default_settings):
    now_ms = int(time.time() * 1000)
    old = "stale-but-valid-" + secrets.token_urlsafe(16)
    SEEN.add(old)
    store.write("default", 41, {"access_token": old, "token_type": "Bearer", "scope": "api",
                                "issued_at_ms": now_ms - 330_000, "expires_at_ms": now_ms + 30_000,  # due at 75-85 %
                                "settings": default_settings})
    fetched = issuer.requests()
    with StoreBroker(configuration(store, oauth(issuer))) as broker:
        assert wait_until(lambda: len(log_lines(broker, "stored token served", "default")) == 1), broker.stderr()
        renewed, _ = broker.get_json("/token/ready?after=41&timeout=20", timeout=30)
        SEEN.add(renewed["access_token"])
        assert renewed["version"] == 42 and renewed["access_token"] != old
        assert sha256(renewed["access_token"]) in issuer.issued()
        assert issuer.requests() == fetched + 1
    version, document = store.read("default")
    assert (version, document["access_token"]) == (42, renewed["access_token"]), "the renewed token is stored"


@pytest.mark.parametrize("how", ["the issuer's short lifetime", "a record sealed here that expired an hour ago"])
def test_a_record_for_an_expired_token_is_never_served_and_the_broker_fetches(
        issuer, short_issuer, store, default_settings, how):
    if how == "the issuer's short lifetime":
        upstream = short_issuer
        with StoreBroker(configuration(store, oauth(upstream))) as first:
            token(first)
            assert first.stop() == 0
        version, document = store.read("default")
        # Waits out the stored token's life (a precondition, not an assertion on the broker's speed).
        assert wait_until(lambda: time.time() * 1000 > document["expires_at_ms"] + 500, timeout=SHORT_LIFETIME + 30)
    else:
        upstream = issuer
        now_ms = int(time.time() * 1000)
        version, document = 9, {"access_token": "expired-" + secrets.token_urlsafe(16), "token_type": "Bearer",
                                "issued_at_ms": now_ms - 7_200_000, "expires_at_ms": now_ms - 3_600_000,
                                "settings": default_settings}
        store.write("default", version, document)
    stale = document["access_token"]
    SEEN.add(stale)
    fetched = upstream.requests()
    with StoreBroker(configuration(store, oauth(upstream))) as broker:
        served = token(broker)
        assert served["access_token"] != stale, "an expired stored token was served"
        assert sha256(served["access_token"]) in upstream.issued()
        assert upstream.requests() > fetched, "the broker did not fetch"
        assert len(log_lines(broker, "stored token expired; fetching", "default")) == 1, broker.stderr()
        assert not log_lines(broker, "stored token served", "default")
        assert (ops(broker, "load", "expired"), ops(broker, "load", "served")) == (1, 0)


# The format, both ways

def test_the_record_the_broker_writes_opens_with_the_documented_key_and_associated_data(issuer, store, default_settings):
    started_ms = time.time() * 1000
    with StoreBroker(configuration(store, oauth(issuer)), umask=0) as broker:
        served = token(broker)
        assert broker.stop() == 0
    stopped_ms = time.time() * 1000
    path = store.path("default")
    assert os.listdir(store.directory) == [path.name], "one record, named by sha256(name), no leftovers"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600, "written 0600 even under umask 0"
    raw = path.read_bytes()
    for secret in (served["access_token"], SECRET, store.key.hex()):
        assert secret.encode() not in raw
    assert store.key not in raw
    version, document = open_record(store.key, "default", raw)
    assert version == served["version"]
    assert set(document) <= {"access_token", "token_type", "scope", "issued_at_ms", "expires_at_ms", "settings"}, document
    assert document["settings"] == default_settings, "the same provider settings, the same digest"
    assert (document["access_token"], document["token_type"], document["scope"]) == \
        (served["access_token"], served["token_type"], "api")
    assert started_ms - 1000 <= document["issued_at_ms"] <= stopped_ms + 1000
    assert abs(document["issued_at_ms"] / 1000 - epoch(served["issued_at"])) < 1.5
    assert abs(document["expires_at_ms"] - document["issued_at_ms"] - LIFETIME * 1000) <= 2000, document
    with pytest.raises(InvalidTag):
        open_record(store.key, "another", raw)  # the provider's name is in the associated data


def test_a_record_sealed_here_with_a_token_the_issuer_never_issued_is_served_without_a_fetch(
        issuer, tmp_path, default_settings):
    store = Store(tmp_path, raw=True)  # the key file's other form: 32 raw bytes
    forged = "sealed-in-python-" + secrets.token_urlsafe(24)
    SEEN.add(forged)
    now_ms = int(time.time() * 1000)
    store.write("default", 41, {"access_token": forged, "token_type": "Bearer", "scope": "api",
                                "issued_at_ms": now_ms - 10_000, "expires_at_ms": now_ms + 3_600_000,
                                "settings": default_settings})
    fetched = issuer.requests()
    with StoreBroker(configuration(store, oauth(issuer))) as broker:
        served = token(broker)
        assert (served["access_token"], served["version"], served["token_type"]) == (forged, 41, "Bearer")
        assert 3000 < served["expires_in"] <= 3600
        assert sha256(forged) not in issuer.issued()
        assert not wait_until(lambda: issuer.requests() > fetched, timeout=2), "the broker fetched"
        assert ops(broker, "load", "served") == 1


# Records that may not be used

def test_a_broker_with_another_key_refuses_the_record_once_and_fetches_for_itself(issuer, tmp_path):
    store = Store(tmp_path)
    with StoreBroker(configuration(store, oauth(issuer))) as first:
        original = token(first)["access_token"]
        assert first.stop() == 0
    other = Store(tmp_path, key_name="other.key")  # the same directory, another key
    fetched = issuer.requests()
    with StoreBroker(configuration(other, oauth(issuer))) as second:
        served = token(second)
        assert served["access_token"] != original, "a record sealed under another key was served"
        assert sha256(served["access_token"]) in issuer.issued()
        assert issuer.requests() == fetched + 1
        refused = log_lines(second, "stored record refused; fetching", "default")
        assert len(refused) == 1 and "level=warn" in refused[0] and "does not authenticate" in refused[0], second.stderr()
        assert not log_lines(second, "stored token served", "default")
        assert (ops(second, "load", "refused"), ops(second, "load", "served")) == (1, 0)
        assert second.stop() == 0
    assert other.read("default")[1]["access_token"] == served["access_token"], "the record is replaced under the new key"


def sealed_without_a_token(store, alpha, beta):
    return seal(store.key, "beta", 3, {"hello": "world"})


def sealed_as_version_zero(store, alpha, beta):
    return seal(store.key, "beta", 0, {"access_token": "v0", "token_type": "Bearer", "issued_at_ms": 1})


def a_fifo(store, alpha, beta):
    """A FIFO in the record's place, which a read that waited for a writer would hang on."""
    store.path("beta").unlink()
    os.mkfifo(store.path("beta"), 0o600)


@pytest.mark.parametrize("mangle,reason", [
    (lambda store, alpha, beta: alpha, "does not authenticate"),
    (lambda store, alpha, beta: beta[:len(beta) // 2], "does not authenticate"),
    (lambda store, alpha, beta: beta[:-1] + bytes([beta[-1] ^ 1]), "does not authenticate"),
    (lambda store, alpha, beta: beta[:15] + bytes([beta[15] ^ 4]) + beta[16:], "does not authenticate"),
    (lambda store, alpha, beta: beta[:12], "is not a token-broker store record"),
    (lambda store, alpha, beta: b"", "is not a token-broker store record"),
    (lambda store, alpha, beta: b'{"access_token": "plain"}', "is not a token-broker store record"),
    (sealed_without_a_token, "authenticates but does not hold a token"),
    (sealed_as_version_zero, "names version 0"),
    (a_fifo, "is a FIFO"),
], ids=["another provider's record", "truncated", "a changed tag byte", "another version in its header",
        "cut inside the header", "empty", "not a record", "sealed without a token", "version 0", "a FIFO"])
def test_a_foreign_or_corrupt_record_is_refused_with_a_warning_and_a_normal_fetch(issuer, store, mangle, reason):
    config = configuration(store, oauth(issuer, "alpha"), oauth(issuer, "beta"))
    with StoreBroker(config) as first:
        alpha, beta = token(first, "alpha"), token(first, "beta")
        assert first.stop() == 0
    mangled = mangle(store, store.path("alpha").read_bytes(), store.path("beta").read_bytes())
    if mangled is not None:
        store.path("beta").write_bytes(mangled)
    fetched = issuer.requests()
    with StoreBroker(config) as second:
        assert token(second, "alpha")["access_token"] == alpha["access_token"], "alpha's own record still serves"
        served = token(second, "beta")
        assert served["access_token"] not in (alpha["access_token"], beta["access_token"])
        assert issuer.requests() == fetched + 1, "one fetch, for beta"
        refused = log_lines(second, "stored record refused; fetching", "beta")
        assert len(refused) == 1 and "level=warn" in refused[0] and reason in refused[0], second.stderr()
        assert not log_lines(second, "stored record refused; fetching", "alpha")
        assert (ops(second, "load", "refused"), ops(second, "load", "served")) == (1, 1)
        assert second.process.poll() is None
        assert second.stop() == 0
    assert store.read("beta")[1]["access_token"] == served["access_token"], "the bad record is replaced"


@pytest.mark.parametrize("change, provider, rule", [
    ({"access_token": "forged;Domain=evil.example"}, {"setTokenCookie": True}, "a cookie value cannot"),
    ({"access_token": "forged\r\nX-Injected: 1"}, {}, "other than visible ASCII"),
    ({"token_type": "Bearer\r\nX-Injected: 1"}, {}, "token_type is not an RFC 6749 type name"),
    ({"scope": "api\u202eipa"}, {}, "scope is not an RFC 6749 scope"),
], ids=["cookie-breaking token, setTokenCookie on", "line break in the token", "line break in the type",
        "bidirectional override in the scope"])
def test_a_record_whose_token_this_provider_would_refuse_from_its_issuer_is_not_served(
        issuer, store, default_settings, change, provider, rule):
    """A record sealed with the key and the provider's settings, but holding what the provider's
    token rules refuse: written by a broker whose rules differ (`setTokenCookie` off, an older
    version) or before the configuration changed. It is refused as a foreign record is, and the
    broker fetches; before, the broker served it (a `Set-Cookie` ending early, a line break)."""
    now_ms = int(time.time() * 1000)
    document = {"access_token": "forged-" + secrets.token_urlsafe(16), "token_type": "Bearer", "scope": "api",
                "issued_at_ms": now_ms - 10_000, "expires_at_ms": now_ms + 3_600_000, "settings": default_settings,
                **change}
    SEEN.add(document["access_token"])
    store.write("default", 41, document)
    fetched = issuer.requests()
    with StoreBroker(configuration(store, oauth(issuer, **provider))) as broker:
        served = token(broker)
        assert served["access_token"] != document["access_token"], "the record was served"
        assert sha256(served["access_token"]) in issuer.issued()
        assert "evil" not in served.get("set_cookie", "")
        assert issuer.requests() == fetched + 1
        refused = log_lines(broker, "stored record refused; fetching", "default")
        assert len(refused) == 1 and "level=warn" in refused[0] and rule in refused[0], broker.stderr()
        assert (ops(broker, "load", "refused"), ops(broker, "load", "served")) == (1, 0)
        assert broker.stop() == 0
    assert store.read("default")[1]["access_token"] == served["access_token"], "the record is replaced"


def test_a_record_that_cannot_be_written_is_logged_and_counted_and_the_token_still_served(issuer, store):
    store.path("default").mkdir()  # a directory where the record goes: neither read nor replaced
    with StoreBroker(configuration(store, oauth(issuer))) as broker:
        served = token(broker)
        assert sha256(served["access_token"]) in issuer.issued()
        assert "is a directory" in log_lines(broker, "stored record refused; fetching", "default")[0], broker.stderr()
        assert wait_until(lambda: ops(broker, "save", "error") == 1), broker.metrics()
        failed = log_lines(broker, "token not stored", "default")
        assert len(failed) == 1 and "level=warn" in failed[0], broker.stderr()
        assert ops(broker, "save", "ok") == 0 and token(broker)["access_token"] == served["access_token"]
        assert broker.stop() == 0
    assert os.listdir(store.directory) == [store.path("default").name] and store.path("default").is_dir()


# Template children and local signers

def test_a_template_child_is_stored_under_its_values_and_served_after_a_restart_without_a_fetch(issuer, store):
    template = oauth(issuer, "orders", perRequest=["scope", "audience"], allowedScopes=["read", "api"],
                     allowedAudiences=["https://api.example/*"])
    config = configuration(store, template)
    wanted = "?audience=https%3A%2F%2Fapi.example%2Fa&scope=read"
    key = "orders\naudience=https://api.example/a\nscope=read"  # audience, then scope, whatever the config's order
    with StoreBroker(config) as first:
        before = token(first, "orders", wanted)
        assert first.stop() == 0
    version, document = store.read(key)
    assert (version, document["access_token"], document["scope"]) == (before["version"], before["access_token"], "read")
    fetched = issuer.requests()
    with StoreBroker(config) as second:
        served = token(second, "orders", wanted)
        assert issuer.requests() == fetched, "the child fetched although its record was fresh"
        assert (served["access_token"], served["version"]) == (before["access_token"], before["version"])
        served_lines = log_lines(second, "stored token served", "orders")
        assert len(served_lines) == 1 and 'values="audience=\\"https://api.example/a\\" scope=\\"read\\""' in served_lines[0], \
            second.stderr()
        other = token(second, "orders", "?audience=https%3A%2F%2Fapi.example%2Fb&scope=read")
        assert other["access_token"] != served["access_token"]
        assert issuer.requests() == fetched + 1, "another child, without a record, fetches"
        assert (ops(second, "load", "served"), ops(second, "load", "missing")) == (1, 1)


def test_a_dropped_childs_record_is_removed_once_its_token_expires_and_the_others_stay(short_issuer, store):
    """A child idle for childIdleSec (60 s, the least allowed) is dropped; its record goes once its
    4-second token has expired. A child still read, and a configured provider, keep theirs."""
    template = oauth(short_issuer, "orders", perRequest=["scope"], allowedScopes=["read", "api"], childIdleSec=60)
    config = configuration(store, oauth(short_issuer), template)
    dropped, kept = "orders\nscope=read", "orders\nscope=api"
    with StoreBroker(config) as broker:
        token(broker, "orders", "?scope=read")
        token(broker, "orders", "?scope=api")
        wait_until(lambda: all(store.path(key).exists() for key in (dropped, kept, "default")), 10)
        deadline = time.monotonic() + 150
        while store.path(dropped).exists() and time.monotonic() < deadline:
            token(broker, "orders", "?scope=api")  # read again and again: never idle
            time.sleep(2)
        assert not store.path(dropped).exists(), broker.stderr()
        assert 'msg="template child dropped: idle for childIdleSec" provider=orders values="scope=\\"read\\""' \
            in broker.stderr()
        assert store.path(kept).exists() and store.path("default").exists()
        assert store.read(kept)[1]["scope"] == "api"
        assert (ops(broker, "remove", "ok"), ops(broker, "remove", "error")) == (1, 0)
        # Dot-files are the temporary files of writes under way (the others refresh every few seconds).
        assert sorted(p.name for p in store.directory.iterdir() if not p.name.startswith(".")) == sorted(
            store.path(key).name for key in (kept, "default")), "nothing else left behind"


def test_a_local_signer_with_a_generated_key_stores_nothing_and_one_with_a_key_file_is_kept(store, tmp_key):
    config = configuration(store, {"name": "generated", "source": {"type": "jwt"}},
                           {"name": "keyed", "source": {"type": "jwt", "keyFile": tmp_key("ec"), "lifetimeSec": 300}})
    with StoreBroker(config) as first:
        generated, keyed = token(first, "generated"), token(first, "keyed")
        assert len(log_lines(first, "tokens not stored: the local signer's key is generated at start (set keyFile to keep them)",
                             "generated")) == 1, first.stderr()
        assert first.stop() == 0
    assert os.listdir(store.directory) == [store.path("keyed").name]
    with StoreBroker(config) as second:
        assert token(second, "generated")["access_token"] != generated["access_token"]
        again = token(second, "keyed")
        assert (again["access_token"], again["version"]) == (keyed["access_token"], keyed["version"])
        assert log_lines(second, "stored token served", "keyed") and not log_lines(second, "token fetched", "keyed")
        assert sum(value for (name, _), value in second.metrics().items() if name == OPS) == ops(second, "load", "served") == 1


@pytest.mark.parametrize("change", ["the local signer's key file rotated", "the oauth2 scope changed"])
def test_a_record_kept_under_other_provider_settings_is_not_served_after_they_change(issuer, store, tmp_key, change):
    """A record holds a digest of the settings it was made under: after the operator changes the
    provider (a new signing key, another scope) and restarts, the token made under the old ones
    is refused, not served (which would be a JWT whose kid is not in the broker's own JWKS, or a
    token for the old scope), and the version goes on from the record's."""
    if change == "the local signer's key file rotated":
        provider = {"name": "default", "source": {"type": "jwt", "keyFile": tmp_key("ec"), "lifetimeSec": 300}}
        changed = provider
    else:
        provider = oauth(issuer)
        changed = {**provider, "source": {**provider["source"], "scope": "read"}}
    with StoreBroker(configuration(store, provider)) as first:
        before = token(first)
        assert first.stop() == 0
    if change == "the local signer's key file rotated":
        tmp_key("ec")  # a new key at the same path, as `openssl genpkey -out` over the old one writes
    with StoreBroker(configuration(store, changed)) as second:
        served = token(second)
        if change == "the local signer's key file rotated":
            jwks, _ = second.get_json("/.well-known/jwks.json")
            kids = [key["kid"] for key in jwks["keys"]]
            kid = jwt.get_unverified_header(served["access_token"])["kid"]
            assert kid in kids, f"served a JWT signed by a key the broker no longer publishes ({kid} not in {kids})"
            jwt.decode(served["access_token"], jwt.PyJWK(jwks["keys"][0]).key, algorithms=["ES256"], audience="token-broker")
        else:
            asked = issuer.issued().get(sha256(served["access_token"]), {}).get("scope")
            assert asked == ["read"], f"served a token issued for scope {asked}, not the configured read"
        assert served["access_token"] != before["access_token"]
        assert served["version"] == before["version"] + 1, "versions go on from the record's"
        refused = log_lines(second, "stored record refused; fetching", "default")
        assert len(refused) == 1 and "other settings" in refused[0], second.stderr()


def test_two_different_token_requests_never_share_a_record(issuer, store):
    """The settings a record was made under were written as lines joined by newlines: a resource
    `R?x=y` and an extra parameter `R?x` of `y` wrote the same text (so did an empty scope, sent as
    `scope=`, and none), so that a broker configured the other way served the first one's token
    without a fetch."""
    def provider(change):
        settings = oauth(issuer)
        return {**settings, "source": {**settings["source"], **change}}
    first_source = {"resource": ["https://api.example/?x=y"]}
    changed_source = {"extraParams": {"https://api.example/?x": "y"}}
    with StoreBroker(configuration(store, provider(first_source))) as first:
        before = token(first)
        assert first.stop() == 0
    with StoreBroker(configuration(store, provider(changed_source))) as second:
        served = token(second)
        assert served["access_token"] != before["access_token"], "served the other request's token"
        refused = log_lines(second, "stored record refused; fetching", "default")
        assert len(refused) == 1 and "other settings" in refused[0], second.stderr()


def test_a_rotated_hs256_secret_refuses_the_record_after_a_restart_and_after_a_reload(store, tmp_path):
    """An HS256 signer publishes no key (its JWKS is empty), so its records name the secret by
    its thumbprint: a token signed with the old secret is never served once the secret file is
    rotated, neither by a broker started again nor by the provider a reload makes anew."""
    secret_file = tmp_path / "hs256.secret"

    def rotate():
        secret = secrets.token_hex(32)
        SEEN.add(secret)
        secret_file.write_text(secret)
        secret_file.chmod(0o600)
        return secret

    old_secret = rotate()
    config = configuration(store, {"name": "default", "source": {"type": "jwt", "algorithm": "HS256",
                                                                 "keyFile": str(secret_file), "lifetimeSec": 300}})
    with StoreBroker(config) as first:
        before = token(first)
        jwt.decode(before["access_token"], old_secret, algorithms=["HS256"], audience="token-broker")
        assert first.stop() == 0
    new_secret = rotate()
    with StoreBroker(config) as second:
        served = token(second)
        assert served["access_token"] != before["access_token"], "served the token signed with the rotated secret"
        jwt.decode(served["access_token"], new_secret, algorithms=["HS256"], audience="token-broker")
        assert served["version"] == before["version"] + 1, "versions go on from the record's"
        refused = log_lines(second, "stored record refused; fetching", "default")
        assert len(refused) == 1 and "other settings" in refused[0], second.stderr()
        # A reload after another rotation: the provider is made anew, and reads the record again.
        newest_secret = rotate()
        status, _, body = second.request("POST", "/reload", listener="admin", timeout=90)
        assert status == 200 and json.loads(body)["changed"] == ["default"], body
        reloaded = token(second)
        assert reloaded["access_token"] != served["access_token"], "served the token signed with the rotated secret"
        jwt.decode(reloaded["access_token"], newest_secret, algorithms=["HS256"], audience="token-broker")
        assert reloaded["version"] == served["version"] + 1
        assert len(log_lines(second, "stored record refused; fetching", "default")) == 2, second.stderr()
        assert not any(secret in second.stderr() for secret in (old_secret, new_secret, newest_secret))


def test_a_long_poll_across_a_reload_is_not_answered_with_the_stored_token_it_holds(issuer, store):
    """A reload that changes a provider's setting other than its source makes a replacement that
    reads the record the old provider saved: the same token, which keeps its version, since a
    version grows only with a new token. A long-poll holding that version, handed over to the
    replacement, waits on for a newer token (304 at its timeout) instead of getting its own token
    back under a higher version; nothing is fetched."""
    with StoreBroker(configuration(store, oauth(issuer))) as broker:
        before = token(broker)
        fetched = issuer.requests()
        answer = {}

        def long_poll():
            answer["reply"] = broker.request(
                "GET", f"/providers/default/token/ready?after={before['version']}&timeout=5", timeout=30)

        waiter = threading.Thread(target=long_poll)
        waiter.start()
        assert wait_until(lambda: broker.metric("token_broker_longpoll_waiters", provider="default") == 1, timeout=10)
        path = os.path.join(broker.workdir, "config.json")
        with open(path + ".new", "w") as handle:
            json.dump(configuration(store, oauth(issuer, tokenRefreshDelaySec=200)), handle)
        os.replace(path + ".new", path)
        broker.process.send_signal(signal.SIGHUP)
        assert wait_until(lambda: 'msg="configuration reloaded"' in broker.stderr(), timeout=30), broker.stderr()
        assert "changed=default" in broker.stderr(), broker.stderr()
        waiter.join(30)
        assert not waiter.is_alive()
        status, headers, body = answer["reply"]
        assert status == 304, (status, body)
        assert headers.get("etag") == f'"{before["version"]}"', headers
        served = token(broker)
        assert (served["access_token"], served["version"]) == (before["access_token"], before["version"])
        assert issuer.requests() == fetched, "the replacement served the stored token without a fetch"


# Refused at start

@pytest.mark.parametrize("case", ACL_CASES)
def test_a_store_directory_with_a_default_acl_or_another_writer_in_its_acl_is_refused_at_start(tmp_path, case):
    """The store's directory is checked as a token file's is, ACLs included: a default ACL would
    pass its entries on to each record, and an access ACL may let others replace them."""
    store = Store(tmp_path)
    reason = set_acl(store.directory, case)
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"store": store.settings()}))
    for args in (["--check-config"], []):
        result = run_broker(*args, "--config", str(config), env=LISTEN)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert 'msg="invalid configuration"' in result.stderr and "store.path" in result.stderr, result.stderr
        assert reason in result.stderr and "record" in result.stderr, result.stderr
    assert os.listdir(store.directory) == []


def bad_store(tmp_path, case):
    """(store settings, text the refusal must hold) for each bad configuration."""
    store = Store(tmp_path)
    settings = store.settings()
    if case == "keyFile missing":
        del settings["keyFile"]
        return settings, "store.keyFile: is required"
    if case == "path missing":
        del settings["path"]
        return settings, "store.path: is required"
    if case in ("a key of 31 bytes", "64 characters that are not hex", "a key of 33 bytes"):
        store.key_file.write_bytes({"a key of 31 bytes": os.urandom(31), "a key of 33 bytes": os.urandom(33),
                                    "64 characters that are not hex": b"g" * 64}[case])
        return settings, f"store.keyFile: {store.key_file} holds no key; allowed: 32 bytes, or 64 hexadecimal digits"
    if case == "no key file":
        store.key_file.unlink()
        return settings, f"store.keyFile: cannot read {store.key_file}"
    if case == "redis without an address":
        return {"type": "redis", "keyFile": settings["keyFile"]}, "store.address: is required"
    if case == "redis at no address":
        return {"type": "redis", "keyFile": settings["keyFile"], "address": "redis"}, "is not a Redis address"
    if case == "redis with a username and no password":
        return ({"type": "redis", "keyFile": settings["keyFile"], "address": "127.0.0.1:6379", "username": "tb"},
                "store.username: needs passwordFile")
    if case == "unknown key":
        return {**settings, "colour": "blue"}, "store.colour: unknown key"
    if case == "no type":
        del settings["type"]
        return settings, "store.type: is required"
    if case == "a directory writable by others":
        store.directory.chmod(0o777)
        return settings, f"store.path: the directory {store.directory} is writable by other users"
    if case == "no directory":
        store.directory.rmdir()
        return settings, f"store.path: the directory {store.directory} does not exist"
    raise AssertionError(case)


@pytest.mark.parametrize("case", ["keyFile missing", "path missing", "a key of 31 bytes", "a key of 33 bytes",
                                  "64 characters that are not hex", "no key file", "redis without an address",
                                  "redis at no address", "redis with a username and no password", "unknown key", "no type",
                                  "a directory writable by others", "no directory"])
def test_a_bad_store_configuration_exits_2_with_the_reason_and_check_config_says_the_same(tmp_path, case):
    (tmp_path / "good").mkdir()
    (tmp_path / "good.json").write_text(json.dumps({"store": Store(tmp_path / "good").settings()}))
    assert run_broker("--check-config", "--config", str(tmp_path / "good.json")).returncode == 0, "a good one passes"
    settings, reason = bad_store(tmp_path, case)
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"store": settings}))
    for args in (["--config", str(config)], ["--check-config", "--config", str(config)]):
        result = run_broker(*args, env=LISTEN)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert 'msg="invalid configuration"' in result.stderr and reason in result.stderr, (args, result.stderr)
        assert not any(secret in result.stdout + result.stderr for secret in SEEN)
    assert not (tmp_path / "store").exists() or os.listdir(tmp_path / "store") == []
