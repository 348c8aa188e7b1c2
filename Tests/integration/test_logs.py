"""`"logFormat": "json"`: every line of a busy broker's log is one JSON object, with the same
messages and fields as the logfmt lines of the same scenario. (The secrets test, test_secrets.py,
runs in both formats.)"""
import json
import re
import socket

import pytest

from broker import Broker, run_broker

LOGFMT_FIELD = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)=("(?:[^"\\]|\\.)*"|[^ ]+)')


def logfmt(line):
    """A logfmt line as a dict: bare values as they are, quoted ones read as JSON strings."""
    fields = {}
    for key, value in LOGFMT_FIELD.findall(line):
        fields[key] = json.loads(value) if value.startswith('"') else value
    return fields


def closed_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def scenario(tmp_path, log_format):
    """A broker that fetches, fails to fetch, makes a template's child, writes a token file and
    keeps a file store, proxies a request to a closed port, then stops: its stderr lines."""
    tmp_path.mkdir()
    key = tmp_path / "store.key"
    key.write_text("ab" * 32 + "\n")
    key.chmod(0o600)
    (tmp_path / "store").mkdir(mode=0o700)
    (tmp_path / "files").mkdir(mode=0o700)
    config = {
        "logFormat": log_format,
        "providers": [
            {"name": "default"},
            {"name": "down", "maxRetryCount": 1, "maxErrorTokenRefreshDelayMsec": 200,
             "source": {"type": "http", "url": f"http://127.0.0.1:{closed_port()}/token"}},
            {"name": "aud", "perRequest": ["audience"], "allowedAudiences": ["https://svc.example/*"]},
        ],
        "proxies": [{"name": "gone", "target": f"http://127.0.0.1:{closed_port()}"}],
        "sinks": [{"provider": "default", "path": str(tmp_path / "files" / "token")}],
        "store": {"type": "file", "path": str(tmp_path / "store"), "keyFile": str(key)},
    }
    with Broker(config) as broker:
        assert broker.request("GET", "/providers/aud/token?audience=https://svc.example/a")[0] == 200
        assert broker.request("GET", "/proxy/gone/x")[0] == 502
        assert broker.request("GET", "/providers/down/token")[0] == 503
        broker.stop()
        return broker.stderr().splitlines()


def test_every_json_line_parses_and_holds_what_the_logfmt_line_holds(tmp_path):
    json_lines = scenario(tmp_path / "json", "json")
    logfmt_lines = scenario(tmp_path / "logfmt", "logfmt")
    objects = []
    for line in json_lines:
        value = json.loads(line)  # fails the test on any line that is not one JSON object
        assert isinstance(value, dict), line
        assert list(value)[:3] == ["time", "level", "msg"], line
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z", value["time"]), line
        assert value["level"] in ("info", "warn", "error"), line
        assert all(isinstance(field, str) for field in value.values()), "every value is a string"
        objects.append(value)
    assert not any(line.startswith("time=") for line in json_lines)
    messages = {o["msg"] for o in objects}
    for wanted in ("listening", "token fetched", "token fetch failed", "stopping", "stopped"):
        assert wanted in messages, f"{wanted!r} not logged: {sorted(messages)}"
    # The same events with the same fields: each logfmt line's message and field names appear,
    # together, in a JSON line (times, versions and ports differ between the two runs).
    shapes = {(o["msg"], tuple(k for k in o if k not in ("time",))) for o in objects}
    for line in logfmt_lines:
        fields = logfmt(line)
        if not fields:
            continue
        assert (fields["msg"], tuple(k for k in fields if k not in ("time",))) in shapes, line


def test_a_start_with_nothing_wrong_logs_no_warning():
    # An operator who alerts on warnings must not be woken by every start (libmicrohttpd warned
    # when its logger was not the first option the daemon was given).
    with Broker() as broker:
        assert broker.get_json("/token")[0]["version"] == 1
        lines = broker.stderr().splitlines()
    warnings = [line for line in lines if logfmt(line).get("level") not in ("info", None)]
    assert warnings == [], warnings
    assert any(logfmt(line).get("msg") == "listening" for line in lines)


def test_an_unknown_log_format_is_refused_at_start(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"logFormat": "xml"}))
    result = run_broker("--config", str(config), "--check-config")
    assert result.returncode == 2
    problem = logfmt(result.stderr.splitlines()[-1])["problem"]
    assert problem.startswith('logFormat: "xml" is not a log format'), problem


@pytest.mark.parametrize("mistake", ["duplicate provider", "listen from the environment", "missing key file"])
def test_an_error_at_start_is_logged_in_the_format_the_file_asks_for(tmp_path, mistake):
    """The file's logFormat applies as soon as the file is read as JSON: the errors found in the
    rest of it, or in the environment's overrides, come out in JSON too (before, a duplicate
    name and TOKEN_BROKER_LISTEN=x came out in logfmt, a missing key file in JSON)."""
    # Port 0 for both: should the broker start after all, it takes no port another test uses.
    config = {"logFormat": "json", "listen": "127.0.0.1:0", "adminListen": "127.0.0.1:0", "providers": [{"name": "a"}]}
    env = {}
    if mistake == "duplicate provider":
        config["providers"].append({"name": "a"})
    elif mistake == "listen from the environment":
        env["TOKEN_BROKER_LISTEN"] = "x"
    else:
        config["providers"][0]["source"] = {"keyFile": str(tmp_path / "missing.pem")}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    result = run_broker("--config", str(path), env=env)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert lines, "an error is logged"
    for line in lines:
        assert json.loads(line)["level"] in ("info", "warn", "error"), line
    error = json.loads(lines[-1])
    assert error["msg"] == "invalid configuration", error
    wanted = {"duplicate provider": "providers[1].name", "listen from the environment": "TOKEN_BROKER_LISTEN",
              "missing key file": "missing.pem"}[mistake]
    assert wanted in error["problem"], error
