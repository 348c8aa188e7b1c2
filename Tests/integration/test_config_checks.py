"""What `--check-config`, start and reload check in a configuration before the broker serves it.

Each case is a configuration the broker would otherwise take and then fail on at every fetch or
every write: it is refused at once, exit status 2, with an error naming the path.
"""
import json
import os
import socket

import pytest

from broker import run_broker
from test_cli import closed_port

LOOPBACK_ZERO = {"TOKEN_BROKER_LISTEN": "127.0.0.1:0", "TOKEN_BROKER_ADMIN_LISTEN": "127.0.0.1:0"}


def write_config(directory, config):
    path = os.path.join(str(directory), "config.json")
    with open(path, "w") as handle:
        json.dump(config, handle)
    return path


def check_and_start(config):
    """`--check-config`, then a start (which ends at once when the file is refused)."""
    return run_broker("--check-config", "--config", config), run_broker("--config", config, env=LOOPBACK_ZERO)


def assert_refused(results, *mentions):
    for result in results:
        assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
        assert "configuration OK" not in result.stdout
        for text in mentions:
            assert text in result.stderr, (text, result.stderr)


def oauth_with_secret_file(path):
    return {"providers": [{"name": "default", "source": {
        "type": "oauth2", "tokenURL": "http://127.0.0.1:9/token", "clientID": "c", "clientSecretFile": path}}]}


# clientSecretFile: read as the other secret files are

@pytest.mark.parametrize("kind", ["fifo", "directory", "device", "dangling symlink", "empty", "two lines"])
def test_a_client_secret_file_that_cannot_hold_the_secret_is_refused_naming_it(tmp_path, kind):
    path = str(tmp_path / "client-secret")
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        os.mkdir(path)
    elif kind == "device":
        path = "/dev/zero"
    elif kind == "dangling symlink":
        os.symlink(str(tmp_path / "nowhere"), path)
    elif kind == "empty":
        open(path, "w").close()
    else:
        with open(path, "w") as handle:
            handle.write("first\nsecond\n")
    assert_refused(check_and_start(write_config(tmp_path, oauth_with_secret_file(path))), path,
                   "providers[0].source")


def test_a_client_secret_file_not_there_yet_is_accepted_and_one_that_reads_is_too(tmp_path):
    # A mounted secret may appear after the broker starts: each fetch reads the file again.
    config = write_config(tmp_path, oauth_with_secret_file(str(tmp_path / "later")))
    result = run_broker("--check-config", "--config", config)
    assert result.returncode == 0 and "configuration OK" in result.stdout, result.stderr
    secret = tmp_path / "secret"
    secret.write_text("s3cr3t-value\n")
    secret.chmod(0o600)
    result = run_broker("--check-config", "--config", write_config(tmp_path, oauth_with_secret_file(str(secret))))
    assert result.returncode == 0 and "configuration OK" in result.stdout, result.stderr
    assert "s3cr3t-value" not in result.stdout + result.stderr


# oauth2: nothing sent twice, nothing taken and ignored

def oauth2_config(**source):
    return {"providers": [{"name": "default", "source": {
        "type": "oauth2", "tokenURL": "http://127.0.0.1:9/token", "clientID": "c", **source}}]}


PEM = "/run/secrets/client.pem"


@pytest.mark.parametrize("source,key,mention", [
    ({"clientSecret": "s", "extraParams": {"grant_type": "password"}}, "extraParams.grant_type", "sends grant_type itself"),
    ({"clientSecret": "s", "clientAuth": "client_secret_post", "extraParams": {"client_secret": "t"}},
     "extraParams.client_secret", "sends client_secret itself"),
    ({"clientSecret": "s", "extraParams": {"client_id": "other"}}, "extraParams.client_id", "sends client_id itself"),
    ({"clientAuth": "private_key_jwt", "privateKeyFile": PEM, "extraParams": {"client_assertion_type": "x"}},
     "extraParams.client_assertion_type", "sends client_assertion_type itself"),
    ({"clientSecret": "s", "scope": "api", "extraParams": {"scope": "admin"}}, "extraParams.scope", "source.scope is sent already"),
    ({"clientSecret": "s", "privateKeyFile": PEM}, "privateKeyFile", 'applies only with clientAuth \\"private_key_jwt\\"'),
    ({"clientSecret": "s", "clientAuth": "client_secret_post", "kid": "k1"}, "kid", 'applies only with clientAuth \\"private_key_jwt\\"'),
    ({"clientAuth": "private_key_jwt", "privateKeyFile": PEM, "clientSecret": "s"}, "clientSecret",
     'applies only with clientAuth \\"client_secret_basic\\" or \\"client_secret_post\\"'),
    ({"clientSecret": ""}, "clientSecret", "one non-empty line"),
    ({"clientSecret": "first-line\nsmuggled: value"}, "clientSecret", "one non-empty line"),
], ids=["grant_type", "client_secret", "client_id", "client_assertion_type", "scope twice", "privateKeyFile under basic",
        "kid under post", "clientSecret under private_key_jwt", "empty secret", "two-line secret"])
def test_an_oauth2_source_that_would_send_a_parameter_twice_or_ignore_a_key_is_refused(tmp_path, source, key, mention):
    """Each is refused at once, naming the key (the log's logfmt escapes the message's quotes)."""
    results = check_and_start(write_config(tmp_path, oauth2_config(**source)))
    assert_refused(results, "providers[0].source." + key + ":", mention)
    for result in results:
        assert "smuggled" not in result.stderr and "first-line" not in result.stderr


@pytest.mark.parametrize("source,key", [
    ({"type": "oauth2", "tokenURL": "http://user:URLPASSWORD-9@127.0.0.1:9/token", "clientID": "c", "clientSecret": "s"},
     "tokenURL"),
    ({"type": "http", "url": "https://URLPASSWORD-9@127.0.0.1:9/token"}, "url"),
], ids=["oauth2", "http"])
def test_a_token_url_with_user_information_is_refused_without_showing_it(tmp_path, source, key):
    results = check_and_start(write_config(tmp_path, {"providers": [{"name": "default", "source": source}]}))
    assert_refused(results, f"providers[0].source.{key}: has user information")
    for result in results:
        assert "URLPASSWORD" not in result.stderr + result.stdout


# store: a file store's directory must take a record

def store_key_file(directory):
    path = directory / "store.key"
    path.write_text(os.urandom(32).hex() + "\n")
    path.chmod(0o600)
    return str(path)


def test_a_store_directory_where_no_record_can_be_made_stops_check_and_start_naming_it(tmp_path):
    # /proc passes the owner and mode checks (root's, not writable by others), yet no file can
    # be made there: every record would fail to be written.
    config = write_config(tmp_path, {"store": {"type": "file", "path": "/proc", "keyFile": store_key_file(tmp_path)}})
    assert_refused(check_and_start(config), "store.path", "/proc", "cannot hold a record")


def test_a_store_directory_that_takes_records_passes_and_keeps_no_probe(tmp_path):
    directory = tmp_path / "store"
    directory.mkdir(mode=0o700)
    config = write_config(tmp_path, {"store": {"type": "file", "path": str(directory),
                                               "keyFile": store_key_file(tmp_path)}})
    result = run_broker("--check-config", "--config", config)
    assert result.returncode == 0 and "configuration OK" in result.stdout, result.stderr
    assert os.listdir(directory) == []


@pytest.mark.parametrize("source", [
    {"type": "jwt", "kid": ""},
    {"type": "oauth2", "tokenURL": "http://127.0.0.1:9/token", "clientID": "c", "clientAuth": "private_key_jwt",
     "privateKeyFile": "/nonexistent.pem", "kid": ""},
], ids=["jwt", "private_key_jwt"])
def test_an_empty_kid_is_refused_naming_it(tmp_path, source):
    """`"kid": ""` was taken: the local signer published its key under the empty kid, and signed
    tokens whose header names it, which no verifier's lookup by kid tells from a missing one."""
    config = {"providers": [{"name": "default", "source": source}]}
    assert_refused(check_and_start(write_config(tmp_path, config)), "providers[0].source.kid: must not be empty")


# null: an error naming the key, never "not set"

@pytest.mark.parametrize("config,key", [
    ({"clientKeysFile": None, "providers": None, "store": None}, "clientKeysFile"),
    ({"providers": None}, "providers"),
    ({"store": None}, "store"),
    ({"store": {"type": "redis", "address": "127.0.0.1:9", "keyFile": "/k", "passwordFile": None}}, "store.passwordFile"),
    ({"providers": [{"name": "default", "source": {"type": "jwt", "keyFile": None}}]}, "providers[0].source.keyFile"),
    ({"providers": [{"name": "waf", "source": {"type": "http", "url": "http://127.0.0.1:9/t",
                                                "headers": {"X-Api-Key": None}}}]}, "providers[0].source.headers.X-Api-Key"),
])
def test_a_null_value_is_refused_naming_its_key(tmp_path, config, key):
    """`null` was taken as "not set": `{"clientKeysFile": null, "providers": null, "store": null}`
    passed --check-config and started without caller keys, with the default signer and the memory
    store, where `"clientKeysFile": ""` is an error. It is one now, as an unknown key is, for
    --check-config and for a start: leaving the key out is how its default is asked for."""
    assert_refused(check_and_start(write_config(tmp_path, config)), f"{key}: is null; leave the key out for its default")


# The environment's variables: TOKEN_BROKER_CONFIG set but empty is an error, never "unset"

def test_an_empty_config_variable_is_refused_naming_it(tmp_path):
    """An empty TOKEN_BROKER_CONFIG (a manifest's template left unfilled) started the embedded
    default, with its own signer, and looked healthy. It is now a configuration error naming the
    variable: exit 2 for start, --check-config and the commands, 1 for healthcheck (which Docker
    reads)."""
    variable = "TOKEN_BROKER_CONFIG"
    env = {**LOOPBACK_ZERO, variable: ""}
    results = [run_broker("--check-config", env=env), run_broker(env=env, timeout=15)]
    assert_refused(results, variable, "empty")
    for command, status in [("healthcheck", 1), ("status", 2), ("reload", 2), ("token", 2)]:
        result = run_broker(command, env=env)
        assert result.returncode == status, (command, result.returncode, result.stderr)
        assert variable in result.stderr and "empty" in result.stderr, (command, result.stderr)


@pytest.mark.parametrize("variable,key", [("TOKEN_BROKER_LISTEN", "listen"), ("TOKEN_BROKER_ADMIN_LISTEN", "adminListen")])
def test_an_empty_listener_variable_means_the_file_s_listener(tmp_path, variable, key):
    """The image sets both listener variables (Dockerfile), and a container cannot unset them,
    only empty them: empty means the file's listener, as unset does."""
    ports = {"listen": closed_port(), "adminListen": closed_port()}
    config = write_config(tmp_path, {k: f"127.0.0.1:{port}" for k, port in ports.items()})
    env = {**LOOPBACK_ZERO, variable: ""}
    result = run_broker("--check-config", "--config", config, env=env)
    assert result.returncode == 0, result.stderr
    wanted = "token listener" if key == "listen" else "admin listener"
    assert f"{wanted} 127.0.0.1:{ports[key]}" in result.stdout, result.stdout


def test_a_listener_clash_caused_by_the_environment_names_the_variable(tmp_path):
    """The file's adminListen was fine: the clash came from TOKEN_BROKER_LISTEN, which the error
    did not name ("adminListen: … is also listen"). It now says where the value came from."""
    config = write_config(tmp_path, {"listen": "127.0.0.1:0", "adminListen": "127.0.0.1:47202"})
    env = {"TOKEN_BROKER_LISTEN": "127.0.0.1:47202"}
    results = [run_broker("--check-config", "--config", config, env=env),
               run_broker("--config", config, env=env, timeout=15)]
    assert_refused(results, "adminListen: 127.0.0.1:47202 is also listen (from TOKEN_BROKER_LISTEN)")
    config = write_config(tmp_path, {"listen": "127.0.0.1:47203", "adminListen": "127.0.0.1:47204"})
    env = {"TOKEN_BROKER_ADMIN_LISTEN": "127.0.0.1:47203"}
    results = [run_broker("--check-config", "--config", config, env=env),
               run_broker("--config", config, env=env, timeout=15)]
    assert_refused(results, "adminListen (from TOKEN_BROKER_ADMIN_LISTEN): 127.0.0.1:47203 is also listen;")


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_listeners_that_cannot_both_bind_are_refused_before_start(tmp_path):
    """0.0.0.0 takes its port on every IPv4 address: with 127.0.0.1 on the same port for the
    other listener, --check-config said "configuration OK" and start then failed to bind (exit 1,
    Address already in use). Both now refuse the file, exit 2, naming the keys; nothing binds."""
    port = free_port()
    config = write_config(tmp_path, {"listen": f"0.0.0.0:{port}", "adminListen": f"127.0.0.1:{port}"})
    assert_refused([run_broker("--check-config", "--config", config), run_broker("--config", config, timeout=15)],
                   f"adminListen: 127.0.0.1:{port} overlaps listen 0.0.0.0:{port}")
    # IPv6: [::] takes its port on every IPv6 address, and no IPv4 one (the listeners are IPv6-only).
    config = write_config(tmp_path, {"listen": f"[::1]:{port}", "adminListen": f"[::]:{port}"})
    assert_refused([run_broker("--check-config", "--config", config)], f"adminListen: [::]:{port} overlaps listen")
    for listen, admin in ((f"0.0.0.0:{port}", f"[::]:{port}"), (f"127.0.0.1:{port}", f"127.0.0.2:{port}")):
        config = write_config(tmp_path, {"listen": listen, "adminListen": admin})
        result = run_broker("--check-config", "--config", config)
        assert result.returncode == 0 and "configuration OK" in result.stdout, (listen, admin, result.stderr)
