"""Configuration reload: SIGHUP, `POST /reload` on the admin listener, and `token-broker reload`.

A reload reads the configuration file again, checks it as --check-config does, and compares the
providers by name: unchanged ones keep their token (no fetch at the issuer), changed ones get a
replacement that serves once it has its first token, removed ones answer their waiters 503 and
go, new ones start. An invalid file (422), a change that needs a restart (409) and a replacement
that gets no token within `reloadTimeoutSec` (503) change nothing. The issuer is a real OAuth 2.0
server (django-oauth-toolkit) that records every token request: each provider sends its own
name as `audience`, which the issuer ignores and records, so fetches are counted per provider
where they happen.
"""
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time

import jwt
import pytest

from broker import Broker, run_broker
from issuers.process import OAuthServer
from test_cli import assert_failure, closed_port
from test_http_api import get, read_answer, wait_until
from test_hardening import bearer, write_keys
from test_logs import logfmt
from test_skeleton import verify_with_jwks

SECRET = "s3cret-value-for-reload-tests"
# Long enough that no provider refreshes by itself during a test: every fetch counted is one a
# reload (or the test) caused.
LIFETIME = 600
RELOADED, NOT_RELOADED = "configuration reloaded", "configuration not reloaded"
RESULTS = ("reloaded", "invalid", "refused", "abandoned")
UNREACHABLE, REFUSED = 3, 5


@pytest.fixture(scope="module")
def issuer(tmp_path_factory):
    server = OAuthServer(str(tmp_path_factory.mktemp("reload")), {"reload": SECRET}, lifetime=LIFETIME)
    yield server
    server.close()


def provider(issuer, name, scope="read", retry=None, **source):
    """An oauth2 provider whose token requests carry its name as `audience`, for the issuer's records."""
    settings = {"type": "oauth2", "tokenURL": issuer.base + "/o/token/", "clientID": "reload",
                "clientSecret": SECRET, "scope": scope, "audience": name, **source}
    return {"name": name, "source": settings, "maxErrorTokenRefreshDelayMsec": 500, **(retry or {})}


def rewrite(broker, config):
    """Replaces the broker's configuration file (as an operator would: a new file renamed over it)."""
    path = os.path.join(broker.workdir, "config.json")
    text = config if isinstance(config, str) else json.dumps(config)
    with open(path + ".new", "w") as handle:
        handle.write(text)
    os.replace(path + ".new", path)


def post_reload(broker, timeout=90, **kwargs):
    """`POST /reload` on the admin listener: (status, JSON body). The answer comes once the reload has ended."""
    status, _, body = broker.request("POST", "/reload", listener="admin", timeout=timeout, **kwargs)
    try:
        document = json.loads(body)
    except ValueError:
        document = body
    return status, document


def fetched(issuer, since, name):
    """The token requests provider `name` sent the issuer after `since` (time.time())."""
    return [r for r in issuer.token_requests(since=since) if r["audience"] == [name]]


def served(broker, name):
    return broker.get_json(f"/providers/{name}/token")[0]


def first_token(broker, name):
    """An added provider's token, once it has one: a reload starts new providers, it does not wait for them."""
    return broker.get_json(f"/providers/{name}/token/ready?timeout=20", timeout=30)[0]


def sha256(text):
    return hashlib.sha256(text.encode()).hexdigest()


def log_entries(broker, message):
    """The broker's log lines with this `msg`, as dicts, in logfmt or JSON."""
    entries = []
    for line in broker.stderr().splitlines():
        fields = json.loads(line) if line.startswith("{") else logfmt(line)
        if fields.get("msg") == message:
            entries.append(fields)
    return entries


def names(entry, field):
    """A comma-separated list of provider names in a log field, as a sorted list; empty when left out."""
    return sorted(name for name in entry.get(field, "").split(",") if name)


def reloads(broker):
    return {result: broker.metric("token_broker_reloads_total", result=result) for result in RESULTS}


def counted(**wanted):
    return {result: wanted.get(result, 0) for result in RESULTS}


def assert_outcome(document, added=(), changed=(), removed=(), unchanged=()):
    """A successful reload's answer lists each provider where it belongs."""
    assert isinstance(document, dict) and document.get("reloaded") is True, document
    for key, wanted in (("added", added), ("changed", changed), ("removed", removed), ("unchanged", unchanged)):
        assert sorted(document[key]) == sorted(wanted), (key, document)


def assert_logged_reload(broker, added=(), changed=(), removed=(), unchanged=()):
    assert wait_until(lambda: log_entries(broker, RELOADED), timeout=10), \
        f"no line with msg={json.dumps(RELOADED)} in the log:\n{broker.stderr()}"
    entry = log_entries(broker, RELOADED)[-1]
    assert entry["level"] == "info", entry
    for field, wanted in (("added", added), ("changed", changed), ("removed", removed), ("unchanged", unchanged)):
        assert names(entry, field) == sorted(wanted), (field, entry)


def assert_logged_refusal(broker, mentions=()):
    """The last "configuration not reloaded" line is an error with a problem that says why."""
    assert wait_until(lambda: log_entries(broker, NOT_RELOADED), timeout=10), \
        f"no line with msg={json.dumps(NOT_RELOADED)} in the log:\n{broker.stderr()}"
    entry = log_entries(broker, NOT_RELOADED)[-1]
    assert entry["level"] == "error", entry
    assert entry.get("problem"), entry
    for text in mentions:
        assert text in entry["problem"], (text, entry)
    return entry


def assert_still_running(broker, config, providers):
    """The broker still runs `config`: its file again reloads with every provider unchanged."""
    rewrite(broker, config)
    status, document = post_reload(broker)
    assert status == 200, document
    assert_outcome(document, unchanged=providers)


def readyz_names(broker):
    _, _, body = broker.request("GET", "/readyz", listener="admin")
    return {entry["name"] for entry in json.loads(body)["providers"]}


# What a reload does to providers

def test_a_reload_adds_changes_and_removes_providers_fetching_only_for_the_new_and_the_changed(issuer):
    with Broker({"providers": [provider(issuer, "keep"), provider(issuer, "change"), provider(issuer, "drop")]}) as broker:
        before = {name: served(broker, name) for name in ("keep", "change", "drop")}
        assert before["change"]["scope"] == "read"
        assert reloads(broker) == counted()
        since = time.time()
        rewrite(broker, {"providers": [provider(issuer, "keep"), provider(issuer, "change", scope="write"),
                                       provider(issuer, "add")]})
        status, document = post_reload(broker)
        assert status == 200, document
        assert_outcome(document, added=["add"], changed=["change"], removed=["drop"], unchanged=["keep"])
        # The answer came once the reload had ended: what follows holds at once, without waiting.
        # Unchanged: the same token and version, and the issuer saw nothing.
        keep = served(broker, "keep")
        assert (keep["access_token"], keep["version"]) == (before["keep"]["access_token"], before["keep"]["version"])
        assert fetched(issuer, since, "keep") == []
        assert broker.get_json("/token")[0]["access_token"] == keep["access_token"], "keep is still the first"
        # Changed: one fetch, for the new scope, and the token it got is the one served.
        [request] = fetched(issuer, since, "change")
        assert request["status"] == 200 and request["scope"] == ["write"] and request["issued_scope"] == "write"
        change = served(broker, "change")
        assert change["access_token"] != before["change"]["access_token"]
        assert sha256(change["access_token"]) == request["token_sha256"] and change["scope"] == "write"
        assert issuer.get("/api/hello", change["access_token"]) == 200
        # Removed: unknown from now on, and no fetch.
        status, _, body = broker.request("GET", "/providers/drop/token")
        assert status == 404 and json.loads(body)["error"] == "unknown_provider", body
        assert fetched(issuer, since, "drop") == []
        # Added: fetched once, served.
        added = first_token(broker, "add")
        [request] = fetched(issuer, since, "add")
        assert sha256(added["access_token"]) == request["token_sha256"]
        assert readyz_names(broker) == {"keep", "change", "add"}
        assert_logged_reload(broker, added=["add"], changed=["change"], removed=["drop"], unchanged=["keep"])
        assert reloads(broker) == counted(reloaded=1)
        assert broker.process.poll() is None


def test_a_changed_provider_serves_its_old_token_until_its_replacement_has_one(issuer):
    config = {"reloadTimeoutSec": 60, "providers": [provider(issuer, "keep"), provider(issuer, "change")]}
    with Broker(config) as broker:
        old = served(broker, "change")
        rewrite(broker, {**config, "providers": [provider(issuer, "keep"), provider(issuer, "change", scope="write")]})
        answer = {}

        def reload_in_background():
            answer["status"], answer["document"] = post_reload(broker, timeout=120)

        since = time.time()
        issuer.fault("hang")  # the replacement's token request gets no answer while the fault lasts
        reloading = threading.Thread(target=reload_in_background)
        try:
            reloading.start()
            assert wait_until(lambda: any(outcome == "hang" for _, outcome in issuer.attempts(since)), timeout=20), \
                "the replacement never asked for its token"
            meanwhile = served(broker, "change")
            assert meanwhile["access_token"] == old["access_token"] and meanwhile["scope"] == "read", \
                "the old provider serves until its replacement has a token"
            assert broker.get_json("/token")[0]["provider"] == "keep"
            assert reloading.is_alive(), "POST /reload answered before the replacement had its token"
            assert reloads(broker) == counted()
        finally:
            issuer.fault("none")
        reloading.join(90)
        assert not reloading.is_alive()
        assert answer["status"] == 200, answer
        assert_outcome(answer["document"], changed=["change"], unchanged=["keep"])
        now = served(broker, "change")
        assert now["scope"] == "write" and now["access_token"] != old["access_token"]
        assert fetched(issuer, since, "keep") == []


def test_long_polls_across_a_reload_the_unchanged_providers_is_answered_the_removed_providers_gets_503(issuer):
    with Broker({"providers": [provider(issuer, "keep"), provider(issuer, "drop")]}) as broker:
        versions = {name: served(broker, name)["version"] for name in ("keep", "drop")}
        answers = {}

        def long_poll(name):
            answers[name] = broker.request(
                "GET", f"/providers/{name}/token/ready?after={versions[name]}&timeout=40", timeout=60)

        waiters = {name: threading.Thread(target=long_poll, args=(name,)) for name in versions}
        for waiter in waiters.values():
            waiter.start()
        waiting = lambda name: broker.metric("token_broker_longpoll_waiters", provider=name)
        assert wait_until(lambda: waiting("keep") == 1 and waiting("drop") == 1, timeout=10)
        rewrite(broker, {"providers": [provider(issuer, "keep")]})
        status, document = post_reload(broker)
        assert status == 200, document
        assert_outcome(document, removed=["drop"], unchanged=["keep"])
        # The removed provider's waiter is answered 503 shutting_down.
        waiters["drop"].join(30)
        assert not waiters["drop"].is_alive(), "the removed provider's waiter was left waiting"
        status, _, body = answers["drop"]
        assert status == 503 and json.loads(body)["error"] == "shutting_down", (status, body)
        # The unchanged provider's waiter is still there, and a forced refresh answers it.
        assert waiters["keep"].is_alive() and waiting("keep") == 1, "the unchanged provider's waiter was dropped"
        since = time.time()
        status, _, body = broker.request("POST", "/providers/keep/token/refresh",
                                         body=json.dumps({"rejected_version": versions["keep"]}).encode())
        assert status == 200, body
        waiters["keep"].join(30)
        assert not waiters["keep"].is_alive()
        status, _, body = answers["keep"]
        assert status == 200, (status, body)
        token = json.loads(body)
        assert token["version"] > versions["keep"] and token["provider"] == "keep"
        [request] = fetched(issuer, since, "keep")
        assert sha256(token["access_token"]) == request["token_sha256"]


def test_a_key_files_new_contents_make_its_provider_changed(tmp_path):
    def make_key(path):
        subprocess.run(["openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
                        "-out", str(path) + ".new"], check=True, capture_output=True)
        os.replace(str(path) + ".new", str(path))

    signing, other = tmp_path / "signing.pem", tmp_path / "other.pem"
    make_key(signing)
    make_key(other)
    config = {"providers": [{"name": "signer", "source": {"type": "jwt", "keyFile": str(signing)}},
                            {"name": "other", "source": {"type": "jwt", "keyFile": str(other)}}]}
    with Broker(config) as broker:
        old = served(broker, "signer")
        other_before = served(broker, "other")
        old_kid = jwt.get_unverified_header(old["access_token"])["kid"]
        make_key(signing)  # the same configuration file, another key in the file it names
        status, document = post_reload(broker)
        assert status == 200, document
        assert_outcome(document, changed=["signer"], unchanged=["other"])
        new = served(broker, "signer")
        kid = jwt.get_unverified_header(new["access_token"])["kid"]
        assert kid != old_kid, "the new token is signed with the new key"
        public = subprocess.run(["openssl", "pkey", "-in", str(signing), "-pubout"], check=True,
                                capture_output=True).stdout
        jwt.decode(new["access_token"], public, algorithms=["ES256"], audience="token-broker")
        published = {key["kid"]: key for key in broker.get_json("/.well-known/jwks.json")[0]["keys"]}
        assert kid in published, "the new key is published"
        jwt.decode(new["access_token"], jwt.PyJWK(published[kid]).key, algorithms=["ES256"], audience="token-broker")
        assert served(broker, "other")["access_token"] == other_before["access_token"]
        assert broker.fetches("other") == 1


def test_an_unchanged_signer_with_a_key_made_at_start_keeps_it_in_the_jwks():
    # Reading the file again makes a new key for a signer without keyFile; an unchanged provider
    # keeps signing with the key it made at start, and the JWKS must go on publishing that one.
    with Broker({"providers": [{"name": "signer", "source": {"type": "jwt"}}]}) as broker:
        token = served(broker, "signer")["access_token"]
        before = broker.get_json("/.well-known/jwks.json")[0]
        status, document = post_reload(broker)
        assert status == 200, document
        assert_outcome(document, unchanged=["signer"])
        assert broker.get_json("/.well-known/jwks.json")[0] == before
        kid = jwt.get_unverified_header(token)["kid"]
        published = {key["kid"]: key for key in before["keys"]}
        jwt.decode(token, jwt.PyJWK(published[kid]).key, algorithms=["ES256"], audience="token-broker")
        assert served(broker, "signer")["access_token"] == token


def preload_library(tmp_path, name):
    """Tests/integration/preload/NAME.c built as a shared library, for the broker's LD_PRELOAD:
    `key_log` logs the keys it generates and the files it opens in one directory; `slow_disk`
    holds one call on a token file's temporary file up, as a slow disk would; `clock_skew` moves
    the wall clock (test_store_trust.py)."""
    compiler = shutil.which("cc") or shutil.which("clang")
    assert compiler, f"a C compiler (cc, or the Swift toolchain's clang) builds the {name} library"
    source = os.path.join(os.path.dirname(__file__), "preload", f"{name}.c")
    library = str(tmp_path / f"{name}.so")
    subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-o", library, source, "-ldl"], check=True, timeout=120)
    return library


def test_a_reload_makes_keys_and_reads_key_files_only_for_the_providers_it_adds_or_changes(tmp_path):
    """A reload compares the providers before it makes their sources: an unchanged signer keeps
    its key, so none is generated (an RSA key takes a good part of a second of CPU) nor read
    again for it. Each reload of an unchanged file made a key for every signer without keyFile
    and threw it away: three RS256 signers, ten reloads, 8.6 s of CPU. Counted through a
    preloaded library that logs each key generation and each open of a file in the keys'
    directory, never through time."""
    keys = tmp_path / "keys"
    keys.mkdir()
    for name in ("filed", "tuned"):
        subprocess.run(["openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
                        "-out", str(keys / f"{name}.pem")], check=True, capture_output=True)
    log = tmp_path / "keys.log"
    environment = {"LD_PRELOAD": preload_library(tmp_path, "key_log"), "KEY_LOG": str(log), "KEY_LOG_DIRECTORY": str(keys)}
    if os.environ.get("ASAN_OPTIONS") is not None:
        environment["ASAN_OPTIONS"] = os.environ["ASAN_OPTIONS"] + ":verify_asan_link_order=0"

    def config(audience):
        return {"providers": [
            {"name": "made1", "source": {"type": "jwt", "algorithm": "RS256"}},
            {"name": "made2", "source": {"type": "jwt", "algorithm": "RS256", "audience": audience}},
            {"name": "filed", "source": {"type": "jwt", "keyFile": str(keys / "filed.pem")}},
            {"name": "tuned", "source": {"type": "jwt", "keyFile": str(keys / "tuned.pem"), "audience": audience}}]}

    def logged():
        return log.read_text().splitlines() if log.exists() else []

    def opened(lines, name):
        return lines.count(f"open {keys / name}")

    with Broker(config("a"), env=environment) as broker:
        assert logged().count("keygen RSA") == 2, logged()
        kids = {name: jwt.get_unverified_header(served(broker, name)["access_token"])["kid"]
                for name in ("made1", "made2")}
        jwks = broker.get_json("/.well-known/jwks.json")[0]
        for _ in range(3):
            status, document = post_reload(broker)
            assert status == 200, document
            assert_outcome(document, unchanged=["made1", "made2", "filed", "tuned"])
        assert logged().count("keygen RSA") == 2, "a reload of an unchanged file generated keys:\n" + "\n".join(logged())
        assert broker.get_json("/.well-known/jwks.json")[0] == jwks
        # One signer of each kind changed: only theirs are made again.
        before = len(logged())
        rewrite(broker, config("b"))
        status, document = post_reload(broker)
        assert status == 200, document
        assert_outcome(document, changed=["made2", "tuned"], unchanged=["made1", "filed"])
        lines = logged()[before:]
        assert lines.count("keygen RSA") == 1, lines
        # Both key files are read to compare them; only the changed provider's is loaded besides.
        assert opened(lines, "tuned.pem") >= 1, lines
        assert opened(lines, "filed.pem") < opened(lines, "tuned.pem"), lines
        assert jwt.get_unverified_header(served(broker, "made1")["access_token"])["kid"] == kids["made1"]
        new_kid = jwt.get_unverified_header(served(broker, "made2")["access_token"])["kid"]
        assert new_kid != kids["made2"]
        published = [key["kid"] for key in broker.get_json("/.well-known/jwks.json")[0]["keys"]]
        assert kids["made1"] in published and new_kid in published and kids["made2"] in published, published


def test_a_reload_that_opens_access_or_exposes_a_secret_file_warns_as_a_start_would(tmp_path):
    # A reload may turn the request guard off or name a secret file others can read: the log
    # says so, as it does at start, not only when the broker is started next.
    key = tmp_path / "hs256.key"
    key.write_text(os.urandom(32).hex())  # hex: the secret file reader drops a trailing newline
    key.chmod(0o644)
    with Broker({"providers": [{"name": "default"}]}) as broker:
        served(broker, "default")
        assert " level=warn " not in broker.stderr(), broker.stderr()
        rewrite(broker, {"requestGuard": False, "providers": [
            {"name": "default"},
            {"name": "h", "source": {"type": "jwt", "algorithm": "HS256", "keyFile": str(key)}}]})
        status, document = post_reload(broker)
        assert status == 200, document
        assert_outcome(document, added=["h"], unchanged=["default"])
        warnings = [line for line in broker.stderr().splitlines() if " level=warn " in line]
        assert any("the request guard is off" in line for line in warnings), broker.stderr()
        assert any("a secret file can be read by other users" in line and str(key) in line for line in warnings), \
            broker.stderr()


def test_caller_keys_may_name_a_provider_the_reload_adds_and_not_one_it_removes(tmp_path):
    key = "caller-key-for-reload-tests"
    keys = tmp_path / "callers.json"
    write_keys(keys, [("billing", key, ["default"])])
    config = {"clientKeysFile": str(keys), "providers": [{"name": "default"}]}
    with Broker(config) as broker:
        # The keys file names "orders" before the broker has it: the file's watch refuses it.
        write_keys(keys, [("billing", key, ["default", "orders"])])
        assert wait_until(lambda: "caller keys not reloaded" in broker.stderr(), timeout=15), broker.stderr()
        rewrite(broker, {**config, "providers": [{"name": "default"}, {"name": "orders"}]})
        status, document = post_reload(broker)
        assert status == 200, document
        assert_outcome(document, added=["orders"], unchanged=["default"])
        assert broker.request("GET", "/providers/orders/token", headers=bearer(key))[0] == 200
        # A file that would name a provider the reload removes is refused, as at start.
        rewrite(broker, config)
        status, document = post_reload(broker)
        assert status == 422 and document["error"] == "invalid_configuration", document
        assert "orders" in document["error_description"]
        assert broker.request("GET", "/providers/orders/token", headers=bearer(key))[0] == 200


def test_a_changed_signers_old_key_stays_in_the_jwks_while_its_tokens_live():
    # A signer without keyFile makes a new key when its settings change; the tokens the old key
    # signed are valid for their lifetime, so the JWKS goes on publishing it.
    config = {"providers": [{"name": "signer", "source": {"type": "jwt", "audience": "a", "lifetimeSec": 600}}]}
    with Broker(config) as broker:
        old = served(broker, "signer")["access_token"]
        rewrite(broker, {"providers": [{"name": "signer", "source": {"type": "jwt", "audience": "b", "lifetimeSec": 600}}]})
        status, document = post_reload(broker)
        assert status == 200, document
        assert_outcome(document, changed=["signer"])
        new = served(broker, "signer")["access_token"]
        published = {key["kid"]: key for key in broker.get_json("/.well-known/jwks.json")[0]["keys"]}
        for token, audience in ((old, "a"), (new, "b")):
            kid = jwt.get_unverified_header(token)["kid"]
            assert kid in published, f"the key of the token for {audience} is published"
            jwt.decode(token, jwt.PyJWK(published[kid]).key, algorithms=["ES256"], audience=audience)
        assert len(published) == 2


def make_ec_key(path):
    subprocess.run(["openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
                    "-out", str(path) + ".new"], check=True, capture_output=True)
    os.replace(str(path) + ".new", str(path))


def test_a_new_key_under_a_configured_kid_is_refused_while_the_old_keys_tokens_live(tmp_path):
    # A key file rotated under a fixed kid ("2026-11"): the reload took, the JWKS published the
    # new key alone under the kid, and the tokens of the last hour failed verification, though
    # the JWKS keeps a changed signer's key for its tokens' lifetime.
    key = tmp_path / "key.pem"
    make_ec_key(key)

    def config(audience, kid="2026-11"):
        return {"providers": [{"name": "signer", "source": {
            "type": "jwt", "keyFile": str(key), "kid": kid, "audience": audience, "lifetimeSec": 3600}}]}

    with Broker(config("a")) as broker:
        first = served(broker, "signer")["access_token"]
        assert verify_with_jwks(broker, first, audience="a")
        # The same key under the same kid with other claims: one key published, both tokens verify.
        rewrite(broker, config("b"))
        status, document = post_reload(broker)
        assert status == 200, document
        assert_outcome(document, changed=["signer"])
        second = served(broker, "signer")["access_token"]
        assert second != first
        assert [k["kid"] for k in broker.get_json("/.well-known/jwks.json")[0]["keys"]] == ["2026-11"]
        assert verify_with_jwks(broker, first, audience="a") and verify_with_jwks(broker, second, audience="b")
        # Another key in the file, the kid kept: refused, and nothing changes.
        make_ec_key(key)
        status, document = post_reload(broker)
        assert status == 422 and document["error"] == "invalid_configuration", document
        for text in ("providers[0].source.kid", "signer", "2026-11", "another kid"):
            assert text in document["error_description"], (text, document)
        assert_logged_refusal(broker, ["2026-11"])
        assert reloads(broker) == counted(reloaded=1, invalid=1)
        assert served(broker, "signer")["access_token"] == second
        assert verify_with_jwks(broker, first, audience="a") and verify_with_jwks(broker, second, audience="b")
        # The new key under a kid of its own: taken; each key is published under its kid, and every token verifies.
        rewrite(broker, config("b", kid="2026-12"))
        status, document = post_reload(broker)
        assert status == 200, document
        assert_outcome(document, changed=["signer"])
        third = served(broker, "signer")["access_token"]
        assert jwt.get_unverified_header(third)["kid"] == "2026-12"
        kids = [k["kid"] for k in broker.get_json("/.well-known/jwks.json")[0]["keys"]]
        assert kids == ["2026-12", "2026-11"], kids
        for token, audience in ((first, "a"), (second, "b"), (third, "b")):
            assert verify_with_jwks(broker, token, audience=audience)


def test_a_key_kept_across_a_shorter_lifetime_stays_published_for_the_tokens_it_signed_before(tmp_path):
    # A key's retirement was counted from lifetimeSec at the reload that retired it: lowered
    # from 600 to 2 (same key, same kid), then the key rotated to another kid, the old key left
    # the JWKS 2 s later though a token it signed had ten minutes left, and a new key was let in
    # under its kid (review 7, F2).
    keys = {name: tmp_path / f"{name}.pem" for name in ("first", "second", "third")}
    for path in keys.values():
        make_ec_key(path)

    def config(key, lifetime, kid):
        return {"providers": [{"name": "signer", "source": {
            "type": "jwt", "keyFile": str(keys[key]), "kid": kid, "lifetimeSec": lifetime}}]}

    with Broker(config("first", 600, "k")) as broker:
        token = served(broker, "signer")["access_token"]
        for step in (config("first", 2, "k"), config("second", 2, "k2")):
            rewrite(broker, step)
            status, document = post_reload(broker)
            assert status == 200, document
        time.sleep(3)
        assert verify_with_jwks(broker, token), "the first key's token, ten minutes left, still verifies"
        rewrite(broker, config("third", 2, "k"))
        status, document = post_reload(broker)
        assert status == 422 and '"k"' in document["error_description"], document
        assert verify_with_jwks(broker, token)


@pytest.mark.parametrize("case", ["a key made at start", "another provider's kid"])
def test_a_reload_that_would_publish_another_key_under_a_kid_still_in_use_is_refused(tmp_path, case):
    # Without keyFile, each change of a provider makes it a new key; under a configured kid it
    # took the old key's place in the JWKS. A provider removed with its kid, and another that
    # takes the kid with another key, did the same.
    if case == "a key made at start":
        before = [{"name": "signer", "source": {"type": "jwt", "kid": "main", "audience": "a", "lifetimeSec": 600}}]
        after = [{"name": "signer", "source": {"type": "jwt", "kid": "main", "audience": "b", "lifetimeSec": 600}}]
        mentions = ["providers[0].source.kid", '"signer"', '"main"', "keyFile"]
    else:
        before = [{"name": "alpha", "source": {"type": "jwt", "kid": "main", "audience": "a", "lifetimeSec": 600}}]
        after = [{"name": "beta", "source": {"type": "jwt", "kid": "main", "audience": "a", "lifetimeSec": 600}}]
        mentions = ["providers[0].source.kid", '"beta"', '"alpha"', '"main"']
    name = before[0]["name"]
    with Broker({"providers": before}) as broker:
        token = served(broker, name)["access_token"]
        jwks = broker.get_json("/.well-known/jwks.json")[0]
        rewrite(broker, {"providers": after})
        status, document = post_reload(broker)
        assert status == 422 and document["error"] == "invalid_configuration", document
        for text in mentions:
            assert text in document["error_description"], (text, document)
        assert broker.get_json("/.well-known/jwks.json")[0] == jwks
        assert served(broker, name)["access_token"] == token
        assert verify_with_jwks(broker, token, audience="a")
        assert_still_running(broker, {"providers": before}, [name])


def test_the_jwks_keeps_at_most_sixteen_retired_keys_the_newest():
    # Each reload that changes a signer without keyFile makes a key; the retired ones are
    # published while their tokens live, but neither the JWKS nor memory grows without bound.
    def config(n):
        return {"providers": [{"name": "signer", "source": {"type": "jwt", "audience": f"a{n}", "lifetimeSec": 600}}]}

    with Broker(config(0)) as broker:
        kids = [jwt.get_unverified_header(served(broker, "signer")["access_token"])["kid"]]
        for n in range(1, 21):
            rewrite(broker, config(n))
            status, document = post_reload(broker)
            assert status == 200, document
            kids.append(jwt.get_unverified_header(served(broker, "signer")["access_token"])["kid"])
        assert len(set(kids)) == 21, "each change made a key"
        published = [key["kid"] for key in broker.get_json("/.well-known/jwks.json")[0]["keys"]]
        assert published == [kids[-1]] + kids[-17:-1], "the current key, then the 16 newest retired ones"


@pytest.mark.parametrize("room", [1, 2])
def test_a_token_file_of_a_template_moves_to_other_values_when_the_template_has_room(issuer, tmp_path, room):
    # The file's old child stays until it has been idle for childIdleSec: the new one needs room
    # beside it. Without room the reload is refused, and the old writer goes on as it was.
    template = {**provider(issuer, "t"), "perRequest": ["audience"], "allowedAudiences": ["https://t.example/*"],
                "maxChildren": room}
    path = str(tmp_path / "t.token")

    def config(audience):
        return {"providers": [template], "sinks": [{"provider": "t", "audience": audience, "path": path,
                                                    "format": "token", "mode": "0600"}]}

    with Broker(config("https://t.example/one")) as broker:
        assert wait_until(lambda: os.path.exists(path), timeout=20)
        first = open(path).read()
        since = time.time()
        rewrite(broker, config("https://t.example/two"))
        status, document = post_reload(broker)
        readiness = broker.get_json("/readyz", listener="admin")[0]
        assert readiness["ready"] and readiness["sinks"][0]["ready"], readiness
        if room == 1:
            assert status == 422 and "maxChildren 1" in document["error_description"], document
            assert open(path).read() == first
            rewrite(broker, config("https://t.example/one"))
            status, document = post_reload(broker)
            assert status == 200, document
            assert_outcome(document, unchanged=["t"])
            assert broker.get_json("/readyz", listener="admin")[0]["sinks"][0]["ready"]
            return
        assert status == 200, document
        assert_outcome(document, unchanged=["t"])
        [record] = [r for r in issuer.token_requests(since=since) if r["audience"] == ["https://t.example/two"]]
        assert wait_until(lambda: sha256(open(path).read().strip()) == record["token_sha256"], timeout=20)


def sink_template():
    """A template of a local signer with room for one child, which a token file holds."""
    return {"name": "t", "perRequest": ["audience"], "allowedAudiences": ["https://t.example/*"],
            "maxChildren": 1, "source": {"type": "jwt", "lifetimeSec": 600}}


def private_directory(path):
    """Makes a directory only its owner can write, as a token file's must be."""
    path.mkdir()
    path.chmod(0o700)
    return path


def refresh_child(broker, audience, version):
    """A forced refresh of the template child for `audience` (its `version` refused); waits out a 429."""
    for _ in range(100):
        status, _, body = broker.request("POST", f"/providers/t/token/refresh?audience={audience}",
                                         body=json.dumps({"rejected_version": version}).encode())
        if status != 429:
            break
        time.sleep(0.2)
    assert status == 200, (status, body)
    renewed = json.loads(body)
    assert renewed["version"] > version, renewed
    return renewed


def sink_report(broker, path):
    """What /readyz says of the token file `path`, ready or not."""
    _, _, body = broker.request("GET", "/readyz", listener="admin")
    return next(sink for sink in json.loads(body)["sinks"] if sink["path"] == path)


def read_file(path):
    """The file's contents; None while there is none."""
    try:
        with open(path) as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def test_readyz_reports_the_token_file_writers_a_reload_that_did_not_take_started_again(tmp_path):
    """A reload that restarted the token files and then did not take (here: the template has
    no room for the new file's child, 422) left /readyz asking the writers it had stopped: it
    went on reporting the version they last wrote, ready or not, while other writers wrote the
    file; once that version expired it answered 503 for a file that held a valid token."""
    directory = private_directory(tmp_path / "d1")
    path = str(directory / "t.token")
    one = "https://t.example/one"

    def config(audience):
        return {"providers": [sink_template()], "sinks": [{"provider": "t", "audience": audience, "path": path}]}

    with Broker(config(one)) as broker:
        assert wait_until(lambda: sink_report(broker, path).get("version") is not None, timeout=20)
        written = sink_report(broker, path)["version"]
        rewrite(broker, config("https://t.example/two"))
        status, document = post_reload(broker)
        assert status == 422 and "maxChildren 1" in document["error_description"], document
        renewed = refresh_child(broker, one, written)
        assert wait_until(lambda: read_file(path) == renewed["access_token"], timeout=20), \
            "the token file's writer wrote the new token"
        assert wait_until(lambda: sink_report(broker, path).get("version") == renewed["version"], timeout=20), \
            ("/readyz reports the writer that wrote it", sink_report(broker, path), renewed["version"])
        readiness = broker.get_json("/readyz", listener="admin")[0]
        assert readiness["ready"] and readiness["sinks"][0]["ready"], readiness


def test_readyz_stays_ready_through_reloads_that_move_a_token_file_to_another_provider(tmp_path):
    """A reload that takes stops the old writers and starts the new ones; /readyz reported the
    new ones at once, before their first write, so it answered 503 ("ready": false) for a moment
    at every such reload (a review saw 231 of 653 answers over 30 reloads). It reports them once
    they have written; until then the old ones, with the valid token they wrote."""
    directory = private_directory(tmp_path / "d1")
    path = str(directory / "t.token")
    signers = [{"name": name, "source": {"type": "jwt", "audience": name, "lifetimeSec": 600}} for name in ("p1", "p2")]

    def config(name):
        return {"providers": signers, "sinks": [{"provider": name, "path": path}]}

    with Broker(config("p1")) as broker:
        assert wait_until(lambda: sink_report(broker, path).get("ready"), timeout=20)
        answers, stop = [], threading.Event()

        def poll():
            deadline = time.monotonic() + 120
            while not stop.is_set() and time.monotonic() < deadline:
                status, _, body = broker.request("GET", "/readyz", listener="admin")
                answers.append((status, body))

        poller = threading.Thread(target=poll)
        poller.start()
        try:
            for turn in range(12):
                name = "p2" if turn % 2 == 0 else "p1"
                rewrite(broker, config(name))
                status, document = post_reload(broker)
                assert status == 200, document
                assert sink_report(broker, path)["provider"] == name
        finally:
            stop.set()
            poller.join(30)
        not_ready = [body for status, body in answers if status != 200]
        assert len(answers) >= 12 and not not_ready, f"{len(not_ready)} of {len(answers)} answers not ready: {not_ready[:2]}"


@pytest.mark.parametrize("change", ["opened to others", "renamed"])
def test_after_a_reload_that_did_not_take_the_token_file_is_written_through_the_directory_opened_at_start(
        tmp_path, change):
    """A reload that did not take started the old writers again by opening their directories
    by path and checking them anew: a directory opened to others since start (chmod 777) then
    left no writer at all until a restart, and one renamed and replaced got the token in the
    replacement, where README says a directory replaced later receives nothing."""
    directory = private_directory(tmp_path / "d1")
    path = str(directory / "t.token")
    one = "https://t.example/one"
    config = {"providers": [sink_template()], "sinks": [{"provider": "t", "audience": one, "path": path}]}
    with Broker(config) as broker:
        assert wait_until(lambda: sink_report(broker, path).get("version") is not None, timeout=20)
        written = sink_report(broker, path)["version"]
        if change == "opened to others":
            directory.chmod(0o777)
            opened = directory
        else:
            opened = tmp_path / "d1-moved"
            directory.rename(opened)
            private_directory(directory)
        # The file moves to another directory and another child, for which the template has no room.
        other = private_directory(tmp_path / "d2")
        rewrite(broker, {**config, "sinks": [{"provider": "t", "audience": "https://t.example/two",
                                               "path": str(other / "t.token")}]})
        status, document = post_reload(broker)
        assert status == 422 and "maxChildren 1" in document["error_description"], document
        renewed = refresh_child(broker, one, written)
        assert wait_until(lambda: read_file(str(opened / "t.token")) == renewed["access_token"], timeout=20), \
            ("the directory opened at start holds the new token", broker.stderr())
        assert "token files not started again" not in broker.stderr()
        if change == "renamed":
            assert not os.path.exists(path), "the directory that replaced the one opened at start receives nothing"
        assert not os.path.exists(other / "t.token")
        # The writer records the version just after the rename that shows the file.
        assert wait_until(lambda: sink_report(broker, path)["version"] == renewed["version"], timeout=20), \
            sink_report(broker, path)
        report = sink_report(broker, path)
        if change == "renamed":
            # Readers of the path no longer see the writes: /readyz says so.
            assert not report["ready"] and "was renamed or replaced" in report["problem"], report
        else:
            assert report["ready"] and "problem" not in report, report


def test_an_abandoned_reload_writes_nothing_of_the_new_configuration_into_the_token_files(tmp_path):
    """README: an abandoned reload changes nothing and the old writers go on. The new writers
    wrote each file as soon as their provider had a token, and an abandoned reload then put the
    old ones back: for up to reloadTimeoutSec a file held another provider's token, from a
    configuration that did not take."""
    directory = private_directory(tmp_path / "run")
    first, second = str(directory / "first.token"), str(directory / "second.token")
    signers = [{"name": "p1", "source": {"type": "jwt", "audience": "a", "lifetimeSec": 600}},
               {"name": "p2", "source": {"type": "jwt", "audience": "b", "lifetimeSec": 600}}]
    config = {"reloadTimeoutSec": 2, "providers": signers,
              "sinks": [{"provider": "p1", "path": first}, {"provider": "p1", "path": second}]}
    # The second file's new provider never gets a token: its issuer is a closed port. A template
    # is not waited for before the token files are, so the reload reaches them and is abandoned there.
    down = {"name": "down", "perRequest": ["audience"], "allowedAudiences": ["https://down.example/*"],
            "maxErrorTokenRefreshDelayMsec": 500,
            "source": {"type": "oauth2", "tokenURL": f"http://127.0.0.1:{closed_port()}/token", "clientID": "c",
                       "clientSecret": "not-used"}}
    with Broker(config) as broker:
        assert wait_until(lambda: read_file(first) is not None and read_file(second) is not None, timeout=20)
        old = served(broker, "p1")["access_token"]
        new = served(broker, "p2")["access_token"]
        assert read_file(first) == old and read_file(second) == old
        rewrite(broker, {**config, "providers": [*signers, down],
                         "sinks": [{"provider": "p2", "path": first},
                                   {"provider": "down", "audience": "https://down.example/x", "path": second}]})
        status, document = post_reload(broker)
        assert status == 503 and document["error"] == "reload_abandoned", document
        assert second in document["error_description"], document
        new_fingerprint = "sha256:" + sha256(new)[:12]
        writes = [line for line in broker.stderr().splitlines() if "msg=\"token file written" in line]
        assert not [line for line in writes if new_fingerprint in line], \
            "the new provider's token was written into a file of the configuration that stays"
        assert read_file(first) == old and read_file(second) == old
        readiness = broker.get_json("/readyz", listener="admin")[0]
        assert readiness["ready"] and [sink["provider"] for sink in readiness["sinks"]] == ["p1", "p1"], readiness
        assert_still_running(broker, config, ["p1", "p2"])


def slow_disk_environment(library, trigger, call="create", seconds=15):
    environment = {"LD_PRELOAD": library, "SLOW_DISK_TRIGGER": trigger, "SLOW_DISK_CALL": call,
                   "SLOW_DISK_SECONDS": str(seconds)}
    if os.environ.get("ASAN_OPTIONS") is not None:
        # AddressSanitizer's runtime wants to come first among the preloaded libraries.
        environment["ASAN_OPTIONS"] = os.environ["ASAN_OPTIONS"] + ":verify_asan_link_order=0"
    return environment


def test_a_write_held_up_past_its_writer_s_stop_never_lands_over_the_new_writer_s_token(tmp_path):
    """At a reload the old token-file writers are given 2 s to end a write under way, then the new
    ones start. An old write held up longer (here the creation of its temporary file takes 15 s:
    a slow disk) went on and renamed its token over the one the new writer had written: the
    file went back to the old provider's token, from a configuration the reload had replaced,
    until the new provider's next refresh. The old writer is retired now: its late write is
    abandoned before its rename."""
    library = preload_library(tmp_path, "slow_disk")
    trigger = str(tmp_path / "slow-next-create")
    directory = private_directory(tmp_path / "run")
    path = str(directory / "t.token")
    signers = [{"name": name, "source": {"type": "jwt", "audience": name, "lifetimeSec": 600}} for name in ("p1", "p2")]

    def config(name):
        return {"providers": signers, "sinks": [{"provider": name, "path": path}]}

    with Broker(config("p1"), env=slow_disk_environment(library, trigger)) as broker:
        assert wait_until(lambda: sink_report(broker, path).get("ready"), timeout=20)
        first = served(broker, "p1")
        assert read_file(path) == first["access_token"]
        # The next write's temporary file is the slow one to make: p1's forced refresh.
        with open(trigger, "w"):
            pass
        status, _, body = broker.request("POST", "/providers/p1/token/refresh",
                                         body=json.dumps({"rejected_version": first["version"]}).encode())
        assert status == 200, (status, body)
        held_up = json.loads(body)["version"]
        assert wait_until(lambda: os.path.exists(trigger + ".taken"), timeout=20), "the old writer's write is held up"
        rewrite(broker, config("p2"))
        status, document = post_reload(broker)
        assert status == 200, document
        new = served(broker, "p2")["access_token"]
        assert wait_until(lambda: read_file(path) == new, timeout=20), "the new writer wrote p2's token"

        def held_up_write_ended():
            for line in broker.stderr().splitlines():
                fields = logfmt(line)
                if fields.get("provider") == "p1" and fields.get("version") == str(held_up) and \
                        fields.get("msg", "").startswith("token file"):
                    return fields
            return None

        # The held-up write ends 15 s after it began: abandoned, or (the bug) renamed over p2's token.
        assert wait_until(held_up_write_ended, timeout=30), broker.stderr()
        assert held_up_write_ended()["msg"].startswith("token file write abandoned"), held_up_write_ended()
        assert jwt.decode(read_file(path), options={"verify_signature": False})["aud"] == "p2", \
            "the old writer's late write put p1's token back over p2's"
        assert read_file(path) == new
        assert broker.metric("token_broker_sink_writes_total", provider="p1", result="error") == 0
        assert sink_report(broker, path)["ready"]
        assert [name for name in os.listdir(directory)] == ["t.token"], "the abandoned write left no temporary file"


def test_a_rename_that_hangs_holds_up_the_stop_for_a_bounded_time_and_is_logged(tmp_path):
    """A token file writer that is stopped gets 2 s to end a write, then is retired: its later
    writes are abandoned before their rename. A rename itself under way is waited for 1 s more,
    then logged and left: the stop waited for it without bound, and a rename that a hung file
    system holds (here 60 s) held the broker's main thread, its stop, its signals and its
    reloads, for as long."""
    library = preload_library(tmp_path, "slow_disk")
    trigger = str(tmp_path / "slow-next-rename")
    directory = private_directory(tmp_path / "run")
    path = str(directory / "t.token")
    config = {"providers": [{"name": "p1", "source": {"type": "jwt", "lifetimeSec": 600}}],
              "sinks": [{"provider": "p1", "path": path}]}
    with Broker(config, env=slow_disk_environment(library, trigger, call="rename", seconds=60)) as broker:
        assert wait_until(lambda: sink_report(broker, path).get("ready"), timeout=20)
        first = served(broker, "p1")
        with open(trigger, "w"):
            pass
        status, _, body = broker.request("POST", "/providers/p1/token/refresh",
                                         body=json.dumps({"rejected_version": first["version"]}).encode())
        assert status == 200, (status, body)
        assert wait_until(lambda: os.path.exists(trigger + ".taken"), timeout=20), "the rename is held up"
        broker.process.send_signal(signal.SIGTERM)
        # Well before the held rename's 60 s: a generous bound, not a measure.
        assert broker.process.wait(timeout=40) == 0, broker.stderr()
        log = broker.stderr()
        assert "a token file rename was still under way" in log and path in log, log
        assert read_file(path) == first["access_token"], "the held rename never landed"


def test_a_changed_templates_children_go_on_after_the_versions_its_old_children_handed_out(issuer):
    """A reload that changes a template makes a new one, whose children are made anew: they
    number their tokens after every version the old template's children handed out, so that a
    client holding version N of an old child, asking for a token newer than N, is answered by
    the new child's token rather than kept waiting with an ETag from an older version."""
    template = {**provider(issuer, "t"), "perRequest": ["audience"], "allowedAudiences": ["https://t.example/*"]}
    query = "audience=https://t.example/one"
    with Broker({"providers": [template]}) as broker:
        first = broker.get_json(f"/providers/t/token/ready?{query}&timeout=20", timeout=30)[0]
        status, _, body = broker.request("POST", f"/providers/t/token/refresh?{query}",
                                         body=json.dumps({"rejected_version": first["version"]}).encode())
        assert status == 200, body
        held = json.loads(body)
        assert held["version"] == first["version"] + 1, held
        rewrite(broker, {"providers": [{**template, "childIdleSec": 600}]})
        status, document = post_reload(broker)
        assert status == 200, document
        assert_outcome(document, changed=["t"])
        status, headers, body = broker.request(
            "GET", f"/providers/t/token/ready?{query}&after={held['version']}&timeout=10", timeout=30)
        assert status == 200, (status, headers, body)
        token = json.loads(body)
        assert token["version"] > held["version"] and token["access_token"] != held["access_token"], token


def test_the_first_provider_in_the_reloaded_file_becomes_the_default(issuer):
    with Broker({"providers": [provider(issuer, "first"), provider(issuer, "second")]}) as broker:
        assert broker.get_json("/token")[0]["provider"] == "first"
        second = served(broker, "second")
        since = time.time()
        rewrite(broker, {"providers": [provider(issuer, "second"), provider(issuer, "first")]})
        status, document = post_reload(broker)
        assert status == 200, document
        assert_outcome(document, unchanged=["first", "second"])
        token = broker.get_json("/token")[0]
        assert token["provider"] == "second" and token["access_token"] == second["access_token"]
        assert issuer.token_requests(since=since) == [], "a new order is no change to any provider"


def test_settings_that_need_no_restart_apply_at_a_reload(issuer):
    config = {"providers": [provider(issuer, "keep")]}
    with Broker(config) as broker:
        assert broker.request("GET", "/token", guard=False)[0] == 403
        token = served(broker, "keep")["access_token"]
        rewrite(broker, {**config, "requestGuard": False})
        status, document = post_reload(broker)
        assert status == 200, document
        assert_outcome(document, unchanged=["keep"])
        status, _, body = broker.request("GET", "/token", guard=False)
        assert status == 200 and json.loads(body)["access_token"] == token


# Reloads that change nothing

def test_an_invalid_file_sent_by_sighup_changes_nothing_and_is_logged_and_counted(issuer):
    config = {"providers": [provider(issuer, "keep"), provider(issuer, "other")]}
    with Broker(config) as broker:
        before = {name: served(broker, name) for name in ("keep", "other")}
        since = time.time()
        rewrite(broker, '{"providers": [' + json.dumps(provider(issuer, "keep", scope="write")) + ", ")  # cut short
        broker.process.send_signal(signal.SIGHUP)
        assert wait_until(lambda: reloads(broker)["invalid"] == 1, timeout=15), reloads(broker)
        assert_logged_refusal(broker)
        assert broker.process.poll() is None, "the broker keeps running on its old configuration"
        assert reloads(broker) == counted(invalid=1)
        assert not log_entries(broker, RELOADED)
        for name, token in before.items():
            assert served(broker, name)["access_token"] == token["access_token"]
        assert issuer.token_requests(since=since) == []
        assert_still_running(broker, config, ["keep", "other"])


@pytest.mark.parametrize("case", ["unknown key", "out of range", "missing key file", "FIFO as caFile", "not JSON"])
def test_an_invalid_file_posted_gets_422_naming_the_problem_and_changes_nothing(issuer, tmp_path, case):
    config = {"providers": [provider(issuer, "keep"), provider(issuer, "other")]}
    # Each file would change keep, remove other and add a provider, were it valid.
    changes = {"providers": [provider(issuer, "keep", scope="write"), provider(issuer, "add")]}
    mentions = []  # a file cut short: the parser's words, not a key
    if case == "unknown key":
        changes["bogusSetting"], mentions = 1, ["bogusSetting: unknown key"]
    elif case == "out of range":
        changes["providers"][1]["maxRetryCount"], mentions = 11, ["providers[1].maxRetryCount", "out of range"]
    elif case == "missing key file":
        missing = str(tmp_path / "missing.pem")
        changes["providers"].append({"name": "signer", "source": {"type": "jwt", "keyFile": missing}})
        mentions = [missing]
    elif case == "FIFO as caFile":
        # libcurl would open it on the upstream client's thread, and wait there for a writer.
        fifo = str(tmp_path / "ca.pem")
        os.mkfifo(fifo, 0o600)
        changes["providers"][0]["source"]["caFile"] = fifo
        mentions = ["providers[0].source", fifo, "is a FIFO, not a regular file"]
    text = json.dumps(changes)[:-1] if case == "not JSON" else json.dumps(changes)
    with Broker(config) as broker:
        before = {name: served(broker, name) for name in ("keep", "other")}
        since = time.time()
        rewrite(broker, text)
        status, document = post_reload(broker)
        assert status == 422, document
        assert document["error"] == "invalid_configuration", document
        for needle in mentions:
            assert needle in document["error_description"], (needle, document)
        assert_logged_refusal(broker, mentions)
        assert reloads(broker) == counted(invalid=1)
        for name, token in before.items():
            assert served(broker, name)["access_token"] == token["access_token"]
        assert broker.request("GET", "/providers/add/token")[0] == 404
        assert issuer.token_requests(since=since) == []
        assert readyz_names(broker) == {"keep", "other"}
        assert_still_running(broker, config, ["keep", "other"])


REFUSED_CHANGES = {
    "connectionLimit": lambda config: {**config, "connectionLimit": 64},
    "logFormat": lambda config: {**config, "logFormat": "json"},
    "listen": lambda config: {**config, "listen": f"127.0.0.1:{closed_port()}"},
}


@pytest.mark.parametrize("setting", sorted(REFUSED_CHANGES))
def test_a_change_that_needs_a_restart_gets_409_and_changes_nothing(issuer, setting):
    config = {"providers": [provider(issuer, "keep"), provider(issuer, "other")]}
    if setting == "listen":
        # Listeners from the file, not from the environment (whose TOKEN_BROKER_LISTEN would win).
        config.update({"listen": "127.0.0.1:0", "adminListen": "127.0.0.1:0"})
        options = {"listen": None, "admin": None}
    else:
        options = {}
    with Broker(config, **options) as broker:
        token = served(broker, "keep")["access_token"]
        since = time.time()
        changed = REFUSED_CHANGES[setting](config)
        changed["providers"] = [provider(issuer, "keep", scope="write"), provider(issuer, "add")]
        rewrite(broker, changed)
        status, document = post_reload(broker)
        assert status == 409, document
        assert document["error"] == "reload_refused" and "restart" in document["error_description"], document
        assert_logged_refusal(broker)
        assert reloads(broker) == counted(refused=1)
        assert served(broker, "keep")["access_token"] == token
        assert served(broker, "other")["version"] == 1
        assert broker.request("GET", "/providers/add/token")[0] == 404
        assert issuer.token_requests(since=since) == []
        if setting == "listen":
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(("127.0.0.1", int(changed["listen"].rpartition(":")[2])), timeout=5).close()
        if setting == "logFormat":
            assert not any(line.startswith("{") for line in broker.stderr().splitlines()), "the log stays logfmt"
        assert_still_running(broker, config, ["keep", "other"])


def test_the_stores_key_file_is_read_at_a_reload_and_another_key_in_it_needs_a_restart(issuer, tmp_path):
    """The store keeps the key it opened with until a restart. A reload once read neither the
    store's key file nor its directory: a key file gone, or holding another key, reloaded as
    "unchanged" while `--check-config` refused the same file, and the old key stayed in use."""
    key = os.urandom(32)
    key_file = tmp_path / "store.key"
    key_file.write_text(key.hex() + "\n")
    key_file.chmod(0o600)
    records = tmp_path / "records"
    records.mkdir(mode=0o700)
    config = {"providers": [provider(issuer, "keep")],
              "store": {"type": "file", "path": str(records), "keyFile": str(key_file)}}
    with Broker(config) as broker:
        token = served(broker, "keep")["access_token"]
        # Gone: the file is invalid, as --check-config says.
        key_file.rename(tmp_path / "elsewhere.key")
        status, document = post_reload(broker)
        assert status == 422 and document["error"] == "invalid_configuration", document
        assert "store.keyFile" in document["error_description"], document
        # Another key: only a restart can use it.
        key_file.write_bytes(os.urandom(32))
        key_file.chmod(0o600)
        status, document = post_reload(broker)
        assert status == 409 and document["error"] == "reload_refused", document
        assert "store.keyFile" in document["error_description"] and "restart" in document["error_description"], document
        # The same key written as bytes rather than digits is the same key: nothing to do.
        key_file.write_bytes(key)
        status, document = post_reload(broker)
        assert status == 200, document
        assert_outcome(document, unchanged=["keep"])
        assert reloads(broker) == counted(invalid=1, refused=1, reloaded=1)
        assert served(broker, "keep")["access_token"] == token


def test_another_redis_password_in_its_file_needs_a_restart_as_another_store_key_does(issuer, tmp_path):
    """The Redis store logs in with the password it read at start, on every connection it makes
    until a restart. A reload that found another password in the file (Redis's rotated with
    `CONFIG SET requirepass`) answered "reloaded", "unchanged", and the broker went on with the old
    one: once its connections dropped, Redis refused it (AUTH) and the broker fetched alone until
    a restart. It is refused now, naming the file, as another key in the store's key file is; the
    same password with or without its final newline is no change."""
    from test_fleet import RedisServer, encode, read_reply, write_key

    def as_user(password, *args):
        with redis.connect() as connection:
            connection.sendall(encode(("AUTH", password)) + encode(args))
            replies = connection.makefile("rb")
            assert read_reply(replies) == "OK"
            return read_reply(replies)

    redis = RedisServer()
    try:
        assert redis.command("CONFIG", "SET", "requirepass", "first-redis-password") == "OK"
        password_file = tmp_path / "redis-password"
        password_file.write_text("first-redis-password\n")
        password_file.chmod(0o600)
        write_key(tmp_path / "store.key")
        config = {"providers": [provider(issuer, "keep")],
                  "store": {"type": "redis", "address": "unix:" + redis.socket, "keyFile": str(tmp_path / "store.key"),
                            "passwordFile": str(password_file)}}
        with Broker(config) as broker:
            token = served(broker, "keep")["access_token"]
            _, _, body = broker.request("GET", "/readyz", listener="admin")
            assert json.loads(body)["store"] == {"type": "redis", "degraded": False}, body
            password_file.write_text("first-redis-password")
            status, document = post_reload(broker)
            assert status == 200, document
            assert_outcome(document, unchanged=["keep"])
            # Rotated: Redis asks for another, and the file holds it.
            assert as_user("first-redis-password", "CONFIG", "SET", "requirepass", "second-redis-password") == "OK"
            password_file.write_text("second-redis-password\n")
            status, document = post_reload(broker)
            assert status == 409 and document["error"] == "reload_refused", document
            assert "store.passwordFile" in document["error_description"], document
            assert "restart" in document["error_description"], document
            assert reloads(broker) == counted(reloaded=1, refused=1)
            assert served(broker, "keep")["access_token"] == token
            assert "first-redis-password" not in broker.stderr() and "second-redis-password" not in broker.stderr()
    finally:
        redis.kill()
        shutil.rmtree(redis.directory, ignore_errors=True)


def test_a_listen_address_in_the_file_that_the_environment_overrides_is_no_change(issuer):
    config = {"providers": [provider(issuer, "keep")]}
    with Broker(config) as broker:  # TOKEN_BROKER_LISTEN and TOKEN_BROKER_ADMIN_LISTEN are set
        rewrite(broker, {**config, "listen": f"127.0.0.1:{closed_port()}", "adminListen": f"127.0.0.1:{closed_port()}"})
        status, document = post_reload(broker)
        assert status == 200, document
        assert_outcome(document, unchanged=["keep"])
        assert reloads(broker) == counted(reloaded=1)


def test_a_replacement_without_a_token_in_time_abandons_the_reload(issuer):
    config = {"reloadTimeoutSec": 2, "providers": [provider(issuer, "keep"), provider(issuer, "change")]}
    with Broker(config) as broker:
        before = {name: served(broker, name) for name in ("keep", "change")}
        since = time.time()
        # The issuer refuses the replacement's secret; it retries every 300 ms at most.
        refused = provider(issuer, "change", clientSecret="not-the-secret",
                           retry={"maxRetryCount": 0, "maxErrorTokenRefreshDelayMsec": 300})
        rewrite(broker, {**config, "providers": [provider(issuer, "keep"), refused, provider(issuer, "add")]})
        status, document = post_reload(broker)
        assert status == 503, document
        assert document["error"] == "reload_abandoned", document
        assert_logged_refusal(broker)
        assert reloads(broker) == counted(abandoned=1)
        attempts = fetched(issuer, since, "change")
        assert attempts and all(r["status"] == 401 for r in attempts), "the replacement asked, and was refused"
        for name, token in before.items():
            now = served(broker, name)
            assert (now["access_token"], now["version"]) == (token["access_token"], token["version"])
        assert broker.request("GET", "/providers/add/token")[0] == 404, "nothing changes: no provider is added"
        # The replacement is gone: it asks no more.
        time.sleep(1)
        settled = len(fetched(issuer, since, "change"))
        time.sleep(3)
        assert len(fetched(issuer, since, "change")) == settled, "the abandoned replacement still fetches"
        assert_still_running(broker, config, ["keep", "change"])


def sighup_pending(pid):
    """Whether a SIGHUP waits, blocked, for the broker's main thread (a `POST /reload` raises one)."""
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith("ShdPnd:"):
                return int(line.split()[1], 16) & (1 << (signal.SIGHUP - 1)) != 0
    return False


def test_a_reload_asked_for_during_one_a_stop_abandons_is_answered_as_abandoned_too(issuer):
    """A POST /reload that arrives while a reload runs waits for the next one. When a stop signal
    abandons the reload under way there is no next one: as the stop begins, the waiting request
    is answered 503 reload_abandoned (the broker is stopping) like the one under way, and each
    is logged. It was left unanswered until the admin listener's final 503 shutting_down."""
    config = {"reloadTimeoutSec": 60, "providers": [provider(issuer, "keep")]}
    with Broker(config) as broker:
        since = time.time()
        # The added provider's secret is refused: the reload waits for its first token.
        refused = provider(issuer, "add", clientSecret="not-the-secret",
                           retry={"maxRetryCount": 0, "maxErrorTokenRefreshDelayMsec": 300})
        rewrite(broker, {**config, "providers": [provider(issuer, "keep"), refused]})
        answers = {}

        def ask(key):
            answers[key] = post_reload(broker, timeout=60)

        first = threading.Thread(target=ask, args=("under way",))
        first.start()
        assert wait_until(lambda: fetched(issuer, since, "add"), timeout=20), "the reload did not start the provider"
        second = threading.Thread(target=ask, args=("waiting",))
        second.start()
        # The second asked for the next reload by raising SIGHUP, left pending while one runs.
        assert wait_until(lambda: sighup_pending(broker.process.pid), timeout=20), "the second request did not arrive"
        broker.process.send_signal(signal.SIGTERM)
        for thread in (first, second):
            thread.join(60)
            assert not thread.is_alive()
        for key in ("under way", "waiting"):
            status, document = answers[key]
            assert status == 503 and document["error"] == "reload_abandoned", (key, document)
            assert "the broker is stopping" in document["error_description"], (key, document)
        assert broker.process.wait(timeout=15) == 0
        entries = log_entries(broker, NOT_RELOADED)
        assert [(entry["result"], entry["problem"]) for entry in entries] == [
            ("abandoned", "the broker is stopping")] * 2, broker.stderr()


# The route and the connections

def test_the_reload_route_wants_post_and_the_request_header_and_lives_on_the_admin_listener_only(issuer):
    config = {"providers": [provider(issuer, "keep")]}
    with Broker(config) as broker:
        rewrite(broker, {"providers": [provider(issuer, "keep"), provider(issuer, "add")]})
        status, document = post_reload(broker, guard=False)
        assert status == 403 and document["error"] == "missing_request_header", document
        status, headers, body = broker.request("GET", "/reload", listener="admin")
        assert status == 405 and json.loads(body)["error"] == "method_not_allowed", body
        assert "POST" in headers.get("allow", ""), headers
        status, _, body = broker.request("POST", "/reload")
        assert status == 404, (status, body)
        assert reloads(broker) == counted(), "no reload was made"
        assert broker.request("GET", "/providers/add/token")[0] == 404
        status, document = post_reload(broker)
        assert status == 200, document
        assert_outcome(document, added=["add"], unchanged=["keep"])


def test_a_kept_alive_connection_opened_before_a_reload_is_answered_after_it(issuer):
    config = {"providers": [provider(issuer, "keep"), provider(issuer, "drop")]}
    with Broker(config) as broker:
        host, _, port = broker.addresses["token"].rpartition(":")
        admin_host, _, admin_port = broker.addresses["admin"].rpartition(":")
        keep_alive = lambda path: get(path).replace(b"Connection: close\r\n", b"")
        with socket.create_connection((host, int(port)), timeout=10) as client, \
                socket.create_connection((admin_host, int(admin_port)), timeout=90) as admin:
            client.sendall(keep_alive("/providers/keep/token"))
            status, body = read_answer(client)
            assert status == 200
            token = json.loads(body)["access_token"]
            rewrite(broker, {"providers": [provider(issuer, "keep"), provider(issuer, "add")]})
            # The reload itself on a kept-alive admin connection, which then asks again.
            admin.sendall(b"POST /reload HTTP/1.1\r\nHost: broker\r\nToken-Broker-Request: true\r\n"
                          b"Content-Length: 0\r\n\r\n")
            status, body = read_answer(admin)
            assert status == 200, body
            assert_outcome(json.loads(body), added=["add"], removed=["drop"], unchanged=["keep"])
            admin.sendall(b"GET /healthz HTTP/1.1\r\nHost: broker\r\n\r\n")
            assert read_answer(admin)[0] == 200
            for path, wanted in (("/providers/keep/token", 200), ("/providers/add/token/ready?timeout=20", 200),
                                 ("/providers/drop/token", 404), ("/token", 200)):
                client.sendall(keep_alive(path))
                status, body = read_answer(client)
                assert status == wanted, (path, status, body)
                if path.endswith("/keep/token"):
                    assert json.loads(body)["access_token"] == token


def test_reload_lines_in_json_logs_parse_and_sighup_applies_changes(issuer):
    config = {"logFormat": "json", "providers": [provider(issuer, "keep"), provider(issuer, "drop")]}
    with Broker(config) as broker:
        rewrite(broker, {**config, "providers": [provider(issuer, "keep"), provider(issuer, "add")]})
        broker.process.send_signal(signal.SIGHUP)
        assert wait_until(lambda: broker.request("GET", "/providers/add/token")[0] == 200, timeout=20), broker.stderr()
        assert broker.request("GET", "/providers/drop/token")[0] == 404
        rewrite(broker, {**config, "bogusSetting": True})
        status, document = post_reload(broker)
        assert status == 422, document
        assert wait_until(lambda: log_entries(broker, NOT_RELOADED), timeout=10)
        lines = broker.stderr().splitlines()
        for line in lines:
            json.loads(line)  # fails the test on any line that is not JSON
        [reloaded] = [json.loads(line) for line in lines if '"configuration reloaded"' in line]
        assert reloaded["msg"] == RELOADED
        assert names(reloaded, "added") == ["add"] and names(reloaded, "removed") == ["drop"]
        assert names(reloaded, "unchanged") == ["keep"] and names(reloaded, "changed") == []
        [refused] = [json.loads(line) for line in lines if '"configuration not reloaded"' in line]
        assert refused["msg"] == NOT_RELOADED and "bogusSetting" in refused["problem"]
        assert reloads(broker) == counted(reloaded=1, invalid=1)


# token-broker reload

def reload_command(admin_address):
    """`token-broker reload`, finding the broker through TOKEN_BROKER_ADMIN_LISTEN as healthcheck does."""
    return run_broker("reload", env={"TOKEN_BROKER_ADMIN_LISTEN": admin_address}, timeout=90)


def test_the_reload_command_reloads_prints_one_line_and_says_why_it_did_not(issuer):
    config = {"providers": [provider(issuer, "keep")]}
    with Broker(config) as broker:
        admin = broker.addresses["admin"]
        rewrite(broker, {"providers": [provider(issuer, "keep"), provider(issuer, "add")]})
        result = reload_command(admin)
        assert result.returncode == 0, result.stderr
        assert result.stdout.endswith("\n") and result.stdout.count("\n") == 1 and result.stdout.strip(), result.stdout
        assert "add" in result.stdout, "the summary names the provider added"
        assert result.stderr == ""
        assert first_token(broker, "add")["provider"] == "add"
        assert reloads(broker) == counted(reloaded=1)
        # An invalid file: exit 5 and the problem.
        rewrite(broker, {"providers": [provider(issuer, "keep")], "bogusSetting": 1})
        assert_failure(reload_command(admin), REFUSED, command="reload", mentions=("bogusSetting",))
        assert served(broker, "add")["provider"] == "add"
        # A change that needs a restart: exit 5 too.
        rewrite(broker, {"providers": [provider(issuer, "keep")], "connectionLimit": 64})
        assert_failure(reload_command(admin), REFUSED, command="reload", mentions=("restart",))
        assert served(broker, "add")["provider"] == "add"
        assert reloads(broker) == counted(reloaded=1, invalid=1, refused=1)
    # The broker stopped: unreachable, exit 3.
    assert_failure(reload_command(admin), UNREACHABLE, command="reload")


def test_a_reload_command_that_times_out_waiting_for_the_broker_does_not_point_at_the_address(issuer):
    """A broker that answers late (its reload waits for a token) was found where the command
    asked: the hint about a changed adminListen, meant for nothing answering there, is not added."""
    config = {"reloadTimeoutSec": 10, "providers": [provider(issuer, "keep")]}
    with Broker(config) as broker:
        refused = provider(issuer, "change", clientSecret="not-the-secret",
                           retry={"maxRetryCount": 0, "maxErrorTokenRefreshDelayMsec": 300})
        rewrite(broker, {**config, "providers": [provider(issuer, "keep"), refused]})
        result = run_broker("reload", "--timeout", "1", env={"TOKEN_BROKER_ADMIN_LISTEN": broker.addresses["admin"]},
                            timeout=90)
        assert_failure(result, UNREACHABLE, command="reload", mentions=("did not answer in time",))
        assert "adminListen" not in result.stderr and "--address" not in result.stderr, result.stderr


def test_the_reload_command_asks_the_admin_listener_its_file_names_and_says_so_when_nothing_answers_there(issuer):
    """`reload --config FILE` finds the broker at the file's adminListen as it is now: after a
    change of adminListen (which needs a restart) nothing answers there, and the command said
    only "broker unreachable". It now says where it asked and how to reach the broker; asked
    there, the broker refuses the change (409, exit 5)."""
    config = {"listen": "127.0.0.1:0", "adminListen": f"127.0.0.1:{closed_port()}",
              "providers": [provider(issuer, "keep")]}
    with Broker(config, listen=None, admin=None) as broker:
        path = os.path.join(broker.workdir, "config.json")
        result = run_broker("reload", "--config", path, timeout=90)
        assert result.returncode == 0, result.stderr
        rewrite(broker, {**config, "adminListen": f"127.0.0.1:{closed_port()}"})
        assert_failure(run_broker("reload", "--config", path, timeout=90), UNREACHABLE, command="reload",
                       mentions=("adminListen", "--address"))
        result = run_broker("reload", "--address", f"http://{broker.addresses['admin']}", timeout=90)
        assert_failure(result, REFUSED, command="reload", mentions=("adminListen", "restart"))
        assert reloads(broker) == counted(reloaded=1, refused=1)
