"""No read blocks the broker: FIFOs, devices and huge files are refused; every fetch has a deadline.

Also the provider's semantics around them: a version is a new token, and a refresh while the
issuer fails answers as /token/ready does.
"""
import hashlib
import json
import os
import subprocess
import threading

import pytest

from broker import BINARY, Broker, run_broker
from issuers.faulty import FaultyIssuer
from test_http_api import wait_until
from test_sources import make_ca, make_client_certificate, make_server_certificate


def sha256(text):
    return hashlib.sha256(text.encode()).hexdigest()


def keys_file(path, key, providers=("default",)):
    """Writes a caller-keys file atomically (a new inode), as an operator's deploy would."""
    temporary = f"{path}.tmp"
    with open(temporary, "w") as handle:
        json.dump({"keys": [{"name": "caller", "sha256": sha256(key), "providers": list(providers)}]}, handle)
    os.replace(temporary, path)


def replace_with_text(path, text):
    temporary = f"{path}.tmp"
    with open(temporary, "w") as handle:
        handle.write(text)
    os.replace(temporary, path)


def replace_with_fifo(path):
    temporary = f"{path}.fifo"
    os.mkfifo(temporary, 0o600)
    os.replace(temporary, path)


def bearer(key):
    return {"Authorization": f"Bearer {key}"}


def test_a_fifo_at_a_file_sources_path_is_an_error_and_a_regular_file_there_is_served(tmp_path):
    path = str(tmp_path / "token")
    replace_with_fifo(path)
    config = {"providers": [{"name": "k8s", "source": {"type": "file", "path": path}, "maxErrorTokenRefreshDelayMsec": 200}]}
    with Broker(config) as broker:
        assert wait_until(lambda: "is a FIFO, not a regular file" in broker.stderr(), timeout=15), broker.stderr()
        status, _, body = broker.request("GET", "/token")
        assert status == 503 and "unreachable" in json.loads(body)["error_description"]
        detail = json.loads(broker.request("GET", "/readyz", listener="admin")[2])["providers"][0]
        assert detail["last_error"] == "unreachable", detail
        replace_with_text(path, "opaque-token-value\n")
        body, _ = broker.get_json("/token/ready?timeout=15", timeout=20)
        assert body["access_token"] == "opaque-token-value"
        assert broker.request("GET", "/readyz", listener="admin")[0] == 200


def test_a_configuration_file_or_key_file_that_is_a_fifo_is_refused_at_once(tmp_path):
    fifo = str(tmp_path / "fifo")
    os.mkfifo(fifo, 0o600)
    result = run_broker("--check-config", "--config", fifo, timeout=20)
    assert result.returncode == 2 and f"cannot read configuration file {fifo}: is a FIFO, not a regular file" in result.stderr, result
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"providers": [{"source": {"type": "jwt", "keyFile": fifo}}]}))
    result = run_broker("--config", str(config), env={"TOKEN_BROKER_LISTEN": "127.0.0.1:0", "TOKEN_BROKER_ADMIN_LISTEN": "127.0.0.1:0"}, timeout=20)
    assert result.returncode == 2 and "is a FIFO, not a regular file" in result.stderr, result


def test_a_fifo_as_client_keys_file_is_reported_and_reloads_go_on_once_it_is_replaced(tmp_path):
    path = str(tmp_path / "callers.json")
    keys_file(path, "key-a")
    with Broker({"clientKeysFile": path}) as broker:
        assert broker.request("GET", "/token", headers=bearer("key-a"))[0] == 200
        replace_with_fifo(path)
        assert wait_until(lambda: "caller keys not reloaded" in broker.stderr(), timeout=15), broker.stderr()
        assert "is a FIFO, not a regular file" in broker.stderr()
        assert broker.request("GET", "/token", headers=bearer("key-a"))[0] == 200, "the previous list stays"
        keys_file(path, "key-b")
        assert wait_until(lambda: broker.request("GET", "/token", headers=bearer("key-b"))[0] == 200, timeout=15), broker.stderr()
        assert broker.request("GET", "/token", headers=bearer("key-a"))[0] == 401


def test_many_fifo_sources_stall_neither_an_unrelated_provider_nor_long_polls(tmp_path):
    fifos = []
    for index in range(8):
        path = str(tmp_path / f"token-{index}")
        replace_with_fifo(path)
        fifos.append({"name": f"stuck-{index}", "source": {"type": "file", "path": path}, "maxErrorTokenRefreshDelayMsec": 200})
    # The unrelated provider's tokens live 3 s: it must keep refreshing to serve at all.
    signer = {"name": "signer", "source": {"type": "jwt", "lifetimeSec": 3}, "pauseWhenIdle": False}
    with Broker({"providers": [signer, *fifos]}) as broker:
        assert wait_until(lambda: broker.fetches("signer") >= 4, timeout=30), "the signer keeps refreshing"
        status, _, body = broker.request("GET", "/providers/signer/token")
        assert status == 200, body
        version = json.loads(body)["version"]
        # A long-poll of 1 s answers (304 or a newer token) well within the client's bound.
        status, _, body = broker.request("GET", f"/providers/signer/token/ready?after={version}&timeout=1", timeout=8)
        assert status in (200, 304), status
        if status == 200:
            assert json.loads(body)["version"] > version, body
        status, _, _ = broker.request("GET", "/providers/stuck-0/token/ready?timeout=1", timeout=8)
        assert status == 503
        assert broker.request("GET", "/healthz", listener="admin")[0] == 200
        for index in range(8):
            assert f'msg="token fetch failed" provider=stuck-{index} error=unreachable' in broker.stderr()


def test_an_oversized_keys_file_is_refused_at_start_without_reading_it(tmp_path):
    oversized = tmp_path / "callers.json"
    with open(oversized, "wb") as handle:
        handle.truncate(70_000_000)  # sparse: 70 MB of size, no disk
    status, text, peak = _start_and_exit(tmp_path, oversized)
    assert status == 2, text
    assert "clientKeysFile" in text and "is larger than 4194304 bytes" in text and str(oversized) in text, text
    # The same start with a keys file that is simply missing: the peak without any reading.
    status, _, baseline = _start_and_exit(tmp_path, tmp_path / "missing.json")
    assert status == 2
    assert peak - baseline < 20 * 1024, f"peak RSS {peak} KiB against {baseline} KiB without the file"


def _start_and_exit(tmp_path, keys_path):
    """Starts the broker with `keys_path` as clientKeysFile, expecting it to exit: (status, stderr, peak RSS in KiB)."""
    config_path = tmp_path / "config.json"
    config_path.write_text(json.dumps({"clientKeysFile": str(keys_path)}))
    environment = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "TOKEN_BROKER_LISTEN": "127.0.0.1:0", "TOKEN_BROKER_ADMIN_LISTEN": "127.0.0.1:0"}
    process = subprocess.Popen([BINARY, "--config", str(config_path)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=environment)
    stderr = []
    reader = threading.Thread(target=lambda: stderr.append(process.stderr.read()), daemon=True)
    reader.start()
    try:
        assert wait_until(lambda: _exited(process), timeout=20), "the broker did not exit"
    finally:
        if process.returncode is None:
            process.kill()
            process.wait(timeout=5)
    reader.join(timeout=5)
    return process.returncode, stderr[0].decode() if stderr else "", process.peak_rss_kib


def _exited(process):
    """Reaps `process` with wait4 if it has exited, keeping its own peak RSS (KiB on Linux)."""
    pid, status, usage = os.wait4(process.pid, os.WNOHANG)
    if pid == 0:
        return False
    process.returncode = os.waitstatus_to_exitcode(status)
    process.peak_rss_kib = usage.ru_maxrss
    return True


def test_an_oversized_keys_file_at_a_reload_is_refused_without_growing_the_broker(tmp_path):
    path = str(tmp_path / "callers.json")
    keys_file(path, "key-a")
    with Broker({"clientKeysFile": path}) as broker:
        before = _peak_rss_kib(broker.process.pid)
        temporary = f"{path}.tmp"
        with open(temporary, "wb") as handle:
            handle.truncate(70_000_000)
        os.replace(temporary, path)
        assert wait_until(lambda: "caller keys not reloaded" in broker.stderr(), timeout=15), broker.stderr()
        assert "is larger than 4194304 bytes" in broker.stderr()
        assert broker.request("GET", "/token", headers=bearer("key-a"))[0] == 200, "the previous list stays"
        after = _peak_rss_kib(broker.process.pid)
        assert after - before < 20 * 1024, f"peak RSS grew from {before} to {after} KiB"


def _peak_rss_kib(pid):
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise AssertionError("no VmHWM")


def test_the_same_token_read_again_is_no_new_version_and_wakes_no_long_poll(tmp_path):
    path = str(tmp_path / "token")
    replace_with_text(path, "opaque-1\n")
    config = {"providers": [{"source": {"type": "file", "path": path, "lifetimeSec": 60}, "tokenRefreshDelaySec": 1, "pauseWhenIdle": False}]}
    with Broker(config) as broker:
        body, _ = broker.get_json("/token/ready?timeout=10")
        assert body["version"] == 1
        reads = broker.metric("token_broker_refreshes_total", provider="default", result="success")
        answers = []
        poll = threading.Thread(target=lambda: answers.append(broker.request("GET", "/token/ready?after=1&timeout=4", timeout=15)))
        poll.start()
        for _ in range(3):
            replace_with_text(path, "opaque-1\n")  # rewritten: a new file, the same token
            wait_until(lambda: False, timeout=0.5)
        poll.join(timeout=20)
        status, headers, _ = answers[0]
        assert status == 304 and headers["etag"] == '"1"', (status, headers)
        assert broker.metric("token_broker_refreshes_total", provider="default", result="success") >= reads + 2, "the file was read again meanwhile"
        assert broker.get_json("/token")[0]["version"] == 1
        # A forced refresh that reads the same token back ends with it, at once, still version 1.
        status, _, body = broker.request("POST", "/token/refresh?timeout=30", body=b'{"rejected_version": 1}', timeout=8)
        assert status == 200 and json.loads(body)["version"] == 1, body
        replace_with_text(path, "opaque-2\n")
        body, _ = broker.get_json("/token/ready?after=1&timeout=10", timeout=15)
        assert body["access_token"] == "opaque-2" and body["version"] == 2


def test_a_refresh_while_the_issuer_fails_answers_as_the_long_poll_does():
    issuer = FaultyIssuer()
    source = {"type": "oauth2", "tokenURL": issuer.url, "clientID": "c", "clientSecret": "s", "timeoutMsec": 1000}
    try:
        with Broker({"providers": [{"source": source, "maxErrorTokenRefreshDelayMsec": 200}]}) as broker:
            good, _ = broker.get_json("/token/ready?timeout=10")
            assert good["access_token"] == "good-1" and good["version"] == 1
            issuer.mode = "status_500"
            # With the version refused: 304, as /token/ready?after=1.
            refresh = broker.request("POST", "/token/refresh?timeout=2", body=b'{"rejected_version": 1}')
            ready = broker.request("GET", "/token/ready?after=1&timeout=2")
            assert (refresh[0], refresh[1].get("etag")) == (ready[0], ready[1].get("etag")) == (304, '"1"'), (refresh, ready)
            # Without a version: the cached token, flagged stale, as /token/ready without after.
            status, _, body = broker.request("POST", "/token/refresh?timeout=2")
            assert status == 200, body
            served = json.loads(body)
            assert served["access_token"] == "good-1" and served["stale"] is True and served["version"] == 1
            ready, _ = broker.get_json("/token/ready?timeout=2")
            assert (ready["access_token"], ready["stale"], ready["version"]) == ("good-1", True, 1)
            issuer.mode = "ok"
            status, _, body = broker.request("POST", "/token/refresh?timeout=10", body=b'{"rejected_version": 1}', timeout=15)
            assert status == 200 and json.loads(body)["access_token"] != "good-1", body
    finally:
        issuer.close()


def test_a_proxy_whose_token_is_refused_and_read_back_unchanged_answers_without_waiting(tmp_path):
    """The proxy's retrier forces a refresh; a file read back unchanged is no new version, and the
    refresh still ends with it, so the refused answer comes back at once, not after maxWaitSec."""
    from test_proxy import ResourceServer

    resource = ResourceServer()
    try:
        path = str(tmp_path / "token")
        replace_with_text(path, "opaque-never-accepted\n")
        config = {"maxWaitSec": 60, "proxies": [{"name": "api", "target": resource.base + "/api"}],
                  "providers": [{"source": {"type": "file", "path": path}, "forcedRefreshMaxAttempts": 20}]}
        with Broker(config) as broker:
            resource.admin("/admin/reset", {})
            resource.admin("/admin/config", {"jwks": broker.url("/.well-known/jwks.json"), "cookie": None, "header": None})
            assert broker.get_json("/token/ready?timeout=10")[0]["version"] == 1
            status, _, body = broker.request("GET", "/proxy/api/echo/x", timeout=15)
            assert status == 401, body
            assert broker.get_json("/token")[0]["version"] == 1
            assert broker.fetches() >= 2, "the refusal forced a re-read"
    finally:
        resource.close()


def test_the_same_token_read_again_is_served_with_its_new_expiry(tmp_path):
    """The answer rendered for a version is not served again once the same token's expiry moved."""
    import calendar
    import time

    path = str(tmp_path / "token")
    replace_with_text(path, "opaque-1\n")
    config = {"providers": [{"source": {"type": "file", "path": path, "lifetimeSec": 6}, "pauseWhenIdle": False}]}
    with Broker(config) as broker:
        broker.get_json("/token/ready?timeout=10")
        broker.get_json("/token")  # renders (and keeps) the answer for the first expiry
        reads = broker.metric("token_broker_refreshes_total", provider="default", result="success")
        assert wait_until(lambda: broker.metric("token_broker_refreshes_total", provider="default", result="success") > reads,
                          timeout=15), "the file was read again"
        checked = 0
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            status, _, raw = broker.request("GET", "/token")
            now = time.time()
            if status == 200:
                body = json.loads(raw)
                assert body["version"] == 1
                expires_at = calendar.timegm(time.strptime(body["expires_at"], "%Y-%m-%dT%H:%M:%SZ"))
                # Both fields describe one expiry: expires_at is rounded down, expires_in up.
                assert abs((expires_at - now) - body["expires_in"]) < 2, (body, now)
                checked += 1
            time.sleep(0.1)
        assert checked >= 10


def test_a_fetch_abandoned_at_its_deadline_closes_its_upstream_connection():
    """An issuer that accepts and never answers holds at most the fetch in flight, not every abandoned one."""
    import select
    import socket
    import time

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    accepted = []

    def accept_all():
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            connection.setblocking(False)
            accepted.append(connection)

    threading.Thread(target=accept_all, daemon=True).start()

    def still_open():
        count = 0
        for connection in list(accepted):
            try:
                while connection.recv(65536):
                    pass
            except BlockingIOError:
                count += 1  # nothing more to read and not closed
            except OSError:
                pass
        return count

    url = f"http://127.0.0.1:{listener.getsockname()[1]}/token"
    config = {"providers": [{"source": {"type": "http", "url": url, "timeoutMsec": 60000}, "fetchTimeoutSec": 1,
                             "maxRetryCount": 10, "maxErrorTokenRefreshDelayMsec": 200, "pauseWhenIdle": False}]}
    try:
        with Broker(config) as broker:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and len(accepted) < 5:
                time.sleep(0.1)
            assert len(accepted) >= 5, "the provider went on trying"
            time.sleep(0.5)
            assert still_open() <= 2, f"{still_open()} of {len(accepted)} abandoned fetches still hold a connection"
            assert broker.process.poll() is None
    finally:
        listener.close()
        for connection in accepted:
            connection.close()


@pytest.mark.parametrize("replaced", ["caFile", "clientCertFile", "clientKeyFile"])
def test_a_tls_file_replaced_by_a_fifo_fails_its_own_exchanges_at_once_and_holds_up_nothing(tmp_path, replaced):
    # libcurl used to open these files itself at each new connection, on the upstream client's
    # thread: a FIFO put there after start held that thread in open(), and with it every issuer's
    # fetch and the broker's exit. The broker now reads them itself, never waiting on a FIFO.
    ca, ca_key = make_ca(tmp_path, "ca")
    certificate, key = make_server_certificate(tmp_path, ca, ca_key)
    client, client_key = make_client_certificate(tmp_path, ca, ca_key)
    tls = {"caFile": str(ca), "clientCertFile": str(client), "clientKeyFile": str(client_key)}
    issuer = FaultyIssuer(tls=(str(certificate), str(key)), client_ca=str(ca))
    other = FaultyIssuer()
    config = {
        "providers": [
            {"name": "tls", "source": {"type": "oauth2", "tokenURL": issuer.url, "clientID": "c", "clientSecret": "s", **tls},
             "maxErrorTokenRefreshDelayMsec": 200},
            {"name": "other", "source": {"type": "oauth2", "tokenURL": other.url, "clientID": "c", "clientSecret": "s"}},
        ],
        "proxies": [{"name": "tls", "target": issuer.url.rsplit("/", 1)[0] + "/", "provider": "other", **tls}],
    }
    try:
        broker = Broker(config)
        with broker:
            def readiness():
                providers = json.loads(broker.request("GET", "/readyz", listener="admin")[2])["providers"]
                return next(provider for provider in providers if provider["name"] == "tls")
            assert broker.get_json("/providers/tls/token/ready?timeout=10")[0]["access_token"] == "good-1"
            assert broker.request("POST", "/proxy/tls/token", body=b"{}")[0] == 200
            replace_with_fifo(tls[replaced])
            problem = f"{replaced}: cannot read {tls[replaced]}: is a FIFO, not a regular file"
            broker.request("POST", "/providers/tls/token/refresh?timeout=2", body=b'{"rejected_version": 1}', timeout=8)
            assert wait_until(lambda: readiness().get("last_error") == "configuration"), readiness()
            assert readiness()["last_error_description"] == f"configuration: {problem}"
            # Another issuer's fetch goes on (both are fetched on the same thread).
            version = broker.get_json("/providers/other/token")[0]["version"]
            status, _, body = broker.request("POST", "/providers/other/token/refresh?timeout=8",
                                             body=json.dumps({"rejected_version": version}).encode(), timeout=15)
            assert status == 200 and json.loads(body)["version"] > version, (status, body)
            # A proxied request gets its answer, the broker's own.
            status, _, body = broker.request("POST", "/proxy/tls/token", body=b"{}", timeout=15)
            assert status == 502 and problem in json.loads(body)["error_description"], (status, body)
            assert broker.stop(timeout=15) == 0
    finally:
        issuer.close()
        other.close()


def test_tls_files_are_checked_when_the_configuration_is_loaded(tmp_path):
    # Checked when loaded; read again by the broker (never by libcurl, which would wait on a
    # FIFO) when they change, and a bad one then fails its own exchanges alone.
    def openssl(*arguments):
        subprocess.run(["openssl", *arguments], check=True, capture_output=True)

    ca, ca_key, client, client_key = (str(tmp_path / name) for name in ("ca.pem", "ca.key", "client.pem", "client.key"))
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "1",
            "-subj", "/CN=test CA", "-keyout", ca_key, "-out", ca)
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "1",
            "-subj", "/CN=client", "-keyout", client_key, "-out", client)
    encrypted = str(tmp_path / "encrypted.key")
    openssl("pkey", "-in", client_key, "-aes256", "-passout", "pass:secret", "-out", encrypted)
    fifo = str(tmp_path / "fifo")
    os.mkfifo(fifo, 0o600)
    (tmp_path / "not-pem.txt").write_text("not a certificate\n")
    (tmp_path / "broken.pem").write_text("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")

    def check(tls, proxy=False):
        source = {"type": "oauth2", "tokenURL": "https://127.0.0.1:1/token", "clientID": "c", "clientSecret": "s"}
        config = {"providers": [{"source": source}]}
        if proxy:
            config["proxies"] = [{"name": "p", "target": "https://127.0.0.1:1/", **tls}]
        else:
            source.update(tls)
        path = tmp_path / "config.json"
        path.write_text(json.dumps(config))
        return run_broker("--check-config", "--config", str(path), timeout=20)

    # Files libcurl takes must pass too: a bundle of OpenSSL's "TRUSTED CERTIFICATE" blocks (as
    # RHEL's ca-bundle.trust.crt), with text around them, and a certificate followed by its CA.
    trusted = str(tmp_path / "trusted.pem")
    openssl("x509", "-in", ca, "-addtrust", "serverAuth", "-out", trusted)
    with open(trusted) as handle:
        (tmp_path / "bundle.pem").write_text("# a comment\n" + handle.read() + "\n" + open(client).read())
    chain = tmp_path / "chain.pem"
    chain.write_text(open(client).read() + open(ca).read())
    mtls = {"clientCertFile": client, "clientKeyFile": client_key}
    for proxy in (False, True):
        where = "proxies[0]" if proxy else "providers[0].source"
        assert check({"caFile": ca, **mtls}, proxy).returncode == 0
        for good in ({"caFile": trusted}, {"caFile": str(tmp_path / "bundle.pem")},
                     {"caFile": ca, "clientCertFile": str(chain), "clientKeyFile": client_key}):
            result = check(good, proxy)
            assert result.returncode == 0, (good, result.stderr)
        for tls, reason in [
            ({"caFile": str(tmp_path / "missing.pem")}, "No such file or directory"),
            ({"caFile": fifo}, "is a FIFO, not a regular file"),
            ({"caFile": str(tmp_path)}, "is a directory, not a regular file"),
            ({"caFile": str(tmp_path / "not-pem.txt")}, "holds no PEM certificate"),
            ({"caFile": str(tmp_path / "broken.pem")}, "a certificate in it does not parse"),
            ({"caFile": client_key}, "holds no PEM certificate"),
            ({**mtls, "clientCertFile": fifo}, "is a FIFO, not a regular file"),
            ({**mtls, "clientKeyFile": fifo}, "is a FIFO, not a regular file"),
            ({**mtls, "clientKeyFile": encrypted}, "the key is protected by a pass phrase"),
            ({**mtls, "clientKeyFile": ca_key}, "the key does not match the certificate"),
            ({**mtls, "clientKeyFile": client}, "not a PEM private key"),
        ]:
            result = check(tls, proxy)
            assert result.returncode == 2 and f"{where}: " in result.stderr and reason in result.stderr, (tls, result)
            assert "pass phrase:" not in result.stderr.lower()
