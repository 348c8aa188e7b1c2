"""Keys, start-up, the command line: what the broker refuses before it serves, and how it is checked.

Keys are made by the `openssl` command line and tokens verified by PyJWT, not by the broker's code.
"""
import base64
import functools
import hashlib
import http.server
import json
import os
import pty
import select
import signal
import socket
import subprocess
import threading
import time

import jwt
import pytest

from broker import BINARY, Broker, run_broker
from test_http_api import wait_until
from test_skeleton import verify_with_jwks


def openssl(*args):
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def jwt_config(key_path, algorithm="ES256"):
    return {"providers": [{"name": "default", "source": {"type": "jwt", "algorithm": algorithm, "keyFile": key_path}}]}


def write_config(directory, config):
    path = os.path.join(str(directory), "config.json")
    with open(path, "w") as handle:
        json.dump(config, handle)
    return path


def first_token(broker):
    """The first token, once the provider has one (the listeners open before the first fetch ends)."""
    assert wait_until(lambda: broker.request("GET", "/readyz", listener="admin")[0] == 200)
    return broker.get_json("/token")[0]["access_token"]


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


# Curves

@pytest.mark.parametrize("curve", ["secp256k1", "brainpoolP256r1"])
def test_es256_refuses_a_256_bit_key_on_another_curve_naming_the_file(tmp_path, curve):
    key = str(tmp_path / f"{curve}.pem")
    openssl("ecparam", "-name", curve, "-genkey", "-noout", "-out", key)
    config = write_config(tmp_path, jwt_config(key))
    for args in (["--check-config", "--config", config], ["--config", config]):
        result = run_broker(*args, env={"TOKEN_BROKER_LISTEN": "127.0.0.1:0", "TOKEN_BROKER_ADMIN_LISTEN": "127.0.0.1:0"})
        assert result.returncode == 2, result.stderr
        assert f"{key}: the key does not fit ES256: it is EC on the {curve} curve" in result.stderr


@pytest.mark.parametrize("kind,said", [
    ("secp256k1", "the key does not fit ES256: it is EC on the secp256k1 curve; ES256 wants EC on the P-256 curve"),
    ("rsa1024", "the key does not fit RS256: it is RSA of 1024 bits; RS256 wants RSA of 2048 bits or more"),
    ("ed25519", "the key does not fit private_key_jwt: it is an ED25519 key"),
])
def test_private_key_jwt_refuses_a_key_naming_the_file_and_what_is_wrong_with_it(tmp_path, kind, said):
    # An EC key signs with ES256, an RSA key with RS256: the error is about the algorithm the
    # key's kind makes, and says what the key is (it said RS256 for an EC key on secp256k1).
    key = str(tmp_path / f"{kind}.pem")
    if kind == "secp256k1":
        openssl("ecparam", "-name", "secp256k1", "-genkey", "-noout", "-out", key)
    elif kind == "rsa1024":
        openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:1024", "-out", key)
    else:
        openssl("genpkey", "-algorithm", "ED25519", "-out", key)
    config = write_config(tmp_path, {"providers": [{"name": "default", "source": {
        "type": "oauth2", "tokenURL": "http://127.0.0.1:9/token", "clientID": "c",
        "clientAuth": "private_key_jwt", "privateKeyFile": key}}]})
    result = run_broker("--check-config", "--config", config)
    assert result.returncode == 2, result.stderr
    assert f"{key}: {said}" in result.stderr


def test_a_p256_key_from_ecparam_signs_tokens_that_pyjwt_verifies(tmp_path):
    key = str(tmp_path / "p256.pem")
    openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", key)
    with Broker(jwt_config(key)) as broker:
        token = first_token(broker)
        jwks, _ = broker.get_json("/.well-known/jwks.json")
        [published] = jwks["keys"]
        assert published["crv"] == "P-256"
        claims = jwt.decode(token, jwt.PyJWK(published).key, algorithms=["ES256"], audience="token-broker")
        assert claims["iss"] == "token-broker"


# Pass phrases

def test_a_passphrase_protected_key_under_a_terminal_fails_fast_naming_the_file(tmp_path):
    """OpenSSL's default callback prompts on the controlling terminal and waits there for ever."""
    key = str(tmp_path / "locked.pem")
    openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-aes256", "-pass", "pass:x", "-out", key)
    config = write_config(tmp_path, jwt_config(key))
    pid, fd = pty.fork()
    if pid == 0:  # the child: its controlling terminal is the pty
        os.execve(BINARY, [BINARY, "--config", config],
                  {"PATH": "/usr/bin:/bin", "TOKEN_BROKER_LISTEN": "127.0.0.1:0", "TOKEN_BROKER_ADMIN_LISTEN": "127.0.0.1:0"})
    output, status = b"", None
    deadline = time.monotonic() + 15
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.2)
            if ready:
                try:
                    output += os.read(fd, 4096)
                except OSError:
                    pass
            done, raw = os.waitpid(pid, os.WNOHANG)
            if done:
                status = os.waitstatus_to_exitcode(raw)
                break
    finally:
        if status is None:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(fd)
    text = output.decode(errors="replace")
    assert status == 2, f"the broker did not exit within 15 s; it wrote: {text!r}"
    assert "pass phrase" in text and key in text
    assert "Enter PEM pass phrase" not in text


# --check-config does what start does, short of binding

@pytest.mark.parametrize("case", ["missing", "invalid", "unknown provider"])
def test_check_config_refuses_a_caller_keys_file_that_start_would_refuse(tmp_path, case):
    keys = tmp_path / "callers.json"
    if case == "invalid":
        keys.write_text("{not json")
    elif case == "unknown provider":
        keys.write_text(json.dumps({"keys": [{"name": "a", "sha256": "0" * 64, "providers": ["nope"]}]}))
    config = write_config(tmp_path, {"clientKeysFile": str(keys)})
    check = run_broker("--check-config", "--config", config)
    start = run_broker("--config", config, env={"TOKEN_BROKER_LISTEN": "127.0.0.1:0", "TOKEN_BROKER_ADMIN_LISTEN": "127.0.0.1:0"})
    assert start.returncode == 2, start.stderr
    assert check.returncode == 2, check.stdout + check.stderr
    assert "configuration OK" not in check.stdout
    assert "clientKeysFile" in check.stderr


def test_a_malformed_hash_is_reported_as_malformed_not_as_missing(tmp_path):
    keys = tmp_path / "callers.json"
    pasted_key = "the-key-itself-pasted-by-mistake"
    keys.write_text(json.dumps({"keys": [{"name": "a", "sha256": pasted_key, "providers": ["*"]}]}))
    result = run_broker("--check-config", "--config", write_config(tmp_path, {"clientKeysFile": str(keys)}))
    assert result.returncode == 2
    assert "keys[0].sha256: is not a SHA-256" in result.stderr and "is required" not in result.stderr
    assert pasted_key not in result.stderr


@pytest.mark.parametrize("address", ["[:::::]:8080", "[1:2:3:4:5:6:7:8:9]:8080", "[::1::2]:8080", "[fe80::1%lo]:8080"])
def test_check_config_refuses_an_ipv6_listen_address_the_system_cannot_bind(tmp_path, address):
    config = write_config(tmp_path, {"listen": address})
    result = run_broker("--check-config", "--config", config)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "listen" in result.stderr and "is not a listen address" in result.stderr


def test_check_config_accepts_an_ipv6_address_in_every_form_the_system_reads(tmp_path):
    config = write_config(tmp_path, {"listen": "[0:0:0:0:0:0:0:1]:8080", "adminListen": "[0::1]:9090"})
    result = run_broker("--check-config", "--config", config)
    assert result.returncode == 0, result.stderr


def test_an_ipv4_mapped_listen_address_is_refused_by_check_and_start_alike(tmp_path):
    """`[::ffff:127.0.0.1]` is IPv6 in form only: an IPv6-only listener cannot bind it, so the
    check refuses it, naming the IPv4 form, where it once said OK and start then failed."""
    config = write_config(tmp_path, {"listen": "127.0.0.1:0", "adminListen": "[::ffff:127.0.0.1]:0"})
    check = run_broker("--check-config", "--config", config)
    start = run_broker("--config", config)
    for result in (check, start):
        assert result.returncode == 2, result.stdout + result.stderr
        assert "adminListen" in result.stderr and "127.0.0.1:0" in result.stderr, result.stderr


# Relative paths

def test_relative_paths_are_read_from_the_configuration_files_directory(tmp_path):
    directory = tmp_path / "etc"
    (directory / "keys").mkdir(parents=True)
    openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(directory / "keys" / "key.pem"))
    config = write_config(directory, jwt_config("keys/key.pem"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = subprocess.run([BINARY, "--check-config", "--config", config], capture_output=True, text=True, timeout=30,
                            cwd=str(elsewhere), env={"PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    with Broker(args=("--config", config)) as broker:
        assert f'key={directory}/keys/key.pem' in broker.stderr()
        token = first_token(broker)
        public = subprocess.run(["openssl", "pkey", "-in", str(directory / "keys" / "key.pem"), "-pubout"],
                                check=True, capture_output=True).stdout
        jwt.decode(token, public, algorithms=["ES256"], audience="token-broker")


def test_a_missing_relative_file_is_named_where_it_was_looked_for(tmp_path):
    config = write_config(tmp_path, jwt_config("missing.pem"))
    result = subprocess.run([BINARY, "--check-config", "--config", config], capture_output=True, text=True, timeout=30,
                            cwd="/", env={"PATH": "/usr/bin:/bin"})
    assert result.returncode == 2
    assert f"cannot read {tmp_path}/missing.pem" in result.stderr


# HS256's kid, as the README gives it

def test_hs256_kid_is_the_first_16_bytes_of_sha256_of_sha256_of_the_secret(tmp_path):
    secret = os.urandom(24).hex().encode()
    (tmp_path / "secret").write_bytes(secret + b"\n")
    with Broker(jwt_config(str(tmp_path / "secret"), "HS256")) as broker:
        token = first_token(broker)
        header = jwt.get_unverified_header(token)
        assert header["kid"] == b64url(hashlib.sha256(hashlib.sha256(secret).digest()).digest()[:16])
        jwt.decode(token, secret, algorithms=["HS256"], audience="token-broker")


# One key under each kid: a verifier finds a token's key by its kid

def ec_key(path):
    openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(path))
    return str(path)


def published_keys(broker):
    return broker.get_json("/.well-known/jwks.json", guard=False)[0]["keys"]


def ready_token(broker, provider):
    return broker.get_json(f"/providers/{provider}/token/ready?timeout=20", timeout=30)[0]["access_token"]


@pytest.mark.parametrize("second", ["ES256", "RS256"])
def test_two_providers_with_different_keys_under_one_kid_are_refused_naming_both(tmp_path, second):
    # The JWKS published the first provider's key alone, and the second's tokens never verified
    # (PyJWKClient takes the first key under the token's kid), while --check-config passed.
    first = ec_key(tmp_path / "first.pem")
    other = str(tmp_path / "second.pem")
    if second == "ES256":
        ec_key(other)
    else:
        openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", other)

    def config(second_key):
        return {"providers": [
            {"name": "first", "source": {"type": "jwt", "keyFile": first, "kid": "main"}},
            {"name": "second", "source": {"type": "jwt", "algorithm": second if second_key == other else "ES256",
                                          "keyFile": second_key, "kid": "main", "audience": "second"}}]}

    path = write_config(tmp_path, config(other))
    for args in (["--check-config", "--config", path], ["--config", path]):
        result = run_broker(*args, env={"TOKEN_BROKER_LISTEN": "127.0.0.1:0", "TOKEN_BROKER_ADMIN_LISTEN": "127.0.0.1:0"})
        assert result.returncode == 2, result.stderr
        assert "configuration OK" not in result.stdout
        for text in ("providers[1].source.kid", "second", "first", "main", "kid of its own"):
            assert text in result.stderr, (text, result.stderr)
    # The same key under the same kid is no clash: published once, it verifies both.
    with Broker(config(first)) as broker:
        [published] = published_keys(broker)
        assert published["kid"] == "main"
        assert verify_with_jwks(broker, ready_token(broker, "first"))["aud"] == "token-broker"
        assert verify_with_jwks(broker, ready_token(broker, "second"), audience="second")["aud"] == "second"


def test_an_hs256_signer_never_hides_a_published_key_under_its_kid(tmp_path):
    # An HS256 secret is never published; listed first under the kid of an ES256 key, it left
    # the JWKS empty ({"keys":[]}), and the ES256 provider's tokens unverifiable.
    secret = os.urandom(24).hex().encode()
    (tmp_path / "secret").write_bytes(secret)
    config = {"providers": [
        {"name": "hmac", "source": {"type": "jwt", "algorithm": "HS256", "keyFile": str(tmp_path / "secret"), "kid": "k"}},
        {"name": "ec", "source": {"type": "jwt", "keyFile": ec_key(tmp_path / "key.pem"), "kid": "k"}}]}
    assert run_broker("--check-config", "--config", write_config(tmp_path, config)).returncode == 0
    with Broker(config) as broker:
        keys = published_keys(broker)
        assert [(key["kid"], key["kty"]) for key in keys] == [("k", "EC")], keys
        assert verify_with_jwks(broker, ready_token(broker, "ec"))["aud"] == "token-broker"
        hmac_token = ready_token(broker, "hmac")
        assert jwt.get_unverified_header(hmac_token)["kid"] == "k"
        jwt.decode(hmac_token, secret, algorithms=["HS256"], audience="token-broker")


# Claims too long for any token

def longest_audience_that_fits(tmp_path):
    """The longest audience of `a`s with which an ES256 token under kid "k" is at most 16384
    bytes: measured from a token the broker signs with a one-letter audience, since only the
    audience's length differs (the dates have ten digits, the jti and the signature a fixed length)."""
    with Broker({"providers": [{"name": "p", "source": {"type": "jwt", "kid": "k", "audience": "a"}}]}) as broker:
        header, claims, signature = ready_token(broker, "p").split(".")
    claims_bytes = len(base64.urlsafe_b64decode(claims + "=" * (-len(claims) % 4)))

    def token_length(audience_length):  # base64url without padding: 4 characters for 3 bytes, rounded up
        return len(header) + 1 + -(-4 * (claims_bytes - 1 + audience_length) // 3) + 1 + len(signature)

    longest = 1
    while token_length(longest + 1) <= 16384:
        longest += 1
    return longest


def test_claims_that_make_every_token_longer_than_a_token_may_be_are_refused_naming_the_key(tmp_path):
    # The broker started and was never ready: every token it signed was a bad_response
    # ("the token is longer than 16384 bytes"), and --check-config passed.
    longest = longest_audience_that_fits(tmp_path)
    for source, key in (({"audience": "a" * (longest + 1)}, "audience"), ({"kid": "k" * 20000}, "kid"),
                        ({"issuer": "i" * 100000, "audience": "short"}, "issuer")):
        path = write_config(tmp_path, {"providers": [{"name": "p", "source": {"type": "jwt", "kid": "k", **source}}]})
        for args in (["--check-config", "--config", path], ["--config", path]):
            result = run_broker(*args, env={"TOKEN_BROKER_LISTEN": "127.0.0.1:0", "TOKEN_BROKER_ADMIN_LISTEN": "127.0.0.1:0"})
            assert result.returncode == 2, (key, result.stderr)
            assert f"providers[0].source.{key}: makes each token" in result.stderr, result.stderr
            assert "more than the 16384" in result.stderr, result.stderr
    # One byte less fits: the broker serves a token of at most 16384 bytes, which verifies.
    audience = "a" * longest
    with Broker({"providers": [{"name": "p", "source": {"type": "jwt", "kid": "k", "audience": audience}}]}) as broker:
        token = ready_token(broker, "p")
        assert 16382 <= len(token) <= 16384
        assert verify_with_jwks(broker, token, audience=audience)["aud"] == audience
    # A template's children carry the audience they are asked for: the configured one is only a default.
    config = {"providers": [{"name": "t", "perRequest": ["audience"], "allowedAudiences": ["api"],
                             "source": {"type": "jwt", "audience": "a" * 100000}}]}
    assert run_broker("--check-config", "--config", write_config(tmp_path, config)).returncode == 0


# The JWKS is public, as the README says

def test_the_jwks_needs_no_caller_key_while_token_routes_do(tmp_path):
    key = "k-" + os.urandom(8).hex()
    keys = tmp_path / "callers.json"
    keys.write_text(json.dumps({"keys": [{"name": "a", "sha256": hashlib.sha256(key.encode()).hexdigest(), "providers": ["*"]}]}))
    with Broker({"clientKeysFile": str(keys)}) as broker:
        status, _, body = broker.request("GET", "/.well-known/jwks.json")
        assert status == 200 and json.loads(body)["keys"][0]["kty"] == "EC"
        assert wait_until(lambda: broker.request("GET", "/readyz", listener="admin")[0] == 200)
        status, _, _ = broker.request("GET", "/token")
        assert status == 401
        status, _, _ = broker.request("GET", "/token", headers={"Authorization": f"Bearer {key}"})
        assert status == 200


# --help

def test_help_names_every_route_proxy_mode_and_the_exit_statuses():
    result = run_broker("--help")
    assert result.returncode == 0
    for text in ("/token/ready", "/token/refresh", "/metrics", "/readyz", "/proxy/{name}/{path}", "jwks.json",
                 "Exit status", "port busy", "healthcheck [--config FILE]"):
        assert text in result.stdout, text


# healthcheck follows the configuration

def test_healthcheck_asks_the_admin_listener_the_configuration_names(tmp_path):
    admin_socket = str(tmp_path / "admin.sock")
    config = write_config(tmp_path, {"adminListen": f"unix:{admin_socket}"})
    with Broker(args=("--config", config), admin=None) as broker:
        assert broker.addresses["admin"] == f"unix:{admin_socket}"
        for args, env in ((("healthcheck",), {"TOKEN_BROKER_CONFIG": config}),
                          (("healthcheck", "--config", config), {}),
                          ((f"healthcheck", f"--config={config}"), {}),
                          (("healthcheck", f"unix:{admin_socket}"), {})):
            result = run_broker(*args, env=env, timeout=10)
            assert result.returncode == 0, (args, result.stderr)
        assert broker.stop() == 0
    result = run_broker("healthcheck", env={"TOKEN_BROKER_CONFIG": config}, timeout=10)
    assert result.returncode == 1
    assert f"unix:{admin_socket}" in result.stderr


def test_healthcheck_applies_the_environments_admin_listen_over_the_file(tmp_path):
    admin_socket = str(tmp_path / "admin.sock")
    config = write_config(tmp_path, {"adminListen": "127.0.0.1:1"})
    with Broker(args=("--config", config), admin=f"unix:{admin_socket}"):
        result = run_broker("healthcheck", env={"TOKEN_BROKER_CONFIG": config, "TOKEN_BROKER_ADMIN_LISTEN": f"unix:{admin_socket}"},
                            timeout=10)
        assert result.returncode == 0, result.stderr
        result = run_broker("healthcheck", env={"TOKEN_BROKER_CONFIG": config}, timeout=10)
        assert result.returncode == 1 and "127.0.0.1:1" in result.stderr


def test_healthcheck_given_a_url_without_a_path_asks_healthz(broker):
    assert run_broker("healthcheck", f"http://{broker.addresses['admin']}", timeout=10).returncode == 0
    assert run_broker("healthcheck", f"http://{broker.addresses['admin']}/", timeout=10).returncode == 0
    assert run_broker("healthcheck", "ftp://127.0.0.1:1", timeout=10).returncode == 1


def test_healthcheck_asks_the_broker_directly_whatever_proxy_the_environment_names(broker):
    # libcurl would send even a 127.0.0.1 request through http_proxy; this one leads nowhere.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        proxy = f"http://127.0.0.1:{probe.getsockname()[1]}"
    environment = {"http_proxy": proxy, "HTTP_PROXY": proxy, "all_proxy": proxy, "ALL_PROXY": proxy}
    result = run_broker("healthcheck", f"http://{broker.addresses['admin']}", env=environment, timeout=10)
    assert result.returncode == 0, result.stderr


# The allocator

GLIBC_HEAP_BYTES = 64 << 20


def glibc_arena_heaps(pid):
    """glibc's arenas beyond the main one, read from /proc/PID/maps: each lives in an anonymous
    reservation of 64 MiB aligned on 64 MiB (HEAP_MAX_SIZE on 64-bit), its used part read-write
    and the rest inaccessible. Thread stacks and libcurl's buffers are not laid out so."""
    spans = {}
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) > 5:
                continue  # a file, or [heap], [stack] and the like
            start, end = (int(bound, 16) for bound in fields[0].split("-"))
            base = start - start % GLIBC_HEAP_BYTES
            if end <= base + GLIBC_HEAP_BYTES:
                spans.setdefault(base, []).append((start, end))
    return sum(1 for base, parts in spans.items()
               if parts[0][0] == base and sum(end - start for start, end in parts) == GLIBC_HEAP_BYTES)


@pytest.mark.parametrize("environment, limited", [
    ({}, True),
    ({"MALLOC_ARENA_MAX": "8"}, False),
    ({"GLIBC_TUNABLES": "glibc.malloc.arena_max=8"}, False),
    ({"GLIBC_TUNABLES": "glibc.malloc.tcache_count=7"}, True),
])
def test_malloc_keeps_to_one_arena_unless_the_environment_sets_glibcs_limit(environment, limited):
    """One arena by default, for memory after long-poll bursts; an operator's MALLOC_ARENA_MAX
    (or glibc.malloc.arena_max in GLIBC_TUNABLES) is left to glibc, for a broker that mostly proxies."""
    with Broker(env=environment) as broker:
        assert broker.get_json("/token")[0]["access_token"]
        heaps = glibc_arena_heaps(broker.process.pid)
    if limited:
        assert heaps == 0, f"{heaps} arenas beside the main one"
    else:
        assert heaps >= 1, "every thread allocated from the main arena"


def test_with_proxies_each_libcurl_loop_gets_an_arena_of_its_own(tmp_path):
    """With proxies, the token listener runs on the libcurl loops (one per processor, at most
    eight), each allocating and freeing its own requests: one arena each besides the main one."""
    (tmp_path / "x").write_text("upstream")
    files = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path)))
    threading.Thread(target=files.serve_forever, daemon=True).start()
    config = {"proxies": [{"name": "files", "target": f"http://127.0.0.1:{files.server_port}"}]}
    try:
        with Broker(config) as broker:
            for _ in range(40):  # new connections each, so that every loop's daemon takes some
                status, _, body = broker.request("GET", "/proxy/files/x")
                assert status == 200 and body == b"upstream"
            heaps = glibc_arena_heaps(broker.process.pid)
    finally:
        files.shutdown()
        files.server_close()
    assert 1 <= heaps <= min(os.cpu_count(), 8), f"{heaps} arenas beside the main one"
