"""Hardening: caller keys, Unix sockets, hostile input, slow and idle clients.

Every hostile request is followed by a check that the broker is still healthy and still serves
a valid token.
"""
import hashlib
import http.client
import json
import os
import resource
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import threading
import time

import pytest

from broker import BINARY, Broker, base_environment, run_broker
from test_http_api import wait_until


def sha256_hex(key):
    """The hash clientKeysFile lists, computed here independently of the broker."""
    return hashlib.sha256(key.encode()).hexdigest()


def write_keys(path, entries):
    """entries: [(name, key, providers)]. Written atomically, as an operator's tooling would."""
    document = {"keys": [{"name": name, "sha256": sha256_hex(key), "providers": providers} for name, key, providers in entries]}
    temporary = str(path) + ".new"
    with open(temporary, "w") as handle:
        json.dump(document, handle)
    os.replace(temporary, path)


def bearer(key):
    return {"Authorization": f"Bearer {key}"}


TWO_PROVIDERS = [{"name": "default"}, {"name": "payments"}]


# Caller keys

def test_caller_keys_decide_who_reads_which_provider(tmp_path):
    billing, admin = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
    keys = tmp_path / "callers.json"
    write_keys(keys, [("billing", billing, ["default"]), ("admin", admin, ["*"])])
    with Broker({"providers": TWO_PROVIDERS, "clientKeysFile": str(keys)}) as broker:
        status, headers, body = broker.request("GET", "/token")
        assert status == 401 and headers["www-authenticate"].startswith("Bearer realm=")
        assert json.loads(body)["error"] == "missing_caller_key"

        status, headers, body = broker.request("GET", "/token", headers=bearer("not-" + billing))
        assert status == 401 and 'error="invalid_token"' in headers["www-authenticate"]
        assert json.loads(body)["error"] == "invalid_caller_key"

        for scheme in ("Basic", "Bearer", "Bearer  "):
            assert broker.request("GET", "/token", headers={"Authorization": f"{scheme} "})[0] == 401

        assert broker.get_json("/token", headers=bearer(billing))[0]["access_token"]
        assert broker.get_json("/token/ready?timeout=5", headers={"Authorization": "bearer " + billing})[0]["version"] >= 1
        status, _, body = broker.request("GET", "/providers/payments/token", headers=bearer(billing))
        assert status == 403 and json.loads(body)["error"] == "provider_not_allowed"
        assert "billing" in json.loads(body)["error_description"]
        status, _, body = broker.request("POST", "/providers/payments/token/refresh", headers=bearer(billing), body=b"{}")
        assert status == 403

        assert broker.get_json("/providers/payments/token", headers=bearer(admin))[0]["access_token"]
        # The signers' public keys stay public.
        assert broker.request("GET", "/.well-known/jwks.json", guard=False)[0] == 200
        assert billing not in broker.stderr() and admin not in broker.stderr()
        assert broker.metric("token_broker_http_requests_total", listener="token", route="/providers/{name}/token", code="403") == 1


def test_a_caller_key_is_hashed_as_the_bytes_sent(tmp_path):
    """The key is the bytes after `Bearer `, hashed as sent. HTTP lets a header value carry bytes
    that are not UTF-8 (obs-text); read as text first, with each bad byte made U+FFFD, a key
    ending in 0xFF would be taken for one ending in U+FFFD, another caller's."""
    stem = secrets.token_urlsafe(24).encode()
    raw, replaced = stem + b"\xff", stem + "\ufffd".encode()
    keys = tmp_path / "callers.json"
    keys.write_text(json.dumps({"keys": [
        {"name": "raw", "sha256": hashlib.sha256(raw).hexdigest(), "providers": ["default"]},
        {"name": "replaced", "sha256": hashlib.sha256(replaced).hexdigest(), "providers": ["payments"]},
    ]}))
    with Broker({"providers": TWO_PROVIDERS, "clientKeysFile": str(keys)}) as broker:
        for key, allowed, refused in ((raw, "/token", "/providers/payments/token"),
                                      (replaced, "/providers/payments/token", "/token")):
            authorization = {"Authorization": b"Bearer " + key}
            assert broker.get_json(allowed, headers=authorization)[0]["access_token"]
            status, _, body = broker.request("GET", refused, headers=authorization)
            assert status == 403, (key, refused, status, body)
            assert json.loads(body)["error"] == "provider_not_allowed"
            assert ("raw" if key == raw else "replaced") in json.loads(body)["error_description"], body
        # The key alone, not the key and the bytes after it.
        status, _, body = broker.request("GET", "/token", headers={"Authorization": b"Bearer " + raw + b"\xff"})
        assert status == 401 and json.loads(body)["error"] == "invalid_caller_key", body


def test_without_a_key_no_provider_or_proxy_name_can_be_tried(tmp_path):
    """A name's existence is told only to a caller who may read it: without a key, an unknown
    provider was 404 `unknown_provider` where a known one was 401."""
    scoped, everything = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
    keys = tmp_path / "callers.json"
    write_keys(keys, [("scoped", scoped, ["default"]), ("all", everything, ["*"])])
    config = {"providers": TWO_PROVIDERS, "clientKeysFile": str(keys),
              "proxies": [{"name": "api", "target": "http://127.0.0.1:9/base", "provider": "payments"}]}
    with Broker(config) as broker:
        for path in ("/providers/payments/token", "/providers/ghost/token", "/proxy/ghost/x"):
            for headers in ({}, bearer("not-a-key")):
                status, _, body = broker.request("GET", path, headers=headers)
                assert status == 401, (path, headers, status, body)
        # A caller whose list leaves the name out learns no more than for a provider outside it.
        for path in ("/providers/payments/token", "/providers/ghost/token"):
            status, _, body = broker.request("GET", path, headers=bearer(scoped))
            assert status == 403 and json.loads(body)["error"] == "provider_not_allowed", (path, body)
        status, _, body = broker.request("GET", "/providers/ghost/token", headers=bearer(everything))
        assert status == 404 and json.loads(body)["error"] == "unknown_provider", body
        # Nor by a method the route does not take, nor by a route no provider has: a known name's
        # 405 or 404 once told it apart, without a key and to a caller whose list leaves it out.
        for method, route in (("DELETE", "token"), ("PUT", "token/ready"), ("GET", "token/refresh"),
                              ("GET", "nonexistent"), ("DELETE", "token/x")):
            for name in ("payments", "ghost"):
                path = f"/providers/{name}/{route}"
                status, _, body = broker.request(method, path)
                assert status == 401, (method, path, status, body)
                status, _, body = broker.request(method, path, headers=bearer(scoped))
                assert status == 403 and json.loads(body)["error"] == "provider_not_allowed", (method, path, body)
            expected = 405 if route.startswith("token") and route != "token/x" else 404
            assert broker.request(method, f"/providers/payments/{route}", headers=bearer(everything))[0] == expected
        status, _, body = broker.request("GET", "/proxy/ghost/x", headers=bearer(scoped))
        assert status == 404 and json.loads(body)["error"] == "unknown_proxy", body
    # The same with no proxy configured at all, where /proxy/ was a plain 404 to anyone.
    del config["proxies"]
    with Broker(config) as broker:
        for headers in ({}, bearer("not-a-key")):
            status, _, body = broker.request("GET", "/proxy/ghost/x", headers=headers)
            assert status == 401, (headers, status, body)
        status, _, body = broker.request("GET", "/proxy/ghost/x", headers=bearer(scoped))
        assert status == 404 and json.loads(body)["error"] == "unknown_proxy", body


def test_whitespace_after_a_header_value_is_not_part_of_it(tmp_path):
    """RFC 9110 §5.5: the spaces and tabs around a value are not the value. libmicrohttpd drops
    those before it and keeps those after: the guard's `true<TAB>` and a key followed by a space
    were refused (403, 401)."""
    key = secrets.token_urlsafe(32)
    keys = tmp_path / "callers.json"
    write_keys(keys, [("app", key, ["default"])])
    with Broker({"providers": TWO_PROVIDERS, "clientKeysFile": str(keys)}) as broker:
        for guard, authorization in ((b"true\t", key.encode() + b" "), (b"true \t ", key.encode() + b"\t")):
            request = (b"GET /token HTTP/1.1\r\nHost: x\r\nToken-Broker-Request: " + guard + b"\r\n"
                       + b"Authorization: Bearer " + authorization + b"\r\nConnection: close\r\n\r\n")
            status, _, body = parse(exchange(broker.addresses["token"], request)[0])
            assert status == 200 and json.loads(body)["access_token"], body
        # Whitespace inside the value still is the value: the key followed by a space and more is another key.
        request = (b"GET /token HTTP/1.1\r\nHost: x\r\nToken-Broker-Request: true\r\n"
                   + b"Authorization: Bearer " + key.encode() + b" x\r\nConnection: close\r\n\r\n")
        assert parse(exchange(broker.addresses["token"], request)[0])[0] == 401


def test_the_keys_file_is_reread_when_it_changes_and_a_broken_one_keeps_the_previous_list(tmp_path):
    first, second = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
    keys = tmp_path / "callers.json"
    write_keys(keys, [("first", first, ["default"])])
    with Broker({"clientKeysFile": str(keys)}) as broker:
        assert broker.request("GET", "/token", headers=bearer(first))[0] == 200
        assert broker.request("GET", "/token", headers=bearer(second))[0] == 401

        write_keys(keys, [("second", second, ["default"])])
        assert wait_until(lambda: broker.request("GET", "/token", headers=bearer(second))[0] == 200, timeout=10)
        assert broker.request("GET", "/token", headers=bearer(first))[0] == 401, "a removed key must stop working"
        assert "caller keys reloaded" in broker.stderr()

        keys.write_text('{"keys": [{"name": "x", "sha256": "not hex", "providers": ["default"]}]}')
        assert wait_until(lambda: "caller keys not reloaded" in broker.stderr(), timeout=10)
        assert broker.request("GET", "/token", headers=bearer(second))[0] == 200
        assert broker.stderr().count("caller keys not reloaded") == 1, "a broken file is reported once"


def test_a_key_removed_while_its_long_poll_waits_gets_401_not_the_next_token(tmp_path):
    """A re-read keys file applies to requests already waiting, when they are answered. A caller
    whose key was removed while its long-poll waited got the token another caller's refresh made
    afterwards (200), for up to maxWaitSec; one whose list lost the provider, the same."""
    removed, narrowed, kept, refresher = (secrets.token_urlsafe(32) for _ in range(4))
    keys = tmp_path / "callers.json"
    write_keys(keys, [("removed", removed, ["default"]), ("narrowed", narrowed, ["default", "payments"]),
                      ("kept", kept, ["default"]), ("refresher", refresher, ["default"])])
    config = {"maxWaitSec": 600, "providers": TWO_PROVIDERS, "clientKeysFile": str(keys)}
    with Broker(config) as broker:
        assert broker.get_json("/token", headers=bearer(kept))[0]["version"] == 1
        answers = {}

        def poll(name, key):
            answers[name] = broker.request("GET", "/token/ready?after=1&timeout=60", headers=bearer(key), timeout=90)

        polls = [threading.Thread(target=poll, args=(name, key))
                 for name, key in (("removed", removed), ("narrowed", narrowed), ("kept", kept))]
        for thread in polls:
            thread.start()
        assert wait_until(lambda: broker.metric("token_broker_longpoll_waiters", provider="default") == 3)

        write_keys(keys, [("narrowed", narrowed, ["payments"]), ("kept", kept, ["default"]),
                          ("refresher", refresher, ["default"])])
        assert wait_until(lambda: broker.request("GET", "/token", headers=bearer(removed))[0] == 401, timeout=10)
        assert broker.request("GET", "/token", headers=bearer(narrowed))[0] == 403
        status, headers, body = broker.request("POST", "/token/refresh", headers=bearer(refresher), body=b"{}",
                                               timeout=30)
        assert status == 200 and headers["etag"] == '"2"', (status, body)
        for thread in polls:
            thread.join(timeout=90)
        assert not any(thread.is_alive() for thread in polls)

        status, headers, body = answers["removed"]
        assert status == 401 and json.loads(body)["error"] == "invalid_caller_key", (status, body)
        assert 'error="invalid_token"' in headers["www-authenticate"]
        status, _, body = answers["narrowed"]
        assert status == 403 and json.loads(body)["error"] == "provider_not_allowed", (status, body)
        assert "narrowed" in json.loads(body)["error_description"]
        status, headers, body = answers["kept"]
        assert status == 200 and json.loads(body)["version"] == 2 and headers["etag"] == '"2"', (status, body)
        assert broker.metric("token_broker_http_requests_total", listener="token", route="/token/ready",
                             code="401") == 1


@pytest.mark.parametrize("document,needle", [
    ({"keys": [{"name": "a", "sha256": "ab" * 32, "providers": ["nope"]}]}, "no provider is named"),
    ({"keys": [{"name": "a", "sha256": "ab" * 31, "providers": ["default"]}]}, "sha256"),
    ({"keys": [{"name": "a", "sha256": "ab" * 32, "providers": ["default"], "key": "plain"}]}, "unknown key"),
    ({"keys": [{"name": "a", "sha256": "ab" * 32, "providers": ["default"]}, {"name": "a", "sha256": "cd" * 32, "providers": ["default"]}]}, "duplicate name"),
])
def test_a_bad_keys_file_stops_the_broker_at_start_naming_the_problem(tmp_path, document, needle):
    keys = tmp_path / "callers.json"
    keys.write_text(json.dumps(document))
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"clientKeysFile": str(keys), "listen": "127.0.0.1:0", "adminListen": "127.0.0.1:0"}))
    result = run_broker("--config", str(config), timeout=10)
    assert result.returncode == 2 and needle in result.stderr and "clientKeysFile" in result.stderr


# Unix sockets

class UnixConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout=10):
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


def unix_get(path, route, headers=None):
    connection = UnixConnection(path)
    try:
        connection.request("GET", route, headers=headers or {})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def test_unix_socket_listeners_with_their_file_mode(tmp_path):
    token_socket, admin_socket = str(tmp_path / "token.sock"), str(tmp_path / "admin.sock")
    # A socket file left behind by a broker that died is replaced.
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(token_socket)
    stale.close()
    with Broker({"unixSocketMode": "0600"}, listen=f"unix:{token_socket}", admin=f"unix:{admin_socket}") as broker:
        for path in (token_socket, admin_socket):
            mode = os.stat(path).st_mode
            assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
        status, body = unix_get(token_socket, "/token", {"Token-Broker-Request": "true"})
        assert status == 200 and json.loads(body)["access_token"]
        assert unix_get(admin_socket, "/healthz")[0] == 200
        result = run_broker("healthcheck", env={"TOKEN_BROKER_ADMIN_LISTEN": f"unix:{admin_socket}"}, timeout=10)
        assert result.returncode == 0, result.stderr
        # A second broker may not take over a live socket.
        with pytest.raises(RuntimeError, match="another process is listening"):
            Broker(listen=f"unix:{token_socket}", admin="127.0.0.1:0")
        assert broker.stop() == 0
    assert not os.path.exists(token_socket) and not os.path.exists(admin_socket)


def test_a_live_socket_the_broker_may_not_connect_to_is_refused_not_taken_over():
    # Another user's service listens on a socket the broker's user may not connect to, in a
    # directory its group may write: the failed trial connection (EACCES) is no sign that the
    # socket is stale, so the broker must leave it alone instead of replacing it.
    if os.geteuid() != 0:
        pytest.skip("only root can run the broker as another user")
    top = tempfile.mkdtemp(prefix="tb-foreign-socket-")
    try:
        os.chmod(top, 0o755)
        binary = os.path.join(top, "token-broker")
        shutil.copy(BINARY, binary)
        os.chmod(binary, 0o755)
        sockets = os.path.join(top, "sockets")
        os.mkdir(sockets)
        os.chown(sockets, 0, 65534)
        os.chmod(sockets, 0o770)
        path = os.path.join(sockets, "service.sock")
        theirs = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        theirs.bind(path)
        os.chmod(path, 0o600)
        theirs.listen(1)
        inode = os.stat(path).st_ino
        environment = base_environment()
        environment.update({"TOKEN_BROKER_LISTEN": f"unix:{path}", "TOKEN_BROKER_ADMIN_LISTEN": "127.0.0.1:0"})
        try:
            result = subprocess.run(
                ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", binary], capture_output=True,
                text=True, env=environment, timeout=20)
        finally:
            still_theirs = os.path.exists(path) and os.stat(path).st_ino == inode
            theirs.close()
        assert result.returncode != 0, result.stderr
        assert "a socket is there and cannot be tried (Permission denied)" in result.stderr, result.stderr
        assert still_theirs
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_a_unix_path_that_is_not_a_socket_is_refused(tmp_path):
    ordinary = tmp_path / "file"
    ordinary.write_text("keep me")
    with pytest.raises(RuntimeError, match="not a socket"):
        Broker(listen=f"unix:{ordinary}", admin="127.0.0.1:0")
    assert ordinary.read_text() == "keep me"


# Hostile input

def exchange(address, data, timeout=10):
    """Sends raw bytes to host:port; returns (everything received, whether the broker closed the connection)."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout) as connection:
        connection.sendall(data)
        received = b""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                chunk = connection.recv(65536)
            except ConnectionResetError:
                return received, True
            except socket.timeout:
                return received, False
            if not chunk:
                return received, True
            received += chunk
        return received, False


def raw(broker, data, timeout=10):
    """Sends raw bytes on a new connection to the token listener; returns everything the broker sent."""
    return exchange(broker.addresses["token"], data, timeout)[0]


def parse(answer):
    """(status, headers, body) of the first answer in `answer`, or None when nothing came back."""
    if not answer:
        return None
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    headers = dict(line.decode("latin-1").lower().split(": ", 1) for line in lines[1:] if b": " in line)
    length = int(headers.get("content-length", len(body)))
    return int(lines[0].split(b" ")[1]), headers, body[:length]


def assert_healthy(broker):
    assert broker.request("GET", "/healthz", listener="admin")[0] == 200
    body, _ = broker.get_json("/token")
    assert body["access_token"].count(".") == 2


GUARDED = b"Host: x\r\nToken-Broker-Request: true\r\nConnection: close\r\n"

# (name, raw request, expected status, whether the body is the broker's JSON error)
HOSTILE = [
    ("lower-case method", b"get /token HTTP/1.1\r\n" + GUARDED + b"\r\n", 405, True),
    ("unknown method", b"BREW /token HTTP/1.1\r\n" + GUARDED + b"\r\n", 405, True),
    ("unknown method on an unknown path", b"FOO /nowhere HTTP/1.1\r\n" + GUARDED + b"\r\n", 404, True),
    ("invalid percent-encoding in the path", b"GET /to%ZZken%G1 HTTP/1.1\r\n" + GUARDED + b"\r\n", 404, True),
    ("invalid UTF-8 in the path", b"GET /token%ff%fe HTTP/1.1\r\n" + GUARDED + b"\r\n", 404, True),
    ("raw invalid UTF-8 in the path", b"GET /token\xff\xfe HTTP/1.1\r\n" + GUARDED + b"\r\n", 404, True),
    ("invalid UTF-8 in a parameter", b"GET /token/ready?after=%ff%fe HTTP/1.1\r\n" + GUARDED + b"\r\n", 400, True),
    ("path traversal to a provider", b"GET /providers/../token HTTP/1.1\r\n" + GUARDED + b"\r\n", 404, True),
    ("encoded path traversal", b"GET /providers/%2e%2e/%2e%2e/etc/passwd HTTP/1.1\r\n" + GUARDED + b"\r\n", 404, True),
    ("traversal after a route", b"GET /token/../token HTTP/1.1\r\n" + GUARDED + b"\r\n", 404, True),
    ("absolute URL", b"GET http://169.254.169.254/token HTTP/1.1\r\n" + GUARDED + b"\r\n", 400, True),
    ("duplicate parameters", b"GET /token/ready?after=1&after=2 HTTP/1.1\r\n" + GUARDED + b"\r\n", 400, True),
    ("negative timeout", b"GET /token/ready?timeout=-1 HTTP/1.1\r\n" + GUARDED + b"\r\n", 400, True),
    ("enormous timeout", b"GET /token/ready?timeout=" + b"9" * 400 + b" HTTP/1.1\r\n" + GUARDED + b"\r\n", 400, True),
    ("negative after", b"GET /token/ready?after=-9223372036854775808 HTTP/1.1\r\n" + GUARDED + b"\r\n", 400, True),
    ("enormous after", b"GET /token/ready?after=18446744073709551616 HTTP/1.1\r\n" + GUARDED + b"\r\n", 400, True),
    ("NUL in a parameter", b"GET /token/ready?after=1%00 HTTP/1.1\r\n" + GUARDED + b"\r\n", 400, True),
    ("body of 10 MB", b"POST /token/refresh HTTP/1.1\r\n" + GUARDED + b"Content-Length: 10485760\r\n\r\n" + b"{" * 10_485_760, 413, True),
    # Answered by libmicrohttpd itself, before the broker's code runs: right status, its own HTML body.
    ("headers of 100 KB", b"GET /token HTTP/1.1\r\n" + GUARDED + b"X-Big: " + b"a" * 100_000 + b"\r\n\r\n", 431, False),
    ("a header line without a colon", b"GET /token HTTP/1.1\r\n" + GUARDED + b"no colon here\r\n\r\n", 400, False),
    ("an unknown HTTP version", b"GET /token HTTP/7.0\r\n" + GUARDED + b"\r\n", 505, False),
    # libmicrohttpd 0.9.75 closes these without any answer.
    ("a request line without a target", b"GET\r\n\r\n", None, False),
    ("binary garbage", bytes(range(1, 32)) + b"\r\n\r\n", None, False),
]


@pytest.fixture(scope="module")
def shared_broker():
    with Broker() as running:
        yield running


@pytest.mark.parametrize("name,data,status,json_body", HOSTILE, ids=[case[0] for case in HOSTILE])
def test_hostile_requests_get_the_right_status_and_leave_the_broker_healthy(shared_broker, name, data, status, json_body):
    answer = parse(raw(shared_broker, data))
    if status is None:
        assert answer is None
    else:
        assert answer is not None and answer[0] == status, answer
        if json_body:
            assert answer[1]["content-type"] == "application/json"
            document = json.loads(answer[2])
            assert set(document) == {"error", "error_description"}
    assert_healthy(shared_broker)


def test_a_slow_loris_client_is_cut_off_by_the_connection_timeout():
    timeout = 2
    with Broker({"connectionTimeoutSec": timeout}) as broker:
        host, port = broker._split("token")
        with socket.create_connection((host, port), timeout=5) as connection:
            connection.settimeout(0.3)
            started = time.monotonic()
            cut = False
            # One header byte every 0.25 s: never idle for the timeout, yet never finishing its headers.
            for byte in b"GET /token HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200:
                try:
                    connection.sendall(bytes([byte]))
                    if connection.recv(1024) == b"":
                        cut = True
                        break
                except socket.timeout:
                    continue
                except (BrokenPipeError, ConnectionResetError):
                    cut = True
                    break
                if time.monotonic() - started > 20:
                    break
            elapsed = time.monotonic() - started
            assert cut, "the broker kept a connection that dribbled its headers"
            # The whole request must arrive within the timeout; the margin is generous on purpose.
            assert elapsed <= timeout + 3, f"cut after {elapsed:.1f} s, with connectionTimeoutSec {timeout}"
        assert_healthy(broker)


def test_with_few_file_descriptors_the_token_listener_takes_what_fits_and_health_checks_still_get_in(tmp_path):
    # 700 descriptors and connectionLimit 1000: once the descriptors run out, libmicrohttpd fails
    # to take each new connection on every listener, the admin one too. The token listener must
    # take no more connections than fit beside the admin listener's: 700 - 128 kept aside - 256
    # for the admin listener - 32 for libcurl = 284.
    limited = tmp_path / "limited"
    limited.write_text(f'#!/bin/sh\nexec prlimit --nofile=700:700 -- "{os.path.abspath(BINARY)}" "$@"\n')
    limited.chmod(0o755)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 2048)), hard))
    idle = []
    try:
        with Broker({"connectionLimit": 1000, "providers": [{"name": "default"}]}, binary=str(limited)) as broker:
            assert "the open-file limit is too low for connectionLimit" in broker.stderr(), broker.stderr()
            assert "connections_taken=284" in broker.stderr(), broker.stderr()
            host, port = broker._split("token")
            for _ in range(900):
                connection = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                connection.settimeout(10)
                connection.connect((host, port))
                idle.append(connection)
            assert wait_until(lambda: broker.metric("token_broker_open_connections", listener="token") >= 250,
                              timeout=30)
            # More clients than descriptors: the health check, and a new token client, still get in.
            for _ in range(5):
                assert_healthy(broker)
    finally:
        for connection in idle:
            connection.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_heads_that_promise_bodies_never_sent_do_not_lock_out_a_health_check():
    # 300 requests on the admin listener (limit 256), each a head promising 10 bytes of body and
    # one byte sent: none is idle, and none is whole for a route to refuse. A health check must
    # still get in, by closing the request that has been arriving longest.
    held = []
    with Broker() as broker:
        host, port = broker._split("admin")
        try:
            for _ in range(300):
                connection = socket.create_connection((host, port), timeout=10)
                connection.sendall(b"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nx")
                held.append(connection)
                # Time for the head to be read before the next connection comes: a connection
                # still waiting for its head would be closed first.
                time.sleep(0.01)
            time.sleep(1)
            for _ in range(5):
                assert broker.request("GET", "/healthz", listener="admin", timeout=10)[0] == 200
            assert broker.metric("token_broker_connections_evicted_total", listener="admin") >= 5
        finally:
            for connection in held:
                connection.close()


def test_ten_thousand_idle_connections_do_not_lock_out_new_clients():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 10_200:
        # In CI a test that cannot run is a failure: a skip there would go unseen.
        message = f"the open-file limit ({hard}) is too low for 10,000 connections"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    idle = []
    with Broker() as broker:
        host, port = broker._split("token")
        try:
            for _ in range(10_000):
                connection = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                connection.settimeout(10)
                connection.connect((host, port))
                idle.append(connection)
            # Every idle connection is accepted, none has been answered or closed...
            assert wait_until(lambda: broker.metric("token_broker_open_connections", listener="token") >= 10_000, timeout=30)
            # ...and new clients are still served.
            for _ in range(20):
                assert_healthy(broker)
        finally:
            for connection in idle:
                connection.close()
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def all_threads_stopped(pid):
    """Whether every thread of the process is stopped by a signal (state T in /proc)."""
    states = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/stat") as handle:
            # The state follows the command name, which is in parentheses and may hold spaces.
            states.append(handle.read().rpartition(")")[2].split()[0])
    return all(state == "T" for state in states)


def test_exactly_128_requests_ready_at_once_on_one_listener_thread_are_all_answered():
    # libmicrohttpd 0.9.75 reads at most 128 events a call, and after a call that filled all 128
    # it waits again, for as long as the whole turn may: with exactly 128 ready and nothing else
    # to come, the answers waited for the nearest connection timeout (here 60 s), and were cut
    # off then. The admin listener runs on one thread; the broker is stopped (SIGSTOP) while the
    # 128 requests arrive, so that its thread finds them all ready at once.
    count = 128
    with Broker({"connectionTimeoutSec": 60}) as broker:
        host, port = broker._split("admin")
        connections = [socket.create_connection((host, port), timeout=10) for _ in range(count)]
        try:
            # Every connection accepted (the one asking counts too), and its own close seen.
            assert wait_until(lambda: broker.metric("token_broker_open_connections", listener="admin") >= count + 1)
            time.sleep(0.5)
            os.kill(broker.process.pid, signal.SIGSTOP)
            try:
                # Stopped for certain: a thread still running would take the first requests alone.
                assert wait_until(lambda: all_threads_stopped(broker.process.pid))
                for connection in connections:
                    connection.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            finally:
                os.kill(broker.process.pid, signal.SIGCONT)
            deadline = time.monotonic() + 10
            answered = 0
            for connection in connections:
                connection.settimeout(max(0.1, deadline - time.monotonic()))
                try:
                    answer = parse(connection.recv(65536))
                except (socket.timeout, ConnectionResetError):
                    break
                assert answer is not None and answer[0] == 200, answer
                answered += 1
            assert answered == count, f"{answered} of {count} answered within 10 s"
        finally:
            for connection in connections:
                connection.close()
        assert_healthy(broker)
