"""`token-broker token` and `token-broker status`: the command line for scripts, against real brokers.

`token` prints the bare access token (exit 0), or one line on stderr and an exit status that says
why: 3 the broker is unreachable, 4 it has no valid token (503), 5 it refused (4xx), 2 a bad
command line or key file, 1 an answer that is not the broker's. `status` prints the providers of
/readyz as a table. Both find the broker as `healthcheck` does: the configuration's listener, with
TOKEN_BROKER_LISTEN / TOKEN_BROKER_ADMIN_LISTEN over it, or `--address`. No failure line ever
holds a token or a caller key.
"""
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
from contextlib import contextmanager

import jwt
import pytest

from broker import BINARY, Broker, base_environment, run_broker
from test_hardening import unix_get
from test_http_api import wait_until

UNREACHABLE, NO_TOKEN, REFUSED, USAGE, UNEXPECTED = 3, 4, 5, 2, 1
AUDIENCES = ["https://api.example/*", "https://exact.example"]
SCOPES = ["read", "write"]


def cli(*args, env=None):
    """Runs the binary with only PATH (and the sanitizers' settings) and `env` in its environment."""
    return run_broker(*args, env=env, timeout=30)


def address(broker, listener="token"):
    return f"http://{broker.addresses[listener]}"


def served_token(broker, path="/token", headers=None):
    body, _ = broker.get_json(path, headers=headers)
    return body["access_token"]


def assert_token(result, token):
    assert result.returncode == 0, result.stderr
    assert result.stdout == token + "\n", "the bare token and a newline, nothing else"
    assert result.stderr == ""


def assert_failure(result, status, command="token", secrets=(), mentions=()):
    """Exit `status`, nothing on stdout, exactly one line on stderr naming the command, no secret in it."""
    assert result.returncode == status, (result.returncode, result.stderr)
    assert result.stdout == ""
    assert result.stderr.endswith("\n") and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"token-broker {command}: "), result.stderr
    for secret in secrets:
        assert secret not in result.stderr
        for part in secret.split("."):
            assert part not in result.stderr
    for text in mentions:
        assert text in result.stderr, (text, result.stderr)


def closed_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def down_provider(name="down"):
    """An `http` source whose issuer is a closed port: it never holds a token."""
    return {"name": name, "maxErrorTokenRefreshDelayMsec": 500,
            "source": {"type": "http", "url": f"http://127.0.0.1:{closed_port()}/token", "connectTimeoutMsec": 200}}


def signer_template(tmp_key, name="signer"):
    return {"name": name, "perRequest": ["audience", "scope"], "allowedAudiences": AUDIENCES,
            "allowedScopes": SCOPES, "source": {"type": "jwt", "keyFile": tmp_key("ec"), "lifetimeSec": 300}}


def verifier(broker):
    """verify(token, audience) -> claims, checked with PyJWT against the broker's JWKS."""
    jwks, _ = broker.get_json("/.well-known/jwks.json")
    keys = {key["kid"]: jwt.PyJWK(key) for key in jwks["keys"]}

    def verify(token, audience):
        key = keys[jwt.get_unverified_header(token)["kid"]]
        return jwt.decode(token, key.key, algorithms=["ES256"], audience=audience, issuer="token-broker",
                          options={"require": ["exp", "iat", "aud", "iss"]})

    return verify


def parse_tables(text):
    """The status output as a list of tables, each a list of {header: cell} rows, cut at the headers' columns."""
    tables = []
    for block in text.rstrip("\n").split("\n\n"):
        lines = block.split("\n")
        header = lines[0]
        starts = [match.start() for match in re.finditer(r"\S+(?: \S+)*", header)]
        names = [header[start:end].strip() for start, end in zip(starts, starts[1:] + [None])]
        rows = []
        for line in lines[1:]:
            assert not line.endswith(" "), repr(line)
            rows.append({name: line[start:end].strip() for name, start, end in zip(names, starts, starts[1:] + [None])})
        tables.append((names, rows))
    return tables


def readyz(broker):
    _, _, body = broker.request("GET", "/readyz", listener="admin")
    return json.loads(body)


def write_json(directory, name, value):
    path = os.path.join(directory, name)
    with open(path, "w") as handle:
        json.dump(value, handle)
    return path


@pytest.fixture
def short_dir():
    """A directory with a short path, for Unix sockets (at most 107 bytes)."""
    path = tempfile.mkdtemp(prefix="tb-cli-", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


# token: the bare token

def test_token_prints_exactly_what_the_token_route_serves(broker):
    token = served_token(broker)
    assert_token(cli("token", "--address", address(broker)), token)
    assert_token(cli("token", f"--address={address(broker)}/"), token)
    assert_token(cli("token", "--provider", "default", "--address", address(broker)),
                 served_token(broker, "/providers/default/token"))


def test_token_and_status_find_the_broker_through_the_environment_alone(broker, tmp_path):
    token = served_token(broker)
    # The listeners from the environment alone (no configuration file, no address).
    assert_token(cli("token", env={"TOKEN_BROKER_LISTEN": broker.addresses["token"]}), token)
    result = cli("status", env={"TOKEN_BROKER_ADMIN_LISTEN": broker.addresses["admin"]})
    assert result.returncode == 0, result.stderr
    assert [row["NAME"] for row in parse_tables(result.stdout)[0][1]] == ["default"]
    # The listeners from the file TOKEN_BROKER_CONFIG names.
    config = write_json(str(tmp_path), "cli.json", {"listen": broker.addresses["token"],
                                                    "adminListen": broker.addresses["admin"]})
    assert_token(cli("token", env={"TOKEN_BROKER_CONFIG": config}), token)
    assert_token(cli("token", "--config", config), token)
    result = cli("status", env={"TOKEN_BROKER_CONFIG": config})
    assert result.returncode == 0 and "default" in result.stdout, result.stderr
    # The environment's listeners win over the file's, as they do for the broker.
    stale = write_json(str(tmp_path), "stale.json", {"listen": f"127.0.0.1:{closed_port()}",
                                                     "adminListen": f"127.0.0.1:{closed_port()}"})
    assert_failure(cli("token", env={"TOKEN_BROKER_CONFIG": stale}), UNREACHABLE, mentions=("unreachable",))
    assert_failure(cli("status", env={"TOKEN_BROKER_CONFIG": stale}), UNREACHABLE, command="status")
    assert_token(cli("token", env={"TOKEN_BROKER_CONFIG": stale, "TOKEN_BROKER_LISTEN": broker.addresses["token"]}),
                 token)
    result = cli("status", env={"TOKEN_BROKER_CONFIG": stale, "TOKEN_BROKER_ADMIN_LISTEN": broker.addresses["admin"]})
    assert result.returncode == 0, result.stderr


def test_token_and_status_over_unix_sockets(short_dir):
    token_socket, admin_socket = os.path.join(short_dir, "t.sock"), os.path.join(short_dir, "a.sock")
    with Broker(listen=f"unix:{token_socket}", admin=f"unix:{admin_socket}"):
        status, body = unix_get(token_socket, "/token", {"Token-Broker-Request": "true"})
        assert status == 200
        token = json.loads(body)["access_token"]
        assert_token(cli("token", env={"TOKEN_BROKER_LISTEN": f"unix:{token_socket}"}), token)
        assert_token(cli("token", "--address", f"unix:{token_socket}"), token)
        result = cli("status", env={"TOKEN_BROKER_ADMIN_LISTEN": f"unix:{admin_socket}"})
        assert result.returncode == 0, result.stderr
        (_, rows), = parse_tables(result.stdout)
        assert rows[0]["NAME"] == "default" and rows[0]["VERSION"] == "1"


def test_a_template_childs_token_carries_the_audience_and_scope_asked_for(tmp_key):
    with Broker({"providers": [signer_template(tmp_key)]}) as broker:
        verify = verifier(broker)
        result = cli("token", "--address", address(broker), "--provider", "signer",
                     "--audience", "https://api.example/orders", "--scope", "write read")
        assert result.returncode == 0, result.stderr
        token = result.stdout.rstrip("\n")
        claims = verify(token, "https://api.example/orders")
        assert sorted(claims["scope"].split()) == ["read", "write"]
        with pytest.raises(jwt.InvalidAudienceError):
            verify(token, "https://api.example/storage")
        # The same child over HTTP: the same token.
        assert served_token(broker, "/providers/signer/token?audience=https%3A%2F%2Fapi.example%2Forders"
                                    "&scope=read%20write") == token
        # The first provider is the template: /token takes the values too.
        result = cli("token", "--address", address(broker), "--audience=https://exact.example")
        assert result.returncode == 0, result.stderr
        claims = verify(result.stdout.strip(), "https://exact.example")
        assert "scope" not in claims


def test_values_are_percent_encoded_whole_so_none_can_add_a_parameter(tmp_key):
    with Broker({"providers": [signer_template(tmp_key)]}) as broker:
        audience = "https://api.example/x?y=1&scope=write#z"
        result = cli("token", "--address", address(broker), "--provider", "signer", "--audience", audience)
        assert result.returncode == 0, result.stderr
        claims = verifier(broker)(result.stdout.strip(), audience)
        assert claims["aud"] == audience and "scope" not in claims


def test_a_value_outside_the_allow_list_is_refused(tmp_key):
    with Broker({"providers": [signer_template(tmp_key)]}) as broker:
        result = cli("token", "--address", address(broker), "--provider", "signer", "--audience", "https://evil.example")
        assert_failure(result, REFUSED, mentions=("value_not_allowed", "audience"))
        result = cli("token", "--address", address(broker), "--provider", "signer", "--scope", "admin")
        assert_failure(result, REFUSED, mentions=("value_not_allowed", "scope"))


# token: the failures, each with its status

def test_a_stopped_broker_is_unreachable(tmp_path):
    broker = Broker()
    token = served_token(broker)
    token_address, admin_address = broker.addresses["token"], broker.addresses["admin"]
    assert broker.stop() == 0
    assert_failure(cli("token", "--address", f"http://{token_address}"), UNREACHABLE, secrets=(token,),
                   mentions=("unreachable", token_address))
    assert_failure(cli("token", env={"TOKEN_BROKER_LISTEN": token_address}), UNREACHABLE, secrets=(token,))
    assert_failure(cli("status", "--address", f"http://{admin_address}"), UNREACHABLE, command="status",
                   mentions=(admin_address,))
    assert_failure(cli("status", env={"TOKEN_BROKER_ADMIN_LISTEN": admin_address}), UNREACHABLE, command="status")
    assert_failure(cli("token", "--address", f"unix:{tmp_path}/nothing.sock"), UNREACHABLE)


def test_a_broker_that_never_answers_is_unreachable_after_the_timeout():
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # connections complete in the backlog, and nothing ever answers
        port = silent.getsockname()[1]
        result = cli("token", "--address", f"http://127.0.0.1:{port}", "--timeout", "1")
        assert_failure(result, UNREACHABLE, mentions=("in time",))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_waiting_command_ends_at_once_on_a_signal(sig):
    # The broker blocks these signals for its sigwait; the commands take them as any program does.
    held = []
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        silent.setblocking(False)
        command = [BINARY, "token", "--address", f"http://127.0.0.1:{silent.getsockname()[1]}", "--timeout", "60"]
        # A disposition of SIG_IGN is inherited across exec (a runner started under nohup ignores
        # SIGHUP, a background shell SIGINT), and a command rightly keeps it: start this one with
        # the defaults, as from a terminal.
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=base_environment(),
                                   preexec_fn=default_signal_dispositions)
        try:
            # The command is asking once its connection arrives; it is held open, never answered.
            assert wait_until(lambda: accept_into(silent, held), timeout=10)
            process.send_signal(sig)
            assert process.wait(timeout=10) == -sig
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
            process.stdout.close()
            process.stderr.close()
            for connection in held:
                connection.close()


def default_signal_dispositions():
    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(number, signal.SIG_DFL)


def accept_into(listener, held):
    """Accepts a waiting connection into `held`, if there is one; whether there was."""
    try:
        held.append(listener.accept()[0])
    except BlockingIOError:
        return False
    return True


def test_a_provider_without_a_valid_token_gives_the_no_token_status():
    with Broker({"providers": [{"name": "default"}, down_provider()]}) as broker:
        assert wait_until(lambda: readyz(broker)["providers"][1].get("last_error") == "unreachable")
        result = cli("token", "--address", address(broker), "--provider", "down")
        assert_failure(result, NO_TOKEN, secrets=(served_token(broker),), mentions=("token_unavailable",))


def test_an_unknown_provider_is_refused(broker):
    token = served_token(broker)
    assert_failure(cli("token", "--address", address(broker), "--provider", "nope"), REFUSED, secrets=(token,),
                   mentions=("unknown_provider",))
    # A name that would leave its path segment stays in it.
    assert_failure(cli("token", "--address", address(broker), "--provider", "../token"), REFUSED, secrets=(token,))
    # A value the provider does not take.
    assert_failure(cli("token", "--address", address(broker), "--audience", "a"), REFUSED, secrets=(token,),
                   mentions=("invalid_request",))


def test_caller_keys_no_key_is_refused_the_right_key_gets_the_token(tmp_path):
    key, other = "k-" + os.urandom(16).hex(), "k-" + os.urandom(16).hex()
    keys = write_json(str(tmp_path), "callers.json", {"keys": [
        {"name": "all", "sha256": hashlib.sha256(key.encode()).hexdigest(), "providers": ["*"]},
        {"name": "narrow", "sha256": hashlib.sha256(other.encode()).hexdigest(), "providers": ["second"]}]})
    key_file, other_file, wrong_file = tmp_path / "key", tmp_path / "other", tmp_path / "wrong"
    key_file.write_text(key + "\n")
    other_file.write_text(other)
    wrong = "k-" + os.urandom(16).hex()
    wrong_file.write_text(wrong + "\n")
    with Broker({"clientKeysFile": keys, "providers": [{"name": "default"}, {"name": "second"}]}) as broker:
        token = served_token(broker, headers={"Authorization": f"Bearer {key}"})
        secrets = (token, key, other, wrong)
        url = address(broker)
        assert_failure(cli("token", "--address", url), REFUSED, secrets=secrets,
                       mentions=("missing_caller_key", "--key-file"))
        assert_failure(cli("token", "--address", url, "--key-file", str(wrong_file)), REFUSED, secrets=secrets,
                       mentions=("invalid_caller_key",))
        assert_failure(cli("token", "--address", url, "--key-file", str(other_file)), REFUSED, secrets=secrets,
                       mentions=("provider_not_allowed",))
        assert_token(cli("token", "--address", url, "--key-file", str(key_file)), token)
        assert_token(cli("token", "--address", url, env={"TOKEN_BROKER_CALLER_KEY_FILE": str(key_file)}), token)
        # --key-file wins over the environment.
        assert_token(cli("token", "--address", url, "--key-file", str(key_file),
                         env={"TOKEN_BROKER_CALLER_KEY_FILE": str(wrong_file)}), token)
        second = served_token(broker, "/providers/second/token", headers={"Authorization": f"Bearer {other}"})
        assert_token(cli("token", "--address", url, "--provider", "second", "--key-file", str(other_file)), second)
        # A key file that cannot be read, or is not one key, is a usage error, without a request.
        assert_failure(cli("token", "--address", url, "--key-file", str(tmp_path / "missing")), USAGE,
                       mentions=("missing",))
        spaced = tmp_path / "spaced"
        spaced.write_text(f"{key} {key}\n")
        assert_failure(cli("token", "--address", url, "--key-file", str(spaced)), USAGE, secrets=secrets)


def test_an_http_proxy_in_the_environment_is_not_used(broker):
    # The request carries the caller key and its answer a token: it goes to the broker directly.
    proxy = f"http://127.0.0.1:{closed_port()}"
    result = cli("token", "--address", address(broker), env={"http_proxy": proxy, "HTTP_PROXY": proxy,
                                                             "all_proxy": proxy, "ALL_PROXY": proxy})
    assert_token(result, served_token(broker))


def test_bad_command_lines_exit_2_without_asking(broker):
    for args in (("token", "--bogus"), ("token", "--provider"), ("token", "--provider="), ("token", "--timeout", "0"),
                 ("token", "--timeout", "x"), ("token", "--audience", "a", "--audience", "b"),
                 ("token", "--address", "ftp://127.0.0.1:1"), ("token", "--address", f"{address(broker)}/token"),
                 ("status", "--provider", "x"), ("status", "extra")):
        assert_failure(cli(*args), USAGE, command=args[0])
    # The configured listener has port 0: only the broker knows it.
    assert_failure(cli("token", env={"TOKEN_BROKER_LISTEN": "127.0.0.1:0"}), USAGE, mentions=("--address",))
    result = cli("token", "--help")
    assert result.returncode == 0 and "--key-file" in result.stdout and "TOKEN_BROKER_CALLER_KEY_FILE" in result.stdout
    result = cli("--help")
    assert result.returncode == 0 and "token-broker token" in result.stdout and "token-broker status" in result.stdout


# status: the table

def test_status_prints_the_providers_and_versions_the_admin_api_reports(tmp_key):
    providers = [{"name": "default"}, {"name": "second", "source": {"type": "jwt", "lifetimeSec": 7200}},
                 down_provider(), signer_template(tmp_key)]
    with Broker({"providers": providers}) as broker:
        # Two tokens for "second": version 2.
        status, _, _ = broker.request("POST", "/providers/second/token/refresh", body=b'{"rejected_version": 1}')
        assert status == 200
        assert wait_until(lambda: readyz(broker)["providers"][2].get("last_error") == "unreachable")
        tokens = [served_token(broker), served_token(broker, "/providers/second/token")]
        result = cli("status", "--address", address(broker, "admin"))
        assert result.returncode == 0, result.stderr
        assert result.stderr == ""
        for token in tokens:
            for part in token.split("."):
                assert part not in result.stdout
        report = readyz(broker)
        (names, rows), (template_names, template_rows) = parse_tables(result.stdout)
        assert names == ["NAME", "STATE", "VERSION", "EXPIRES IN", "STALE", "LAST ERROR"]
        assert [row["NAME"] for row in rows] == [entry["name"] for entry in report["providers"]] \
            == ["default", "second", "down"]
        for row, entry in zip(rows, report["providers"]):
            assert row["STATE"] == entry["state"]
            assert row["VERSION"] == (str(entry["version"]) if "version" in entry else "-")
            assert row["STALE"] == ("yes" if entry["stale"] else "no")
        default, second, down = rows
        assert second["VERSION"] == "2" and default["VERSION"] == "1"
        assert re.fullmatch(r"1[45]m\d{1,2}s", default["EXPIRES IN"]), default
        assert re.fullmatch(r"(1h59m|2h0m)\d{1,2}s", second["EXPIRES IN"]), second
        assert default["LAST ERROR"] == "-" and second["LAST ERROR"] == "-"
        assert down["VERSION"] == "-" and down["EXPIRES IN"] == "-" and down["LAST ERROR"].startswith("unreachable")
        assert template_names == ["TEMPLATE", "CHILDREN", "READY", "MAX"]
        assert template_rows == [{"TEMPLATE": "signer", "CHILDREN": "0", "READY": "0", "MAX": "100"}]


def test_status_against_the_token_listener_is_not_an_answer(broker):
    assert_failure(cli("status", "--address", address(broker)), UNEXPECTED, command="status",
                   mentions=("admin listener",))


# Answers that are not the broker's: exit 1, whatever their status; no answer at all: exit 3

@contextmanager
def hostile_server(raw):
    """A listener on 127.0.0.1 that reads each request's head and sends `raw` back as is, then
    closes: at most 8 connections, each given 10 s. Yields its http:// address."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.2)
    done = threading.Event()

    def serve():
        served, polls = 0, 0
        while served < 8 and polls < 300 and not done.is_set():  # at most about a minute
            try:
                connection, _ = listener.accept()
            except socket.timeout:
                polls += 1
                continue
            except OSError:
                return
            served += 1
            with connection:
                connection.settimeout(10)
                head = b""
                try:
                    while b"\r\n\r\n" not in head and len(head) < 65536:
                        chunk = connection.recv(4096)
                        if not chunk:
                            break
                        head += chunk
                    connection.sendall(raw)
                except OSError:
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        done.set()
        thread.join(timeout=15)
        listener.close()


def http_answer(status, content_type, body, reason="X"):
    head = f"HTTP/1.1 {status} {reason}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n"
    if content_type:
        head += f"Content-Type: {content_type}\r\n"
    return head.encode() + b"\r\n" + body


NOT_THE_BROKERS = {
    "html 404": http_answer(404, "text/html", b"<html><body>Not Found</body></html>"),
    "text 503": http_answer(503, "text/plain", b"Service Unavailable"),
    "html 200 holding a token": http_answer(200, "text/html", b'{"access_token":"s7olen-lo0king-t0k3n"}'),
    "json 401 not the broker's shape": http_answer(401, "application/json", b'{"message":"go away"}'),
    "garbage status line": b"HELLO THERE\r\n\r\n",
    "HTTP/0.9": b"just some text",
    "body cut short": b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"access",
    "oversized headers": b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 300_000 + b"\r\nContent-Length: 0\r\n\r\n",
}


@pytest.mark.parametrize("case", sorted(NOT_THE_BROKERS))
def test_an_answer_that_is_not_the_brokers_exits_1_for_every_command(case):
    for command in ("token", "status", "reload"):
        with hostile_server(NOT_THE_BROKERS[case]) as url:
            result = cli(command, "--address", url, *(["--timeout", "10"] if command == "token" else []))
        assert_failure(result, UNEXPECTED, command=command, secrets=("s7olen-lo0king-t0k3n",))
        assert any(text in result.stderr for text in ("not the broker's", "no /readyz answer", "no reload answer")), \
            result.stderr
        assert "unreachable" not in result.stderr


def test_a_server_that_closes_without_a_word_is_unreachable():
    with hostile_server(b"") as url:
        assert_failure(cli("token", "--address", url), UNREACHABLE, mentions=("unreachable",))


def test_the_brokers_own_refusal_of_a_request_too_large_stays_a_refusal(broker):
    # libmicrohttpd answers a URI past its buffer with a 414 of its own, not JSON.
    result = cli("token", "--address", address(broker), "--audience", "a" * 6000)
    assert_failure(result, REFUSED, mentions=("414",))


def test_an_address_with_a_user_info_part_is_refused_and_nothing_is_asked(tmp_path):
    # http://A@B would connect to B and hand it the request, caller key and all.
    key_file = tmp_path / "key"
    key_file.write_text("k-" + os.urandom(16).hex() + "\n")
    with socket.socket() as trap:
        trap.bind(("127.0.0.1", 0))
        trap.listen(8)
        trap.setblocking(False)
        port = trap.getsockname()[1]
        for given in (f"http://127.0.0.1:{closed_port()}@127.0.0.1:{port}", f"http://user@127.0.0.1:{port}",
                      f"http://127.0.0.1:{port}?x", f"http://127.0.0.1:{port}#x"):
            assert_failure(cli("token", "--address", given, "--key-file", str(key_file)), USAGE, mentions=("--address",))
            assert_failure(cli("status", "--address", given), USAGE, command="status", mentions=("--address",))
            assert_failure(cli("reload", "--address", given), USAGE, command="reload", mentions=("--address",))
        with pytest.raises(BlockingIOError):
            trap.accept()


def test_reload_takes_a_timeout_and_ends_when_it_passes():
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # the connection completes in the backlog, and nothing ever answers
        result = cli("reload", "--address", f"http://127.0.0.1:{silent.getsockname()[1]}", "--timeout", "1")
        assert_failure(result, UNREACHABLE, command="reload", mentions=("in time",))
    for bad in ("0", "661", "x"):
        assert_failure(cli("reload", "--address", "http://127.0.0.1:1", "--timeout", bad), USAGE, command="reload",
                       mentions=("--timeout",))
    result = cli("reload", "--help")
    assert result.returncode == 0 and "--timeout SEC" in result.stdout


def test_a_server_that_echoes_the_key_dressed_up_never_gets_it_printed_nor_format_characters(tmp_path):
    key = "k-" + os.urandom(16).hex()
    key_file = tmp_path / "key"
    key_file.write_text(key + "\n")
    for dressed in (key[:9] + "\u200b" + key[9:], key[:9] + "\\u0000" + key[9:], key[:9] + "\\u001b" + key[9:],
                    key.upper(), "\u202e" + key[:5] + "\u0301\u0301\u0301" + key[5:]):
        body = ('{"error":"invalid_caller_key","error_description":"you sent ' + dressed + ' \u2066x\u2069"}').encode()
        with hostile_server(http_answer(401, "application/json", body)) as url:
            result = cli("token", "--address", url, "--key-file", str(key_file))
        assert_failure(result, REFUSED, mentions=("invalid_caller_key", "[hidden]"))
        assert key not in result.stderr.lower() and key[9:] not in result.stderr.lower(), result.stderr
        assert all(" " <= character <= "~" or character in "\n…" for character in result.stderr), repr(result.stderr)


# A mistake saved in the file: the running broker's business, not the commands'

def test_a_mistake_saved_in_the_file_keeps_no_command_from_the_running_broker(tmp_path):
    """An edit saved in the broker's file (a provider with tokenRefreshDelaySec 0), not reloaded:
    the broker serves on, and token, status and healthcheck, which read of the file only the
    listener they ask, find it as before (they exited 2, 2 and 1: "invalid configuration"). reload
    asks the broker, which judges the file: 422 invalid_configuration, exit 5, logged and counted
    as result="invalid" (it exited 2 without asking). Only a listener that cannot be read fails
    the commands, without asking anything."""
    config = {"listen": f"127.0.0.1:{closed_port()}", "adminListen": f"127.0.0.1:{closed_port()}",
              "providers": [{"name": "default"}]}
    with Broker(config, listen=None, admin=None) as broker:
        path = os.path.join(broker.workdir, "config.json")
        token = served_token(broker)
        write_json(broker.workdir, "config.json",
                   {**config, "providers": [{"name": "default"}, {"name": "new", "tokenRefreshDelaySec": 0}]})
        assert run_broker("--check-config", "--config", path).returncode == 2, "the file is invalid"
        assert_token(cli("token", "--config", path), token)
        assert_token(cli("token", env={"TOKEN_BROKER_CONFIG": path}), token)
        result = cli("status", "--config", path)
        assert result.returncode == 0, result.stderr
        assert [row["NAME"] for row in parse_tables(result.stdout)[0][1]] == ["default"]
        result = cli("healthcheck", "--config", path)
        assert result.returncode == 0, result.stderr
        result = cli("reload", "--config", path)
        assert_failure(result, REFUSED, command="reload",
                       mentions=("not reloaded", "invalid_configuration", "providers[1].tokenRefreshDelaySec"))
        assert broker.metric("token_broker_reloads_total", result="invalid") == 1
        assert "configuration not reloaded" in broker.stderr()
        # Not JSON: nothing can be read of it; the environment's listener needs no file.
        with open(path, "w") as handle:
            handle.write(json.dumps(config)[:-1])
        for command in ("token", "status", "reload"):
            assert_failure(cli(command, "--config", path), USAGE, command=command,
                           mentions=("invalid configuration", "not valid JSON", path))
        result = cli("healthcheck", "--config", path)
        assert result.returncode == 1 and "not valid JSON" in result.stderr, result.stderr
        assert_token(cli("token", "--config", path, env={"TOKEN_BROKER_LISTEN": broker.addresses["token"]}), token)
        # A listener that is not an address: the commands that ask it fail, naming it; token asks the other.
        write_json(broker.workdir, "config.json", {**config, "adminListen": "localhost:9090"})
        for command in ("status", "reload"):
            assert_failure(cli(command, "--config", path), USAGE, command=command, mentions=("adminListen", path))
        result = cli("healthcheck", "--config", path)
        assert result.returncode == 1 and "adminListen" in result.stderr, result.stderr
        assert_token(cli("token", "--config", path), token)
        assert broker.metric("token_broker_reloads_total", result="invalid") == 1, "only the broker's own reload"


# reload while the broker stops

def test_reload_says_not_reloaded_when_the_broker_answers_that_it_is_stopping():
    """The broker's own 503 shutting_down is its answer, not another server's: the reload was not
    made, exit 5 saying the broker is stopping (it was exit 1, "gave no reload answer … is it the
    broker's admin listener?")."""
    body = b'{"error":"shutting_down","error_description":"the broker is stopping"}'
    with hostile_server(http_answer(503, "application/json", body)) as url:
        result = cli("reload", "--address", url)
    assert_failure(result, REFUSED, command="reload", mentions=("not reloaded: the broker is stopping",
                                                                 "HTTP 503 shutting_down"))
    assert "is it the broker's" not in result.stderr


def test_a_reload_asked_of_a_broker_that_is_stopping_is_not_reloaded():
    """A real broker, stopping while a proxied request holds it (up to 5 s): a reload asked then
    is never made, and the command exits 5, not 1."""
    with socket.socket() as target:
        target.bind(("127.0.0.1", 0))
        target.listen(8)
        target.settimeout(15)
        config = {"proxies": [{"name": "held", "target": f"http://127.0.0.1:{target.getsockname()[1]}",
                               "timeoutMsec": 60000}]}
        with Broker(config) as broker:
            proxied = threading.Thread(target=lambda: broker.request("GET", "/proxy/held/x", timeout=30), daemon=True)
            proxied.start()
            forwarded, _ = target.accept()  # the request is in flight, waiting for its answer
            with forwarded:
                broker.process.send_signal(signal.SIGTERM)
                assert wait_until(lambda: "msg=stopping" in broker.stderr(), timeout=10), broker.stderr()
                result = cli("reload", "--address", address(broker, "admin"))
                assert broker.process.wait(timeout=20) == 0
            proxied.join(timeout=20)
        assert_failure(result, REFUSED, command="reload", mentions=("not reloaded",))
