"""Token files (`sinks`): each new token written atomically, with a mode never wider than asked.

A reader thread loops over a token file while the broker replaces it, as a program that reads its
token from a file would, and checks every read: never a missing, empty, partial (a local signer's
token is verified whole by PyJWT) or wrongly-moded file.
"""
import hashlib
import json
import os
import re
import stat
import struct
import subprocess
import threading
import time
from urllib.parse import quote

import jwt
import pytest

from broker import Broker, run_broker
from issuers.process import OAuthServer
from test_http_api import wait_until

SECRET = "sink-secret-for-tests"
# The failing-issuer test watches a token expire; the others want no refresh while they look.
SHORT_LIFETIME = 6
LONG_LIFETIME = 300


@pytest.fixture(scope="module")
def short_issuer(tmp_path_factory):
    server = OAuthServer(str(tmp_path_factory.mktemp("sinks-short")), {"sink": SECRET}, lifetime=SHORT_LIFETIME)
    yield server
    server.close()


@pytest.fixture(scope="module")
def issuer(tmp_path_factory):
    server = OAuthServer(str(tmp_path_factory.mktemp("sinks")), {"sink": SECRET}, lifetime=LONG_LIFETIME)
    yield server
    server.close()


@pytest.fixture
def sink_dir(tmp_path):
    directory = tmp_path / "run"
    directory.mkdir()
    directory.chmod(0o700)
    return directory


def sha256(text):
    return hashlib.sha256(text.encode()).hexdigest()


def fingerprint(token):
    """As the broker logs a token: `sha256:` and 12 hex digits."""
    return "sha256:" + sha256(token)[:12]


def signer(tmp_key, **extra):
    return {"name": "default", "source": {"type": "jwt", "keyFile": tmp_key("ec"), "lifetimeSec": 300}, **extra}


def oauth_provider(issuer, **extra):
    return {"name": "default", "maxErrorTokenRefreshDelayMsec": 500, **extra,
            "source": {"type": "oauth2", "tokenURL": issuer.base + "/o/token/", "clientID": "sink", "clientSecret": SECRET,
                       "scope": "api"}}


def read(path):
    try:
        with open(path) as handle:
            return handle.read()
    except (FileNotFoundError, IsADirectoryError):
        return None


def sink_writes(broker, success=True):
    """token_broker_sink_writes_total for the provider `default`: `result="ok"`, or every other result."""
    return sum(value for (name, labels), value in broker.metrics().items()
               if name == "token_broker_sink_writes_total" and ("provider", "default") in labels
               and (("result", "ok") in labels) == success)


def refresh(broker, version):
    """Renews the token (version `version` refused downstream); waits out a 429. Returns the new body."""
    for _ in range(100):
        status, _, body = broker.request("POST", "/token/refresh", body=json.dumps({"rejected_version": version}).encode())
        if status != 429:
            break
        time.sleep(0.2)
    assert status == 200, (status, body)
    renewed = json.loads(body)
    assert renewed["version"] > version
    return renewed


class Reader(threading.Thread):
    """Reads the token file in a loop until stopped, as a consumer would, and notes every bad read;
    it also looks at every file in the directory (the broker's temporary files): none may ever
    have a mode wider than `mode`."""

    def __init__(self, path, mode, valid):
        super().__init__(daemon=True)
        self.path, self.mode, self.valid = path, mode, valid
        self.stop = threading.Event()
        self.problems, self.seen, self.reads = [], set(), 0

    def run(self):
        deadline = time.monotonic() + 600
        while not self.stop.is_set() and time.monotonic() < deadline:
            try:
                self.read_once()
                if self.reads % 20 == 0:
                    self.look_at_directory()
            except Exception as failure:  # noqa: BLE001 - every surprise is a finding
                self.problems.append(f"reader: {failure!r}")
            if len(self.problems) > 20:
                return

    def read_once(self):
        try:
            descriptor = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            self.problems.append("the token file was missing")
            return
        try:
            status = os.fstat(descriptor)
            data = b""
            while chunk := os.read(descriptor, 65536):
                data += chunk
        finally:
            os.close(descriptor)
        self.reads += 1
        if stat.S_IMODE(status.st_mode) & ~self.mode:
            self.problems.append(f"the token file had mode {stat.S_IMODE(status.st_mode):04o}")
        if not data:
            self.problems.append("the token file was empty")
            return
        token = data.decode(errors="replace")
        if token not in self.seen:
            try:
                self.valid(token)
            except Exception as failure:  # noqa: BLE001
                self.problems.append(f"a partial or invalid token ({len(data)} bytes): {failure!r}")
                return
            self.seen.add(token)

    def look_at_directory(self):
        for entry in os.scandir(os.path.dirname(self.path)):
            try:
                mode = stat.S_IMODE(entry.stat(follow_symlinks=False).st_mode)
            except FileNotFoundError:
                continue  # a temporary file renamed meanwhile
            if not entry.is_dir(follow_symlinks=False) and mode & ~self.mode:
                self.problems.append(f"{entry.name} had mode {mode:04o}")


def test_a_reader_never_sees_a_partial_empty_or_wrongly_moded_file_over_200_rotations(tmp_key, sink_dir):
    path = str(sink_dir / "default.token")
    config = {"providers": [signer(tmp_key, forcedRefreshMaxAttempts=100, forcedRefreshWindowSec=1)],
              "sinks": [{"provider": "default", "path": path, "format": "token", "mode": "0600"}]}
    # A umask of 0: a file created with a wide mode and narrowed afterwards would show it.
    with Broker(config, umask=0) as broker:
        assert wait_until(lambda: os.path.exists(path), timeout=20)
        jwks, _ = broker.get_json("/.well-known/jwks.json")
        keys = {key["kid"]: jwt.PyJWK(key).key for key in jwks["keys"]}

        def valid(token):
            jwt.decode(token, keys[jwt.get_unverified_header(token)["kid"]], algorithms=["ES256"], audience="token-broker")

        current = broker.get_json("/token")[0]
        assert wait_until(lambda: read(path) == current["access_token"], timeout=10)
        reader = Reader(path, 0o600, valid)
        reader.start()
        try:
            tokens = {current["access_token"]}
            for _ in range(200):
                current = refresh(broker, current["version"])
                assert current["access_token"] not in tokens, "each refresh yields a new token"
                tokens.add(current["access_token"])
                assert wait_until(lambda: read(path) == current["access_token"], timeout=10), "the file follows the token"
                status = os.stat(path)
                assert stat.S_IMODE(status.st_mode) == 0o600 and status.st_uid == os.geteuid()
                assert not reader.problems, reader.problems[:5]
        finally:
            reader.stop.set()
            reader.join(30)
        assert not reader.problems, reader.problems[:5]
        assert reader.reads > 0 and len(reader.seen) >= 2, "the reader raced with the rotations"
        assert reader.seen <= tokens
        served = broker.get_json("/token")[0]
        assert read(path) == served["access_token"] == current["access_token"]
        assert sorted(os.listdir(sink_dir)) == ["default.token"], "no temporary file is left behind"
        assert sink_writes(broker) == 201 and sink_writes(broker, success=False) == 0
        log = broker.stderr()
        assert not any(token in log for token in tokens), "a token in the log"
        assert any(path in line and fingerprint(served["access_token"]) in line for line in log.splitlines()), \
            "each write is logged with the token's fingerprint"


def test_the_json_format_holds_the_token_body_with_the_mode_asked_for(tmp_key, sink_dir):
    path = str(sink_dir / "default.json")
    config = {"providers": [signer(tmp_key)], "sinks": [{"provider": "default", "path": path, "format": "json", "mode": "0640"}]}
    with Broker(config, umask=0o077) as broker:
        assert wait_until(lambda: read(path) is not None, timeout=20)
        served = broker.get_json("/token")[0]
        written = json.loads(read(path))
        # The /token body without expires_in: a file cannot count down (its reader reads expires_at).
        assert "expires_in" not in written, written
        assert 0 < served["expires_in"] <= 300
        assert written == {key: value for key, value in served.items() if key != "expires_in"}
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o640
        renewed = refresh(broker, served["version"])
        assert wait_until(lambda: json.loads(read(path) or "{}").get("version") == renewed["version"], timeout=10)
        assert json.loads(read(path))["access_token"] == renewed["access_token"]
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o640


def test_the_bare_token_format_has_no_newline(tmp_key, sink_dir):
    path = str(sink_dir / "token")
    config = {"providers": [signer(tmp_key)], "sinks": [{"provider": "default", "path": path, "format": "token", "mode": "0600"}]}
    with Broker(config) as broker:
        assert wait_until(lambda: read(path) is not None, timeout=20)
        with open(path, "rb") as handle:
            assert handle.read() == broker.get_json("/token")[0]["access_token"].encode()


def test_a_provider_read_only_by_its_sink_keeps_refreshing_instead_of_pausing(tmp_key, sink_dir):
    """A provider pauses after tokenRefreshDelaySec without reads (test_http_api); its sink must
    keep it fresh, or the file would hold an expired token."""
    path = str(sink_dir / "default.token")
    provider = signer(tmp_key, tokenRefreshDelaySec=1)
    provider["source"]["lifetimeSec"] = 4
    config = {"providers": [provider], "sinks": [{"provider": "default", "path": path, "format": "token", "mode": "0600"}]}
    with Broker(config) as broker:
        seen = set()

        def renewed_twice():
            token = read(path)
            if token:
                seen.add(token)
            return len(seen) >= 3

        assert wait_until(renewed_twice, timeout=30, interval=0.1), f"{len(seen)} token(s) in the file"
        assert broker.metric("token_broker_provider_state", provider="default", state="paused") == 0


def test_a_sink_for_a_template_child_writes_that_child_s_token(issuer, sink_dir):
    audience = "https://orders.example/"
    path = str(sink_dir / "orders.token")
    started = time.time()
    provider = {**oauth_provider(issuer, name="orders"), "perRequest": ["audience"], "allowedAudiences": ["https://orders.example/*"]}
    config = {"providers": [provider],
              "sinks": [{"provider": "orders", "audience": audience, "path": path, "format": "token", "mode": "0600"}]}
    with Broker(config) as broker:
        assert wait_until(lambda: read(path) is not None, timeout=20)
        token = read(path)
        [record] = issuer.token_requests(since=started)
        assert record["token_sha256"] == sha256(token) and record["audience"] == [audience]
        status, _, body = broker.request("GET", f"/providers/orders/token?audience={quote(audience, safe='')}")
        assert status == 200 and json.loads(body)["access_token"] == token, "the same child serves HTTP"
        assert len(issuer.token_requests(since=started)) == 1
        _, _, body = broker.request("GET", "/readyz", listener="admin")
        [template] = json.loads(body)["templates"]
        assert template["children"] == 1 and template["ready"] == 1


def test_the_file_keeps_the_last_good_token_while_the_issuer_fails_then_follows_again(short_issuer, sink_dir):
    issuer = short_issuer
    path = str(sink_dir / "default.token")
    config = {"providers": [oauth_provider(issuer)], "sinks": [{"provider": "default", "path": path, "format": "token", "mode": "0600"}]}
    with Broker(config) as broker:
        good = broker.get_json("/token/ready?timeout=10")[0]["access_token"]
        # The write is counted just after the rename that shows it: wait for the count too.
        assert wait_until(lambda: read(path) == good and sink_writes(broker) >= 1, timeout=10)
        writes = sink_writes(broker)
        issuer.fault("5xx")
        try:
            # Refresh fails at about 75-85 % of the 6 s life; the token is served stale, then expires.
            def expired():
                assert read(path) == good, "the file lost the last good token"
                return broker.request("GET", "/token")[0] == 503

            assert wait_until(expired, timeout=SHORT_LIFETIME + 10)
            assert read(path) == good, "an expired token is left in place: the reader sees its exp"
            status, _, body = broker.request("GET", "/readyz", listener="admin")
            assert status == 503 and json.loads(body)["providers"][0]["last_error"] == "server_error"
            assert broker.metric("token_broker_refreshes_total", provider="default", result="server_error") >= 1
            assert sink_writes(broker) == writes and sink_writes(broker, success=False) == 0
        finally:
            issuer.fault("none")
        assert wait_until(lambda: read(path) not in (None, good), timeout=15)
        fresh = read(path)
        assert issuer.issued()[sha256(fresh)]["status"] == 200
        assert broker.get_json("/token")[0]["access_token"] == fresh


def test_a_failed_write_is_logged_counted_and_retried_at_the_next_token(tmp_key, sink_dir):
    path = sink_dir / "default.token"
    config = {"providers": [signer(tmp_key)], "sinks": [{"provider": "default", "path": str(path), "format": "token", "mode": "0600"}]}
    with Broker(config) as broker:
        assert wait_until(lambda: read(path) is not None, timeout=20)
        first = broker.get_json("/token")[0]
        # A directory where the file was: the rename over it fails (the tests may run as root,
        # for whom a read-only directory is no obstacle).
        path.unlink()
        path.mkdir()
        second = refresh(broker, first["version"])
        assert wait_until(lambda: sink_writes(broker, success=False) == 1, timeout=10)
        assert any(str(path) in line and re.search(r"level=(warn|error) ", line) for line in broker.stderr().splitlines()), \
            "the failed write is logged, naming the file"
        assert second["access_token"] not in broker.stderr()
        path.rmdir()
        third = refresh(broker, second["version"])
        assert wait_until(lambda: read(path) == third["access_token"], timeout=10)
        assert sorted(os.listdir(sink_dir)) == ["default.token"], "the failed write left no temporary file"
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_leftover_temporary_files_are_removed_at_start_and_counted_in_the_log(tmp_key, sink_dir):
    path = sink_dir / "default.token"
    leftovers = [sink_dir / f".default.token.tmp-{pid}-{n}" for pid in (1, 7) for n in range(1, 11)]
    for leftover in leftovers:
        leftover.write_text("half a token")
    (sink_dir / "victim").write_text("victim's own")
    (sink_dir / ".default.token.tmp-1-99").symlink_to(sink_dir / "victim")
    config = {"providers": [signer(tmp_key)], "sinks": [{"provider": "default", "path": str(path), "format": "token", "mode": "0600"}]}
    with Broker(config) as broker:
        assert wait_until(lambda: read(path) is not None, timeout=20)
        assert not any(leftover.exists() for leftover in leftovers)
        assert sorted(os.listdir(sink_dir)) == [".default.token.tmp-1-99", "default.token", "victim"]
        assert read(sink_dir / "victim") == "victim's own", "the link was not followed"
        assert any("leftover temporary files" in line and "removed=20" in line for line in broker.stderr().splitlines()), \
            broker.stderr()


# Refused at start

def test_a_directory_replaced_after_start_makes_the_file_not_ready_until_it_is_back(tmp_key, sink_dir):
    """The writes go through the directory opened at start, so that a directory renamed or
    replaced later receives nothing; /readyz went on saying the file was ready while readers of
    the path found no file, or another's. It now reports the file not ready, with the reason."""
    path = str(sink_dir / "t.token")
    config = {"providers": [signer(tmp_key)], "sinks": [{"provider": "default", "path": path}]}
    with Broker(config) as broker:
        assert wait_until(lambda: read(path) is not None, timeout=20)
        # The file is at its path a moment before its writer counts it written.
        assert wait_until(lambda: broker.request("GET", "/readyz", listener="admin")[0] == 200, timeout=10)
        moved = str(sink_dir) + "-moved"
        os.rename(sink_dir, moved)
        os.mkdir(sink_dir, 0o700)
        status, _, body = broker.request("GET", "/readyz", listener="admin")
        report = json.loads(body)
        assert status == 503 and not report["ready"], report
        sink = report["sinks"][0]
        assert not sink["ready"] and str(sink_dir) in sink["problem"] and "renamed or replaced" in sink["problem"], sink
        # Put back, the directory the broker writes through is the one at the path again.
        os.rmdir(sink_dir)
        os.rename(moved, sink_dir)
        status, _, body = broker.request("GET", "/readyz", listener="admin")
        assert status == 200 and "problem" not in json.loads(body)["sinks"][0], body


@pytest.mark.parametrize("case", ["missing", "0777", "1777", "0703", "parent 0777", "owned by nobody",
                                  "parent owned by nobody"])
def test_a_directory_missing_or_writable_by_others_stops_the_broker_with_the_reason(tmp_path, case):
    directory = tmp_path / "run"
    if case == "parent 0777":
        # Others may rename run/ away and put a run/ of their own in its place.
        directory = tmp_path / "shared" / "run"
        directory.mkdir(parents=True, mode=0o700)
        directory.parent.chmod(0o777)
    elif case == "owned by nobody":
        if os.geteuid() != 0:
            pytest.skip("only root can give a directory to another user")
        directory.mkdir(mode=0o755)
        os.chown(directory, 65534, 65534)
    elif case == "parent owned by nobody":
        # The parent's owner may rename run/ away and put a run/ of its own in its place,
        # whatever the parent's mode.
        if os.geteuid() != 0:
            pytest.skip("only root can give a directory to another user")
        directory = tmp_path / "theirs" / "run"
        directory.mkdir(parents=True, mode=0o700)
        directory.parent.chmod(0o755)
        os.chown(directory.parent, 65534, 65534)
    elif case != "missing":
        directory.mkdir()
        directory.chmod(int(case, 8))
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"sinks": [{"provider": "default", "path": str(directory / "t"), "format": "token", "mode": "0600"}]}))
    for args in (["--config", str(config)], ["--check-config", "--config", str(config)]):
        result = run_broker(*args, env={"TOKEN_BROKER_LISTEN": "127.0.0.1:0", "TOKEN_BROKER_ADMIN_LISTEN": "127.0.0.1:0"})
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert str(directory) in result.stderr, result.stderr
        if case == "parent 0777":
            assert f"{directory.parent}, a directory above {directory}, is writable by other users" in result.stderr, \
                result.stderr
        elif case == "owned by nobody":
            assert "owned by user 65534" in result.stderr, result.stderr
        elif case == "parent owned by nobody":
            assert f"{directory.parent}, a directory above {directory}, is owned by user 65534" in result.stderr, \
                result.stderr
        else:
            assert case == "missing" or "writable" in result.stderr, result.stderr
    assert not directory.exists() or os.listdir(directory) == []


@pytest.mark.parametrize("sink,key", [
    ({"provider": "nope"}, "provider"),
    ({"format": "yaml"}, "format"),
    ({"mode": "rw-------"}, "mode"),
    ({"mode": "0800"}, "mode"),
    ({"colour": "blue"}, "colour"),
    ({"audience": "https://orders.example/"}, "audience"),  # the provider is no template
    ({"path": None}, "path"),
    ({"trustDirectoryWriters": "yes"}, "trustDirectoryWriters"),
    ({"sharedDirectory": True}, "sharedDirectory"),
])
def test_a_bad_sink_is_refused_at_start_naming_the_key(tmp_path, sink, key):
    directory = tmp_path / "run"
    directory.mkdir(mode=0o700)
    entry = {"provider": "default", "path": str(directory / "t"), "format": "token", "mode": "0600", **sink}
    entry = {name: value for name, value in entry.items() if value is not None}
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"sinks": [entry]}))
    result = run_broker("--check-config", "--config", str(config))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "sinks[0]" in result.stderr and key in result.stderr, result.stderr


@pytest.mark.parametrize("case", ["the same path twice", "a provider without background refresh"])
def test_sinks_that_could_not_work_are_refused_at_start(tmp_path, case):
    directory = tmp_path / "run"
    directory.mkdir(mode=0o700)
    sink = {"provider": "default", "path": str(directory / "t"), "format": "token", "mode": "0600"}
    if case == "the same path twice":
        config = {"sinks": [sink, {**sink, "format": "json"}]}
    else:
        config = {"providers": [{"name": "default", "backgroundRefreshEnabled": False}], "sinks": [sink]}
    (tmp_path / "config.json").write_text(json.dumps(config))
    result = run_broker("--check-config", "--config", str(tmp_path / "config.json"))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "sinks[" in result.stderr, result.stderr


def acl(*entries):
    """An ACL as `setfacl` stores it: version 2, then entries of tag, permissions and id (little-endian)."""
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", tag, bits, who) for tag, bits, who in entries)


ANYONE = 0xFFFFFFFF


def set_acl(directory, case):
    """Gives `directory` the ACL of `case`; returns the start of the reason a broker refuses it with."""
    if case == "default ACL":
        # user::rwx, group::---, other::---
        os.setxattr(directory, "system.posix_acl_default", acl((0x01, 7, ANYONE), (0x04, 0, ANYONE), (0x20, 0, ANYONE)))
        return f"the directory {directory} has a default ACL"
    if case == "a named user may write":
        # user::rwx, user:4242:rwx, group::r-x, mask::rwx, other::---
        os.setxattr(directory, "system.posix_acl_access", acl(
            (0x01, 7, ANYONE), (0x02, 7, 4242), (0x04, 5, ANYONE), (0x10, 7, ANYONE), (0x20, 0, ANYONE)))
        return f"the directory {directory} lets user 4242 write it"
    assert case == "a named group may write", case
    # user::rwx, group::r-x, group:4343:rwx, mask::rwx, other::---
    os.setxattr(directory, "system.posix_acl_access", acl(
        (0x01, 7, ANYONE), (0x04, 5, ANYONE), (0x08, 7, 4343), (0x10, 7, ANYONE), (0x20, 0, ANYONE)))
    return f"the directory {directory} lets group 4343 write it"


ACL_CASES = ["default ACL", "a named user may write", "a named group may write"]


@pytest.mark.parametrize("case", ACL_CASES)
def test_a_directory_with_a_default_acl_or_another_writer_in_its_acl_is_refused_at_start(tmp_path, case):
    """A default ACL would pass its entries on to the new file, whatever the mode bits say; an
    access ACL may let another user, or a named group's members, write the directory, which the
    mode bits do not show."""
    directory = tmp_path / "run"
    directory.mkdir(mode=0o700)
    reason = set_acl(directory, case)
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"sinks": [{"provider": "default", "path": str(directory / "t")}]}))
    for args in (["--check-config"], []):
        result = run_broker(*args, "--config", str(config),
                            env={"TOKEN_BROKER_LISTEN": "127.0.0.1:0", "TOKEN_BROKER_ADMIN_LISTEN": "127.0.0.1:0"})
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert reason in result.stderr, result.stderr
    assert os.listdir(directory) == []


@pytest.mark.parametrize("entries", [
    [(0x01, 7, ANYONE), (0x02, 5, 4242), (0x04, 5, ANYONE), (0x10, 5, ANYONE), (0x20, 0, ANYONE)],  # user:4242:r-x
    [(0x01, 7, ANYONE), (0x02, 7, 4242), (0x04, 5, ANYONE), (0x10, 5, ANYONE), (0x20, 0, ANYONE)],  # rwx, mask r-x
    [(0x01, 7, ANYONE), (0x04, 5, ANYONE), (0x08, 5, 4343), (0x10, 5, ANYONE), (0x20, 0, ANYONE)],  # group:4343:r-x
], ids=["a named reader", "a writer the mask stops", "a named group of readers"])
def test_a_directory_whose_acl_lets_no_other_user_write_is_accepted(tmp_path, entries):
    directory = tmp_path / "run"
    directory.mkdir(mode=0o700)
    os.setxattr(directory, "system.posix_acl_access", acl(*entries))
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"sinks": [{"provider": "default", "path": str(directory / "t")}]}))
    result = run_broker("--check-config", "--config", str(config))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("other", ["run/../run/same.token", "link/same.token", "link/../run/same.token"])
def test_two_sinks_naming_one_file_through_dot_dot_or_a_link_are_refused_naming_both(tmp_path, other):
    (tmp_path / "run").mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(tmp_path / "run")
    sinks = [{"provider": "default", "path": str(tmp_path / "run" / "same.token")},
             {"provider": "default", "path": str(tmp_path / other), "format": "json"}]
    (tmp_path / "config.json").write_text(json.dumps({"sinks": sinks}))
    for args in (["--check-config"], []):
        result = run_broker(*args, "--config", str(tmp_path / "config.json"),
                            env={"TOKEN_BROKER_LISTEN": "127.0.0.1:0", "TOKEN_BROKER_ADMIN_LISTEN": "127.0.0.1:0"})
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert "sinks[1].path" in result.stderr and "sinks[0]" in result.stderr, result.stderr
        assert "the same file" in result.stderr, result.stderr
    assert os.listdir(tmp_path / "run") == []


def test_a_sink_s_values_must_pass_the_template_s_allow_list(tmp_path, sink_dir):
    provider = {"name": "orders", "perRequest": ["audience"], "allowedAudiences": ["https://orders.example/*"],
                "source": {"type": "oauth2", "tokenURL": "http://127.0.0.1:9/token", "clientID": "c", "clientSecret": "s"}}
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"providers": [provider], "sinks": [
        {"provider": "orders", "audience": "https://evil.example/", "path": str(sink_dir / "t"), "format": "token", "mode": "0600"}]}))
    result = run_broker("--check-config", "--config", str(config))
    assert result.returncode == 2 and "audience" in result.stderr, result.stderr


def refused(config, reason):
    """Runs `--check-config`, then a start, on `config` (a path): both must exit 2 with `reason`."""
    for args in (["--check-config"], []):
        result = run_broker(*args, "--config", str(config),
                            env={"TOKEN_BROKER_LISTEN": "127.0.0.1:0", "TOKEN_BROKER_ADMIN_LISTEN": "127.0.0.1:0"})
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert reason in result.stderr, result.stderr


def write_sink_config(tmp_path, path, **extra):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"sinks": [{"provider": "default", "path": str(path)}], **extra}))
    return config


@pytest.mark.parametrize("case", ["a directory another user owns", "a link another user owns in a sticky directory"])
def test_a_symbolic_link_on_the_way_that_another_user_could_repoint_is_refused(tmp_path, case):
    """The link's holder, or the link's own owner, could point it at a directory of their own;
    readers of the configured path would then read their token file while the broker writes
    the one it opened at start."""
    if os.geteuid() != 0:
        pytest.skip("only root can give a directory or a link to another user")
    target = tmp_path / "d1"
    target.mkdir(mode=0o700)
    holder = tmp_path / "evil"
    holder.mkdir(mode=0o755 if case == "a directory another user owns" else 0o1777)
    holder.chmod(0o755 if case == "a directory another user owns" else 0o1777)
    link = holder / "link"
    link.symlink_to(target)
    if case == "a directory another user owns":
        os.chown(holder, 65534, 65534)
        reason = f"{holder}, a directory above {link}, is owned by user 65534"
    else:
        os.lchown(link, 65534, 65534)
        reason = f"{link}, a symbolic link on the way to {link}, is owned by user 65534"
    refused(write_sink_config(tmp_path, link / "p.token"), reason)
    assert os.listdir(target) == []


def test_a_symbolic_link_that_only_root_or_the_broker_could_repoint_is_followed(tmp_path):
    """As /var/run -> /run: a link in a directory others cannot write, owned by root, to a good directory."""
    (tmp_path / "run").mkdir(mode=0o700)
    (tmp_path / "var").mkdir(mode=0o755)
    (tmp_path / "var" / "run").symlink_to("../run")
    result = run_broker("--check-config", "--config", str(write_sink_config(tmp_path, tmp_path / "var/run/p.token")))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("entry,who", [((0x02, 7, 65534), "user 65534"), ((0x08, 7, 4343), "group 4343")],
                         ids=["a named user", "a named group"])
def test_a_directory_above_whose_acl_lets_another_user_write_it_is_refused_unless_sticky(tmp_path, entry, who):
    """Whoever the ACL lets write `anc` could rename `sub` away and put one of their own in its
    place, which readers of the path would read; the mode bits show only the ACL's mask."""
    above = tmp_path / "anc"
    directory = above / "sub"
    directory.mkdir(parents=True, mode=0o700)
    above.chmod(0o755)
    # user::rwx, group::r-x, mask::rwx, other::r-x and the entry, in the order of their tags, as the kernel wants
    os.setxattr(above, "system.posix_acl_access", acl(*sorted(
        [(0x01, 7, ANYONE), entry, (0x04, 5, ANYONE), (0x10, 7, ANYONE), (0x20, 5, ANYONE)])))
    config = write_sink_config(tmp_path, directory / "t")
    refused(config, f"{above}, a directory above {directory}, lets {who} write it (an ACL entry)")
    assert os.listdir(directory) == []
    # Sticky, as /tmp: they may not rename what they do not own.
    above.chmod(0o1775)
    result = run_broker("--check-config", "--config", str(config))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture
def key_dir(tmp_path, tmp_key):
    """A private directory holding the configuration's files: a signing key (`key.pem`)."""
    directory = tmp_path / "etc"
    directory.mkdir(mode=0o700)
    (directory / "key.pem").write_bytes(open(tmp_key("ec"), "rb").read())
    return directory


@pytest.mark.parametrize("path,reason", [
    ("key.pem", "is {etc}/key.pem, a file the configuration names"),
    ("config.json", "is the configuration file {etc}/config.json"),
    ("sub/../key.pem", "is {etc}/key.pem, a file the configuration names"),
    ("link/key.pem", "is {etc}/key.pem, a file the configuration names"),
    ("hard.pem", "is {etc}/key.pem, a file the configuration names"),
    ("records/a.token", "is in the store's directory {etc}/records"),
    ("store.key", "is {etc}/store.key, a file the configuration names"),
], ids=["the signing key", "the configuration file", "the key through ..", "the key through a link",
        "a hard link of the key", "the store's directory", "the store's key"])
def test_a_token_file_that_is_a_file_the_broker_reads_is_refused(key_dir, path, reason):
    """Each write would replace it: the private key or the configuration would be gone, and the
    next start would fail. Paths are relative to the configuration file, as the broker reads them."""
    (key_dir / "sub").mkdir(mode=0o700)
    (key_dir / "link").symlink_to(".")
    os.link(key_dir / "key.pem", key_dir / "hard.pem")
    (key_dir / "records").mkdir(mode=0o700)
    (key_dir / "store.key").write_text("00" * 32)
    (key_dir / "store.key").chmod(0o600)
    config = key_dir / "config.json"
    before = (key_dir / "key.pem").read_bytes()
    config.write_text(json.dumps({
        "providers": [{"name": "default", "source": {"type": "jwt", "keyFile": "key.pem"}}],
        "store": {"type": "file", "path": "records", "keyFile": "store.key"},
        "sinks": [{"provider": "default", "path": path, "format": "json"}]}))
    written = config.read_text()
    # The path, in quotes, is escaped in the log line: the reason follows it.
    refused(config, f'sinks[0].path: \\"{key_dir}/{path}\\" ' + reason.format(etc=key_dir))
    assert (key_dir / "key.pem").read_bytes() == before and config.read_text() == written
    assert os.listdir(key_dir / "records") == []


@pytest.mark.parametrize("case", ["/proc", "a name of 300 bytes"])
def test_a_token_file_that_could_never_be_written_is_refused_at_start(tmp_path, sink_dir, case):
    """`/proc` passes the owner and mode checks, but no file can be made there; a name longer
    than the file system's limit (255 bytes) makes every rename fail."""
    if case == "/proc":
        path, reason = "/proc/p.token", "the directory /proc cannot hold a token file: a file cannot be created there"
    else:
        path, reason = str(sink_dir / ("t" * 300)), "is 300 bytes long; allowed: at most 255"
    refused(write_sink_config(tmp_path, path), reason)
    assert os.listdir(sink_dir) == []


def test_a_token_file_with_a_name_of_255_bytes_is_written(tmp_key, sink_dir):
    path = sink_dir / ("t" * 255)
    with Broker({"providers": [signer(tmp_key)], "sinks": [{"provider": "default", "path": str(path)}]}):
        assert wait_until(lambda: read(path) is not None, timeout=20)


# A directory others may write, whose writers are trusted: trustDirectoryWriters (a Kubernetes
# emptyDir: mode 0777, or 2777 with the pod's fsGroup as its group)

OTHER_GROUP = 4343


def shared_directory(tmp_path, case):
    """`tmp_path/shared` as the kubelet makes an emptyDir: mode 0777, or with an fsGroup its
    group and the setgid bit (2777). Returns the directory and its group."""
    directory = tmp_path / "shared"
    directory.mkdir()
    group = os.getegid()
    if case == "2777 with a group":
        groups = [gid for gid in os.getgroups() if gid != os.getegid()]
        if os.geteuid() == 0:
            group = OTHER_GROUP
        elif groups:
            group = groups[0]
        else:
            pytest.skip("the test user can give a directory no other group")
        os.chown(directory, -1, group)
    directory.chmod(0o2777 if case == "2777 with a group" else 0o777)
    return directory, group


def trusted_sink(path, **extra):
    return {"provider": "default", "path": str(path), "trustDirectoryWriters": True, **extra}


def trust_warnings(text):
    """The start-up warning lines of sinks whose directory's writers are trusted."""
    return [line for line in text.splitlines() if "level=warn" in line and "trustDirectoryWriters" in line]


SHARED_CASES = ["0777", "2777 with a group"]


@pytest.mark.parametrize("case", SHARED_CASES)
def test_a_directory_others_can_write_is_refused_unless_the_sink_trusts_its_writers(tmp_path, case):
    """Without the opt-in, an emptyDir is refused (exit 2) with the reason and the way out; with
    it, --check-config passes and warns, naming the directory and its mode. A broker that does not
    know the key refuses it as unknown (exit 2): the opt-in is never silently ignored."""
    directory, _ = shared_directory(tmp_path, case)
    mode = "02777" if case == "2777 with a group" else "0777"
    plain = write_sink_config(tmp_path, directory / "t.token")
    refused(plain, f"the directory {directory} is writable by other users (mode {mode})")
    refused(plain, "; or, when every user who can write there is trusted (a Kubernetes emptyDir), trustDirectoryWriters true")
    config = tmp_path / "trusted.json"
    config.write_text(json.dumps({"sinks": [trusted_sink(directory / "t.token")]}))
    result = run_broker("--check-config", "--config", str(config))
    assert result.returncode == 0, result.stdout + result.stderr
    [warning] = trust_warnings(result.stderr)
    assert "sink=sinks[0]" in warning and f"directory={directory}" in warning, warning
    assert f'writable_by_others="{directory} (mode {mode})"' in warning, warning
    assert "can replace or remove the token file between writes" in warning, warning
    assert os.listdir(directory) == []


def test_the_trust_lifts_only_the_writer_checks(tmp_path):
    """A directory above that others can write is trusted too and named in the warning; a default
    ACL (which would widen who may read each new file) and a directory another user owns stay
    refused; the key takes only true or false."""
    parent = tmp_path / "shared"
    directory = parent / "tokens"
    directory.mkdir(parents=True, mode=0o700)
    parent.chmod(0o777)
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"sinks": [trusted_sink(directory / "t")]}))
    result = run_broker("--check-config", "--config", str(config))
    assert result.returncode == 0, result.stdout + result.stderr
    [warning] = trust_warnings(result.stderr)
    assert f'writable_by_others="{parent}, a directory above (mode 0777)"' in warning, warning

    # user::rwx, user:4242:rwx, group::r-x, mask::rwx, other::---: another writer, by an ACL entry.
    directory.chmod(0o750)
    os.setxattr(directory, "system.posix_acl_access", acl(
        (0x01, 7, ANYONE), (0x02, 7, 4242), (0x04, 5, ANYONE), (0x10, 7, ANYONE), (0x20, 0, ANYONE)))
    result = run_broker("--check-config", "--config", str(config))
    assert result.returncode == 0, result.stdout + result.stderr
    [warning] = trust_warnings(result.stderr)
    assert f"{directory} lets user 4242 write it (an ACL entry)" in warning, warning
    parent.chmod(0o755)
    refused(write_sink_config(tmp_path, directory / "t"),
            f"the directory {directory} lets user 4242 write it (an ACL entry): they could replace or remove the "
            "token file; allowed: a directory only its owner and group can write; or, when every user who can write "
            "there is trusted (a Kubernetes emptyDir), trustDirectoryWriters true")

    set_acl(directory, "default ACL")
    refused(config, f"the directory {directory} has a default ACL")

    config.write_text(json.dumps({"sinks": [trusted_sink(directory / "t", trustDirectoryWriters="yes")]}))
    refused(config, "sinks[0].trustDirectoryWriters: must be true or false, not a string")
    if os.geteuid() == 0:
        os.removexattr(directory, "system.posix_acl_default")
        os.chown(directory, 65534, 65534)
        config.write_text(json.dumps({"sinks": [trusted_sink(directory / "t")]}))
        refused(config, f"the directory {directory} is owned by user 65534")


@pytest.mark.parametrize("case", SHARED_CASES)
def test_a_sink_trusting_its_directory_s_writers_gets_each_new_token_with_its_mode(tmp_key, tmp_path, case):
    """The sidecar's case: the broker writes into the emptyDir, mode 0640; with an fsGroup the file
    takes the directory's group (setgid), so that the application, in that group, reads it."""
    directory, group = shared_directory(tmp_path, case)
    path = directory / "default.token"
    config = {"providers": [signer(tmp_key, forcedRefreshMaxAttempts=100, forcedRefreshWindowSec=1)],
              "sinks": [trusted_sink(path, mode="0640")]}
    with Broker(config, umask=0o077) as broker:
        assert wait_until(lambda: read(path) is not None, timeout=20)
        assert len(trust_warnings(broker.stderr())) == 1, broker.stderr()
        current = broker.get_json("/token")[0]
        assert wait_until(lambda: read(path) == current["access_token"], timeout=10)
        for _ in range(3):
            current = refresh(broker, current["version"])
            assert wait_until(lambda: read(path) == current["access_token"], timeout=10), "the file follows the token"
            status = os.lstat(path)
            assert stat.S_ISREG(status.st_mode) and stat.S_IMODE(status.st_mode) == 0o640
            assert status.st_uid == os.geteuid() and status.st_gid == group
        status, _, body = broker.request("GET", "/readyz", listener="admin")
        assert status == 200 and json.loads(body)["sinks"][0]["ready"], body
        assert sorted(os.listdir(directory)) == ["default.token"]
        assert sink_writes(broker) == 4 and sink_writes(broker, success=False) == 0


def temporary_names(broker, path, count):
    """The names of the temporary files the broker's first writer of `path` makes first: each
    writer numbers its own from its number (the first made is 1) shifted 32 bits
    (AtomicFileWriter), after `.{name}.tmp-{pid}-`."""
    return [f".{path.name}.tmp-{broker.process.pid}-{(1 << 32) + n}" for n in range(1, count + 1)]


def test_names_another_writer_plants_in_a_trusted_directory_are_never_followed_nor_written_through(tmp_key, tmp_path):
    """Whoever may write the directory plants, between two writes, a symbolic link at the path
    and at the next temporary names (to a file the broker could write but they could not), a
    file of their own at a temporary name, a hard link at the path: the token goes only into a
    new file the broker made, renamed over the path; the links' target is untouched."""
    directory, _ = shared_directory(tmp_path, "0777")
    path = directory / "t.token"
    victim = tmp_path / "victim"
    victim.write_text("victim's own")
    victim.chmod(0o644)
    config = {"providers": [signer(tmp_key, forcedRefreshMaxAttempts=100, forcedRefreshWindowSec=1)],
              "sinks": [trusted_sink(path, mode="0640")]}
    with Broker(config) as broker:
        assert wait_until(lambda: read(path) is not None and sink_writes(broker) == 1, timeout=20)
        current = broker.get_json("/token")[0]
        # The first write took the first name; the next ones are planted.
        names = temporary_names(broker, path, 6)[1:]
        for index, name in enumerate(names):
            if index % 2:
                (directory / name).write_text("theirs")
            else:
                (directory / name).symlink_to(victim)
        os.symlink(victim, directory / "link")
        os.rename(directory / "link", path)

        current = refresh(broker, current["version"])
        assert wait_until(lambda: not os.path.islink(path) and read(path) == current["access_token"], timeout=10)
        assert victim.read_text() == "victim's own" and stat.S_IMODE(victim.stat().st_mode) == 0o644
        for index, name in enumerate(names):
            planted = directory / name
            assert planted.is_symlink() if index % 2 == 0 else planted.read_text() == "theirs", name
        assert stat.S_IMODE(os.lstat(path).st_mode) == 0o640

        # A hard link of the victim at the path: replaced by the next write, never written through.
        os.link(victim, directory / "hard")
        os.rename(directory / "hard", path)
        current = refresh(broker, current["version"])
        assert wait_until(lambda: read(path) == current["access_token"], timeout=10)
        assert victim.read_text() == "victim's own" and victim.stat().st_nlink == 1
        assert sorted(os.listdir(directory)) == sorted(names + ["t.token"])
        assert sink_writes(broker, success=False) == 0
        assert current["access_token"] not in broker.stderr()


def test_a_file_another_writer_removes_replaces_or_blocks_shows_in_readyz_and_is_written_again(tmp_key, tmp_path):
    """What trusted writers can still do: remove or replace the file between writes, or put a
    directory at its path. /readyz reports the file not ready with the problem; the broker writes
    the token it holds again at its next look (every tokenRefreshDelaySec / 2), logging it; a
    write that cannot land (a directory at the path) fails, is logged and counted, and leaves
    nothing elsewhere."""
    directory, _ = shared_directory(tmp_path, "0777")
    path = directory / "t.token"
    # A token every 20 s; the sink looks again every 10 s.
    config = {"providers": [signer(tmp_key, tokenRefreshDelaySec=20, forcedRefreshMaxAttempts=100,
                                   forcedRefreshWindowSec=1)],
              "sinks": [trusted_sink(path)]}

    def readyz():
        status, _, body = broker.request("GET", "/readyz", listener="admin")
        return status, json.loads(body)["sinks"][0]

    with Broker(config) as broker:
        assert wait_until(lambda: read(path) is not None, timeout=20)
        token = read(path)
        # The file is at its path a moment before its writer counts it written.
        assert wait_until(lambda: readyz()[0] == 200, timeout=10), readyz()
        path.unlink()
        status, sink = readyz()
        assert status == 503 and not sink["ready"] and "was removed since the broker wrote it" in sink["problem"], sink
        assert wait_until(lambda: read(path) is not None, timeout=30), "written again at the next look"
        assert wait_until(lambda: readyz()[0] == 200, timeout=10)
        # The status is counted before the write is logged.
        assert wait_until(lambda: any("token file written again" in line and str(path) in line and "level=warn" in line
                                      for line in broker.stderr().splitlines()), timeout=10), broker.stderr()

        (directory / "theirs").write_text("not a token")
        os.rename(directory / "theirs", path)
        status, sink = readyz()
        assert status == 503 and "was replaced since the broker wrote it" in sink["problem"], sink
        assert wait_until(lambda: read(path) not in (None, "not a token"), timeout=30)
        assert wait_until(lambda: readyz()[0] == 200, timeout=10)

        # A directory at the path: no rename can replace it.
        path.unlink()
        path.mkdir()
        current = broker.get_json("/token")[0]
        renewed = refresh(broker, current["version"])
        assert wait_until(lambda: sink_writes(broker, success=False) >= 1, timeout=10)
        status, sink = readyz()
        assert status == 503 and "Is a directory" in sink["last_error"], sink
        assert f"{path} is a directory (made by a writer of its directory), which no write can replace" in sink["problem"]
        assert any(str(path) in line and "level=error" in line and "Is a directory" in line
                   for line in broker.stderr().splitlines()), broker.stderr()
        assert sorted(os.listdir(directory)) == ["t.token"] and os.listdir(path) == [], "nothing written elsewhere"
        path.rmdir()
        assert wait_until(lambda: read(path) == renewed["access_token"], timeout=30)
        assert wait_until(lambda: readyz()[0] == 200, timeout=10)
        assert token not in broker.stderr() and renewed["access_token"] not in broker.stderr()


def test_a_reload_checks_and_warns_about_a_trusted_directory_as_start_does(tmp_key, tmp_path):
    """A reload opens the token files' directories again (Reloading): one others can write is
    refused (422, and the running writers go on) unless its sink trusts its writers, when it is
    taken, written, and warned about."""
    from test_reload import post_reload, rewrite

    directory, _ = shared_directory(tmp_path, "0777")
    path = directory / "t.token"
    provider = signer(tmp_key)
    with Broker({"providers": [provider]}) as broker:
        rewrite(broker, {"providers": [provider], "sinks": [{"provider": "default", "path": str(path)}]})
        status, document = post_reload(broker)
        assert status == 422 and "is writable by other users (mode 0777)" in document["error_description"], document
        assert os.listdir(directory) == [] and not trust_warnings(broker.stderr())

        rewrite(broker, {"providers": [provider], "sinks": [trusted_sink(path)]})
        status, document = post_reload(broker)
        assert status == 200, document
        assert wait_until(lambda: read(path) == broker.get_json("/token")[0]["access_token"], timeout=20)
        assert len(trust_warnings(broker.stderr())) == 1, broker.stderr()

        # Trust withdrawn: refused, and the trusted writer goes on.
        rewrite(broker, {"providers": [provider], "sinks": [{"provider": "default", "path": str(path)}]})
        status, document = post_reload(broker)
        assert status == 422, document
        renewed = refresh(broker, broker.get_json("/token")[0]["version"])
        assert wait_until(lambda: read(path) == renewed["access_token"], timeout=10)


# What other users can do in a trusted directory, as real other users: user 4242, in the
# directory's group (4343) only, reaching it through a descriptor the test opens (the folders
# above are the test's own, which that user may not enter).

OTHER_USER = 4242


def as_other_writer(directory, script):
    """Runs the shell `script` as user 4242 in group 4343 only, with `$D` naming the directory
    (`/dev/fd/N`, a descriptor the test opened); its exit status must be 0."""
    if os.geteuid() != 0:
        pytest.skip("only root can act as another user")
    descriptor = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        result = subprocess.run(
            ["sh", "-c", script], user=OTHER_USER, group=OTHER_GROUP, extra_groups=[], pass_fds=(descriptor,),
            env={"PATH": "/usr/bin:/bin", "D": f"/dev/fd/{descriptor}"}, capture_output=True, text=True, timeout=30)
    finally:
        os.close(descriptor)
    assert result.returncode == 0, result.stderr


def readyz_sink(broker):
    status, _, body = broker.request("GET", "/readyz", listener="admin")
    return status, json.loads(body)["sinks"][0]


def test_a_directory_another_user_makes_at_a_trusted_path_stops_neither_start_nor_reload(tmp_key, tmp_path):
    """Anyone who may write a trusted directory can make a directory at the token file's path.
    Were that refused, as in a directory only the broker's user or root can write, they could
    stop every start (a crash loop in a pod) and every reload: it is a warning instead. Each
    write fails, is logged, counted and tried again, and /readyz says why, until it is gone."""
    directory, _ = shared_directory(tmp_path, "2777 with a group")
    path = directory / "t.token"
    as_other_writer(directory, 'mkdir "$D/t.token"')
    provider = signer(tmp_key)
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"providers": [provider], "sinks": [trusted_sink(path)]}))
    planted = f"{path} is a directory, which no write can replace"

    def planted_warnings(text):
        return [line for line in text.splitlines()
                if "level=warn" in line and "token file path holds no file" in line and planted in line]

    result = run_broker("--check-config", "--config", str(config))
    assert result.returncode == 0, result.stdout + result.stderr
    assert len(planted_warnings(result.stderr)) == 1, result.stderr
    with Broker({"providers": [provider], "sinks": [trusted_sink(path)]}) as broker:
        assert len(planted_warnings(broker.stderr())) == 1, broker.stderr()
        assert wait_until(lambda: sink_writes(broker, success=False) >= 1, timeout=20)
        status, sink = readyz_sink(broker)
        assert status == 503 and not sink["ready"] and "Is a directory" in sink["last_error"], sink
        assert sink["problem"] == (
            f"the token file {path} is a directory (made by a writer of its directory), which no write can "
            "replace: each write fails, and is tried again, until it is removed"), sink
        # A reload that changes something else is taken, and warns again.
        from test_reload import post_reload, rewrite
        rewrite(broker, {"providers": [signer(tmp_key, tokenRefreshDelaySec=30)], "sinks": [trusted_sink(path)]})
        status, document = post_reload(broker)
        assert status == 200, document
        assert len(planted_warnings(broker.stderr())) == 2, broker.stderr()
        assert os.listdir(path) == [], "nothing written into it"
        # A write's temporary file lives until its rename fails: none stays.
        assert wait_until(lambda: sorted(os.listdir(directory)) == ["t.token"], timeout=10)
        as_other_writer(directory, 'rmdir "$D/t.token"')
        assert wait_until(lambda: read(path) == broker.get_json("/token")[0]["access_token"], timeout=30)
        assert wait_until(lambda: readyz_sink(broker)[0] == 200, timeout=10)

    # Where only the broker's user or root may write, only they could have made it: still refused.
    own = tmp_path / "own"
    own.mkdir(mode=0o700)
    (own / "t.token").mkdir()
    refused(write_sink_config(tmp_path, own / "t.token"), "is a directory; allowed: the path of a file")


def test_a_token_file_a_member_of_its_group_changes_in_place_is_reported_and_written_again(tmp_key, tmp_path):
    """With mode 0660 (in the emptyDir's fsGroup), every member of the group may rewrite the
    token file in place: the same inode, other contents. /readyz reports it at once, and the
    broker writes the token again at its next look, a new file renamed over the changed one."""
    directory, _ = shared_directory(tmp_path, "2777 with a group")
    path = directory / "t.token"
    # A token every 20 s; the sink looks again every 10 s.
    config = {"providers": [signer(tmp_key, tokenRefreshDelaySec=20)], "sinks": [trusted_sink(path, mode="0660")]}
    with Broker(config) as broker:
        token = broker.get_json("/token")[0]["access_token"]
        assert wait_until(lambda: read(path) == token, timeout=20)
        assert readyz_sink(broker)[0] == 200
        inode = os.stat(path).st_ino
        as_other_writer(directory, 'printf attacker > "$D/t.token"')
        assert read(path) == "attacker" and os.stat(path).st_ino == inode, "changed in place, by the group's right"
        status, sink = readyz_sink(broker)
        assert status == 503 and not sink["ready"], sink
        assert f"the token file {path} was changed in place since the broker wrote it" in sink["problem"], sink
        assert wait_until(lambda: read(path) == token, timeout=30), "written again at the next look"
        assert os.stat(path).st_ino != inode
        assert wait_until(lambda: readyz_sink(broker)[0] == 200, timeout=10)
        # The status is counted before the write is logged.
        assert wait_until(lambda: any("token file written again" in line and "level=warn" in line
                                      for line in broker.stderr().splitlines()), timeout=10), broker.stderr()
        assert token not in broker.stderr()


def test_two_brokers_keeping_one_token_file_agree_with_a_shared_store_and_disagree_without(tmp_key, tmp_path,
                                                                                          sink_dir):
    """A token file should have one writer. Two (an overlapping restart, a fleet on a shared path)
    that share a store write the same token: each finds the other's file holds what it wrote,
    made as it makes its own, takes it as the file, and stays ready without writing it again.
    Two whose tokens differ each find the other's file a replacement, and say so."""
    store = tmp_path / "store"
    store.mkdir(mode=0o700)
    key = tmp_path / "store.key"
    key.write_text(os.urandom(32).hex() + "\n")
    key.chmod(0o600)
    path = sink_dir / "t.token"
    # The sinks look again every 6 s; each broker signs its next token 12 s after the first, on its own.
    provider = signer(tmp_key, tokenRefreshDelaySec=12)
    shared = {"providers": [provider], "sinks": [{"provider": "default", "path": str(path)}],
              "store": {"type": "file", "path": str(store), "keyFile": str(key)}}
    saved = ("token_broker_store_operations_total", {"operation": "save", "result": "ok"})
    started = time.monotonic()
    with Broker(shared) as first:
        token = first.get_json("/token")[0]["access_token"]
        assert wait_until(lambda: read(path) == token and first.metric(saved[0], **saved[1]) == 1, timeout=20)
        # Served from the store: no fetch to wait for.
        with Broker(shared, fetching=[]) as second:
            assert wait_until(lambda: sink_writes(second) == 1, timeout=20)
            assert second.get_json("/token")[0]["access_token"] == token, "the stored token"
            # Until shortly before the next token (a look of each broker falls within, unless the
            # second took more than 4 s to start).
            samples = []
            while time.monotonic() < started + 10:
                samples += [readyz_sink(first), readyz_sink(second)]
                time.sleep(0.2)
            assert [sample for sample in samples if sample[0] != 200] == []
            assert read(path) == token
            assert sink_writes(first) == 1 and sink_writes(second) == 1, "neither wrote it again"
            for broker in (first, second):
                assert "token file written again" not in broker.stderr(), broker.stderr()

        # A broker of its own token (no store): the two disagree, and the first says so.
        with Broker({"providers": [provider], "sinks": [{"provider": "default", "path": str(path)}]}) as other:
            theirs = other.get_json("/token")[0]["access_token"]
            assert theirs != token
            assert wait_until(lambda: "was replaced since the broker wrote it" in (readyz_sink(first)[1].get("problem")
                                                                                  or ""), timeout=20)

