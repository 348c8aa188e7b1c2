"""A fleet of brokers sharing a `redis` store: one upstream fetch per refresh for the whole fleet.

Each test starts its own redis-server on a Unix socket in a temporary directory (no persistence)
and a fleet of brokers with the same configuration and key file, against the real OAuth server
(django-oauth-toolkit), whose own count of token requests says how many fetches the fleet made.
Tokens live LIFETIME seconds, so a refresh comes every 3.0–3.4 s (75–85 % of the lifetime).

Versions are followed on every broker by back-to-back long-polls (`Watcher`), which also time when
each broker first served a version. Redis is killed, stopped (SIGSTOP) and restarted on the same
socket; a broker holding the refresh lease is killed; one broker has another key file. Redis's
raw values and its whole command traffic (MONITOR) are searched for tokens and secrets in clear.
Timing checks are generous bounds, except the issue's 100 ms for the fleet to serve a new token.
"""
import asyncio
import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from broker import Broker
from issuers.process import OAuthServer
from test_http_api import get, wait_until
from test_reload import rewrite

SECRET = "fleet-client-secret-Zr8pQ2"
LIFETIME = 4
CYCLE = LIFETIME + 10  # the longest wait for one refresh, generous
HASH = hashlib.sha256(b"default").hexdigest()  # the record key's hash, for provider `default`
OPS = "token_broker_store_operations_total"
FETCHES = "token_broker_store_fetches_total"
SEEN = set()  # tokens, the client secret and store keys: never in a broker's log
PROGRESS = re.compile(r'msg="(token fetch(ed| failed)|stored token served|token from the fleet)" provider=default( |$)', re.M)


class RedisServer:
    """A redis-server on a Unix socket in a temporary directory, with a tiny RESP client."""

    def __init__(self):
        self.directory = tempfile.mkdtemp(prefix="tb-redis-")  # short: a socket path has 107 bytes at most
        self.socket = os.path.join(self.directory, "redis.sock")
        self.process = None
        self.start()

    def start(self):
        self.process = subprocess.Popen(
            ["redis-server", "--port", "0", "--unixsocket", self.socket, "--unixsocketperm", "700", "--save", "",
             "--appendonly", "no", "--dir", self.directory, "--logfile", os.path.join(self.directory, "redis.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        assert wait_until(self.answers, timeout=10), "redis-server did not start"

    def answers(self):
        try:
            return self.command("PING", timeout=1) == "PONG"
        except (OSError, AssertionError):
            return False

    def connect(self, timeout=5):
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        connection.settimeout(timeout)
        connection.connect(self.socket)
        return connection

    def command(self, *args, timeout=5):
        with self.connect(timeout) as connection:
            connection.sendall(encode(args))
            return read_reply(connection.makefile("rb"))

    def kill(self):
        self.process.kill()
        self.process.wait(10)


def encode(args):
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(str(arg)), str(arg).encode()) for arg in args)


def read_reply(stream):
    line = stream.readline()
    kind, rest = line[:1], line[1:-2]
    assert kind in b"+:$*" and kind, f"Redis answered {line!r}"
    if kind == b"+":
        return rest.decode()
    if kind == b":":
        return int(rest)
    if kind == b"$":
        return None if int(rest) < 0 else stream.read(int(rest) + 2)[:-2]
    return [read_reply(stream) for _ in range(int(rest))]


class Capture:
    """Everything Redis sends on one connection after `args` (MONITOR, SUBSCRIBE), as raw bytes."""

    def __init__(self, redis, *args):
        self.connection, self.data, self.stopped = redis.connect(timeout=0.2), bytearray(), False
        self.connection.sendall(encode(args))
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        while not self.stopped:
            try:
                chunk = self.connection.recv(65536)
            except socket.timeout:
                continue
            if not chunk:
                return
            self.data += chunk

    def stop(self):
        self.stopped = True
        self.thread.join(5)
        self.connection.close()
        return bytes(self.data)


class LoopbackServer:
    """A listener on an ephemeral 127.0.0.1 port that hands each connection it accepts to
    `_accepted` (a subclass's), until `stop()`. A subclass sets what `_accepted` uses before
    calling this `__init__`, which starts accepting."""

    def __init__(self):
        self.stopped = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.address = "127.0.0.1:%d" % self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def stop(self):
        self.stopped.set()
        self.listener.close()

    def _accept(self):
        while not self.stopped.is_set():
            try:
                client, _ = self.listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            client.settimeout(None)
            try:
                self._accepted(client)
            except OSError:
                client.close()
                return

    def _accepted(self, client):
        raise NotImplementedError


class Link(LoopbackServer):
    """A proxy on 127.0.0.1 to Redis's socket, each connection pumped both ways by `_pump`
    (a subclass's), until `stop()`."""

    def __init__(self, redis):
        self.redis = redis
        super().__init__()

    def _accepted(self, client):
        upstream = self.redis.connect(timeout=None)
        threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
        threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, source, target, outbound):
        try:
            while not self.stopped.is_set() and (data := source.recv(65536)):
                self._pass(data, target, outbound)
        except OSError:
            pass
        finally:
            source.close()
            target.close()

    def _pass(self, data, target, outbound):
        target.sendall(data)


class SlowLink(Link):
    """Holds each lease-taking EVAL for `delay` seconds: a broker behind it (on a slow link, or a
    busy host) takes the lease that long after it read the record."""

    def __init__(self, redis, delay):
        self.delay, self.held = delay, 0
        super().__init__(redis)

    def _pass(self, data, target, outbound):
        if outbound and b"'PTTL'" in data:  # RedisTokenStore.acquireScript's, and no other command's
            self.held += 1
            time.sleep(self.delay)
        target.sendall(data)


class DrippingLink(Link):
    """Once `drip` is set, passes Redis's replies on a byte at a time, `gap` seconds apart: each
    byte well within the store's `timeoutMsec`, a whole reply far beyond it."""

    def __init__(self, redis, gap):
        self.gap, self.drip = gap, threading.Event()
        super().__init__(redis)

    def _pass(self, data, target, outbound):
        if outbound or not self.drip.is_set():
            target.sendall(data)
            return
        for byte in data:
            if self.stopped.wait(self.gap):
                return
            target.sendall(bytes([byte]))


class FleetBroker(Broker):
    """A Broker whose start ends with its first token: fetched, served from the store, or the fleet's."""

    def _wait_for_first_fetches(self, config, timeout=20):
        wait_until(lambda: self.process.poll() is not None or PROGRESS.search(self.stderr()), timeout)


class Watcher:
    """Follows a broker's versions with back-to-back long-polls: seen = {version: (token, time.time() served)}."""

    def __init__(self, broker):
        self.broker, self.seen, self.errors, self.stopped, self.last = broker, {}, [], False, 0
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        while not self.stopped:
            try:
                status, _, body = self.broker.request("GET", f"/token/ready?after={self.last}&timeout=10", timeout=20)
            except OSError as error:
                if not self.stopped:
                    self.errors.append(repr(error))
                return
            at = time.time()
            if status == 200:
                document = json.loads(body)
                SEEN.add(document["access_token"])
                self.seen.setdefault(document["version"], (document["access_token"], at))
                self.last = max(self.last, document["version"])
            elif status != 304 and not self.stopped:
                self.errors.append((status, body))
                time.sleep(0.1)


@pytest.fixture(scope="module")
def issuer(tmp_path_factory):
    server = OAuthServer(str(tmp_path_factory.mktemp("fleet")), {"fleet": SECRET}, lifetime=LIFETIME)
    yield server
    server.fault("none")
    server.close()


@pytest.fixture
def redis():
    server = RedisServer()
    yield server
    server.kill()
    shutil.rmtree(server.directory, ignore_errors=True)


def write_key(path):
    key = os.urandom(32)
    path.write_text(key.hex() + "\n")
    path.chmod(0o600)
    SEEN.add(key.hex())
    return key


@pytest.fixture
def key(tmp_path):
    """(the store key, its file)."""
    path = tmp_path / "store.key"
    return write_key(path), str(path)


@pytest.fixture
def fleet(issuer, redis, key):
    """fleet(count, **store settings) starts `count` brokers at once; all are stopped together at the end."""
    started = []

    def start(count, key_file=None, address=None, provider=None, **store):
        config = {"providers": [{"name": "default", "maxErrorTokenRefreshDelayMsec": 500, **(provider or {}), "source": {
                      "type": "oauth2", "tokenURL": issuer.base + "/o/token/", "clientID": "fleet", "clientSecret": SECRET,
                      "scope": "api", "timeoutMsec": 1500, "connectTimeoutMsec": 500}}],
                  "store": {"type": "redis", "address": address or "unix:" + redis.socket,
                            "keyFile": key_file or key[1], **store}}
        with ThreadPoolExecutor(count) as pool:
            brokers = list(pool.map(lambda _: FleetBroker(config), range(count)))
        started.extend(brokers)
        return brokers

    yield start
    with ThreadPoolExecutor(max(1, len(started))) as pool:
        list(pool.map(lambda broker: broker.stop(), started))


@pytest.fixture(autouse=True)
def nothing_secret_is_logged():
    SEEN.clear()
    SEEN.add(SECRET)
    yield
    for broker in Broker.started:
        leaked = sorted(secret[:10] + "…" for secret in SEEN if secret in broker.stderr())
        assert not leaked, f"the broker's log ({broker.log_path}) holds secrets: {leaked}"


def token(broker):
    body, _ = broker.get_json("/token")
    SEEN.add(body["access_token"])
    return body


def sha256(text):
    return hashlib.sha256(text.encode()).hexdigest()


def fingerprint(access_token):
    return "sha256:" + sha256(access_token)[:12]


def lines(broker, message):
    """The broker's log lines with `message` (all of them for "")."""
    return [line for line in broker.stderr().splitlines() if f'msg="{message}"' in line or not message]


def total(brokers, name, **labels):
    return sum(broker.metric(name, **labels) for broker in brokers)


def readyz(broker):
    status, _, body = broker.request("GET", "/readyz", listener="admin")
    return status, json.loads(body)


def served(brokers):
    """What each broker's /token serves now: the answer's document, or None when it is not 200."""
    answers = [broker.request("GET", "/token") for broker in brokers]
    documents = [json.loads(body) if status == 200 else None for status, _, body in answers]
    SEEN.update(document["access_token"] for document in documents if document)
    return documents


def refreshed(brokers, after, timeout=CYCLE):
    """What every broker serves once they all serve one token newer than version `after`."""
    found = [None]

    def agreed():
        documents = served(brokers)
        if all(documents) and len({d["access_token"] for d in documents}) == 1 and documents[0]["version"] > after:
            found[0] = documents[0]
        return found[0]

    assert wait_until(agreed, timeout=timeout, interval=0.05), [document and document["version"] for document in served(brokers)]
    return found[0]


def fingerprints(broker):
    """The tokens the broker fetched, as its log names them."""
    return [re.search(r" token=(sha256:[0-9a-f]{12}) ", line).group(1) for line in lines(broker, "token fetched")]


def fetched_lines(brokers, message="token fetched"):
    """Every `message` line of `brokers` (all lines: ""), with the broker's index, in time order (for failure messages)."""
    found = [(line[5:25], index, line) for index, broker in enumerate(brokers) for line in lines(broker, message)]
    return "\n".join(f"broker {index}: {line}" for _, index, line in sorted(found) if "libmicrohttpd" not in line)


# One fetch per refresh

def test_a_fleet_of_twenty_makes_exactly_one_upstream_fetch_per_refresh_over_ten_cycles(issuer, fleet):
    """20 brokers started at once, then ten refreshes: the issuer counts one token request at the
    start and one per refresh, and every broker serves each new token. Fails now and then with this
    build: the race shown by the lease test below makes two fetches in one refresh (or at the start)."""
    before = issuer.requests()
    # A call to Redis that a stall of the shared machine holds past `timeoutMsec` makes its broker
    # fetch alone, one fetch too many: this test counts fetches, not the timeout (tested below), so
    # it gives the calls 2 s rather than the default 500 ms.
    brokers = fleet(20, timeoutMsec=2000)
    watchers = [Watcher(broker) for broker in brokers]
    versions, counts, spreads = [0], [], []
    try:
        for cycle in range(11):  # the start, then ten refreshes
            assert wait_until(lambda: watchers[0].last > versions[-1], timeout=CYCLE), f"no refresh in cycle {cycle}"
            assert wait_until(lambda: len({watcher.last for watcher in watchers}) == 1, timeout=5), \
                f"cycle {cycle}: the brokers serve versions {[watcher.last for watcher in watchers]}"
            version = watchers[0].last
            versions.append(version)
            counts.append(issuer.requests() - before)
            assert len({watcher.seen[version][0] for watcher in watchers}) == 1, f"cycle {cycle}: tokens differ"
            times = [watcher.seen[version][1] for watcher in watchers]
            spreads.append(round((max(times) - min(times)) * 1000))
    finally:
        for watcher in watchers:
            watcher.stopped = True
    print(f"\nnatural refreshes, first to last of 20 brokers serving the new token (ms): {spreads[1:]}")
    assert counts == list(range(1, 12)), f"the issuer's token requests at the start and after each refresh: {counts} " \
        f"(versions {versions[1:]}):\n{fetched_lines(brokers)}"
    assert versions[1:] == list(range(versions[1], versions[1] + 11)), versions
    assert (total(brokers, FETCHES, **{"for": "fleet"}), total(brokers, FETCHES, **{"for": "alone"})) == (11, 0)
    assert not [watcher.errors for watcher in watchers if watcher.errors]


def test_every_broker_of_twenty_serves_a_new_token_within_100_ms_of_the_fetch(issuer, fleet):
    """A forced refresh on one broker, right after a refresh: the others' own refresh is 3 s away,
    so only the store's message can bring them the token in time. From the first broker serving
    it (the fetcher) to the last, timed by long-polls waiting on every broker."""
    # Six forced refreshes within 30 s: the window (5 per 30 s, counted for the fleet) is widened.
    brokers = fleet(20, provider={"forcedRefreshMaxAttempts": 20})
    watchers = [Watcher(broker) for broker in brokers]
    spreads, from_issuer = [], []
    try:
        assert wait_until(lambda: all(watcher.seen for watcher in watchers), timeout=10)
        refreshed(brokers, token(brokers[0])["version"])  # just refreshed: each forced refresh then puts the next off
        for round_ in range(6):
            current = max(watcher.last for watcher in watchers)
            assert wait_until(lambda: all(watcher.last == current for watcher in watchers), timeout=5)
            # Every broker has a long-poll waiting for the next version.
            assert wait_until(lambda: all(broker.metric("token_broker_longpoll_waiters", provider="default") == 1
                                          for broker in brokers), timeout=5)
            fetcher = brokers[round_ * 3 % 20]
            status, _, body = fetcher.request("POST", "/token/refresh", body=json.dumps({"rejected_version": current}).encode())
            assert status == 200, (status, body)
            fresh = json.loads(body)
            SEEN.add(fresh["access_token"])
            version = fresh["version"]
            assert version == current + 1, (current, fresh, fetched_lines(brokers))
            assert wait_until(lambda: all(version in watcher.seen for watcher in watchers), timeout=5), \
                f"round {round_}: not every broker served version {version}"
            assert {watcher.seen[version][0] for watcher in watchers} == {fresh["access_token"]}
            times = [watcher.seen[version][1] for watcher in watchers]
            spreads.append(max(times) - min(times))
            issued_at = issuer.issued()[sha256(fresh["access_token"])]["at"]
            from_issuer.append(max(watcher.seen[version][1] for watcher in watchers) - issued_at)
            assert f"version={version} token={fingerprint(fresh['access_token'])} " in lines(fetcher, "token fetched")[-1]
        print(f"\nforced refreshes, first to last of 20 brokers serving the new token (ms): "
              f"{[round(s * 1000, 1) for s in spreads]}"
              f"\n  from the token request's arrival at the issuer to the last broker (ms): "
              f"{[round(s * 1000, 1) for s in from_issuer]}")
        # The bound, on the median (a busy shared machine may stall one round's threads);
        # and in every round far less than the 3 s until the brokers' own refresh.
        assert statistics.median(spreads) <= 0.100, spreads
        assert max(spreads) <= 1.0, spreads
        assert total(brokers, OPS, operation="record", result="from_fleet") >= 6 * 19
    finally:
        for watcher in watchers:
            watcher.stopped = True


async def long_polls(brokers, per_broker, after, registered):
    """per_broker long-polls on each broker, all written before `registered` runs (in a thread), then read."""

    async def one(broker):
        host, port = broker._split("token")
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(get(f"/token/ready?after={after}&timeout=30"))
        await writer.drain()
        return reader, writer

    opened = await asyncio.gather(*(one(broker) for broker in brokers for _ in range(per_broker)))
    waiting = await asyncio.get_running_loop().run_in_executor(None, registered)

    async def answer(reader, writer):
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 45)
            length = int(re.search(rb"(?i)\r\ncontent-length: *(\d+)", head).group(1))
            body = await asyncio.wait_for(reader.readexactly(length), 10)
            return int(head.split(b" ")[1]), json.loads(body), time.time()
        finally:
            writer.close()

    return waiting, await asyncio.gather(*(answer(reader, writer) for reader, writer in opened))


def test_a_thousand_long_polls_across_the_fleet_are_answered_with_the_next_refresh(issuer, fleet):
    brokers = fleet(20)
    current = token(brokers[0])["version"]
    start = refreshed(brokers, current)["version"]  # just refreshed: the next one is 3 s away
    before, started = issuer.requests(), time.time()

    def registered():
        wait_until(lambda: total(brokers, "token_broker_longpoll_waiters", provider="default") == 1000, timeout=2.5)
        return [broker.metric("token_broker_longpoll_waiters", provider="default") for broker in brokers]

    waiting, answers = asyncio.run(long_polls(brokers, 50, start, registered))
    assert waiting == [50] * 20, f"not all 1000 long-polls were waiting before the refresh: {waiting}"
    assert [status for status, _, _ in answers] == [200] * 1000
    tokens = {(body["version"], body["access_token"]) for _, body, _ in answers}
    SEEN.update(access_token for _, access_token in tokens)
    issued = {request.get("token_sha256") for request in issuer.token_requests(since=started)}
    assert all(version > start and sha256(access_token) in issued for version, access_token in tokens), \
        "every long-poll was answered with a token of the refresh that followed"
    # One refresh answered them all: one token (two, when the race shown below made two fetches).
    assert len(tokens) == 1 or (len(tokens) == 2 and issuer.requests() - before == 2), (tokens, fetched_lines(brokers))
    times = [at for _, _, at in answers]
    print(f"\n1000 long-polls answered within {round((max(times) - min(times)) * 1000)} ms of each other")


def test_a_broker_that_read_the_old_record_just_before_another_stored_a_new_one_does_not_fetch_again(issuer, redis, fleet):
    """Two brokers refresh version N at once (forced: "a forced refresh anywhere in the fleet finds
    a record newer than the refused version, or is the one fetch for the fleet"); one of them reads
    the record (N), and its lease call reaches Redis 250 ms later, after the other has fetched,
    stored N+1 and let the lease go. It must then serve N+1, not fetch again.

    (A bug this test found: the lease script took a free lease without looking at the record
    again, so the late broker fetched a second token, N+2; the same race, without the slow link,
    made the first test fail now and then. The script now refuses the lease when the record's
    version is not the one the broker read.)"""
    link = SlowLink(redis, delay=0.25)
    try:
        # Redis calls may take 2 s here: the link's 250 ms beside a 500 ms timeout left a stalled
        # machine room for the lease call to time out, and the broker to fetch alone (a second fetch).
        quick, slow = fleet(1, timeoutMsec=2000)[0], fleet(1, address=link.address, timeoutMsec=2000)[0]
        current = refreshed([quick, slow], token(quick)["version"])["version"]  # the next refresh is 3 s away
        before, answers = issuer.requests(), {}

        def force(broker):
            status, _, body = broker.request("POST", "/token/refresh", body=json.dumps({"rejected_version": current}).encode())
            answers[broker.log_path] = (status, json.loads(body))
            SEEN.add(answers[broker.log_path][1].get("access_token", SECRET))

        late = threading.Thread(target=force, args=(slow,))
        late.start()
        time.sleep(0.05)  # the slow broker has read the record; its lease call is on the link
        force(quick)
        late.join(10)
        assert [status for status, _ in answers.values()] == [200, 200], answers
        final = refreshed([quick, slow], current, timeout=5)
        print(f"\ntwo forced refreshes of version {current}: {issuer.requests() - before} fetch(es), "
              f"the fleet serves version {final['version']}")
        assert issuer.requests() - before == 1, \
            f"two brokers refreshing version {current} at once made {issuer.requests() - before} fetches:\n" \
            f"{fetched_lines([quick, slow])}"
        assert link.held >= 1, "the link held no lease call: it no longer knows the lease script"
    finally:
        link.stop()


def test_the_window_of_forced_refreshes_is_counted_for_the_fleet(issuer, fleet):
    """Five forced refreshes, each on another broker, fill the window (5 per 30 s) of every broker:
    a sixth, on a broker that forced none, gets 429, and no fetch is made for it."""
    brokers = fleet(6)
    current = refreshed(brokers, token(brokers[0])["version"])["version"]
    for broker in brokers[:5]:
        status, _, body = broker.request("POST", "/token/refresh", body=json.dumps({"rejected_version": current}).encode())
        assert status == 200, (status, body)
        fresh = json.loads(body)
        SEEN.add(fresh["access_token"])
        current = refreshed(brokers, fresh["version"] - 1, timeout=5)["version"]
    before = issuer.requests()
    status, headers, body = brokers[5].request("POST", "/token/refresh", body=json.dumps({"rejected_version": current}).encode())
    assert status == 429, (status, body)
    assert json.loads(body)["error"] == "excessive_refresh"
    assert issuer.requests() == before


def test_the_readmes_acl_is_all_a_broker_needs(issuer, redis, fleet, tmp_path):
    """The README's `ACL SETUSER` line, as written there, for a user the brokers log in as: the
    fleet coordinates (fetches for the fleet, one per refresh) and no broker says Redis is out of
    reach; the scripts' commands are checked against that ACL too."""
    readme = open(os.path.join(os.path.dirname(__file__), "..", "..", "README.md")).read()
    line = next(text for text in readme.splitlines() if text.startswith("ACL SETUSER token-broker "))
    password = secrets.token_urlsafe(24)
    SEEN.add(password)
    assert redis.command("ACL", "SETUSER", *line.replace(">PASSWORD", ">" + password).split()[2:]) == "OK"
    password_file = tmp_path / "redis-password"
    password_file.write_text(password + "\n")
    password_file.chmod(0o600)
    # 2 s for a call to Redis (default 500 ms): one that a stall of the shared machine holds past
    # it makes a broker fetch alone, as a refused command would. A refused command still fails at once.
    brokers = fleet(3, username="token-broker", passwordFile=str(password_file), timeoutMsec=2000)
    current = refreshed(brokers, token(brokers[0])["version"])["version"]
    before = issuer.requests()
    refreshed(brokers, current)
    assert issuer.requests() - before == 1, fetched_lines(brokers)
    assert total(brokers, "token_broker_store_fetches_total", **{"for": "fleet"}) >= 2
    assert total(brokers, "token_broker_store_fetches_total", **{"for": "alone"}) == 0
    assert all(readyz(broker)[1]["store"] == {"type": "redis", "degraded": False} for broker in brokers)
    assert not any(lines(broker, "token store out of reach; fetching alone until it answers") for broker in brokers)


# A lease holder that dies

def test_when_the_lease_holder_is_killed_while_the_issuer_hangs_another_broker_fetches_once_the_lease_ends(issuer, redis, fleet):
    lease_msec = 2000
    brokers = fleet(5, leaseMsec=lease_msec)
    old = refreshed(brokers, 0, timeout=5)
    held = [broker.metric(OPS, operation="lease", result="acquired") for broker in brokers]
    issuer.fault("hang")
    try:
        assert wait_until(lambda: any(broker.metric(OPS, operation="lease", result="acquired") > count
                                      for broker, count in zip(brokers, held)), timeout=CYCLE)
        holder = next(broker for broker, count in zip(brokers, held)
                      if broker.metric(OPS, operation="lease", result="acquired") > count)
        assert wait_until(lambda: any(outcome == "hang" for _, outcome in issuer.attempts(time.time() - 3)), timeout=5)
        read_at = time.time()
        lease_left = redis.command("PTTL", f"token-broker:lease:{HASH}")
        read_by = time.time()  # Redis measured lease_left at some moment from read_at to read_by
        assert 0 < lease_left <= lease_msec, lease_left
        holder.process.kill()
        holder.process.wait(5)
        killed_at = time.time()
    finally:
        issuer.fault("none")
    survivors = [broker for broker in brokers if broker is not holder]
    assert wait_until(lambda: any(outcome == 200 for _, outcome in issuer.attempts(killed_at)), timeout=lease_msec / 1000 + 10)
    fetched_at = min(at for at, outcome in issuer.attempts(killed_at) if outcome == 200)
    print(f"\nlease holder killed: the next fetch reached the issuer {round((fetched_at - killed_at) * 1000)} ms later "
          f"(lease {lease_left} ms left when read)")
    assert fetched_at >= read_at + lease_left / 1000 - 0.05, "a broker fetched while the dead broker's lease lasted"
    # The others look at a lease another holds every 500 ms (RedisTokenStore.leasePoll, twice): a
    # fetch within 1.5 s of the lease's end leaves a second for a stall of a busy machine.
    assert fetched_at <= read_by + lease_left / 1000 + 1.5, "no broker fetched within 1.5 s of the lease's end"
    fresh = refreshed(survivors, old["version"], timeout=5)
    assert sha256(fresh["access_token"]) in issuer.issued()
    fetchers = [broker for broker in brokers if fingerprint(fresh["access_token"]) in fingerprints(broker)]
    assert len(fetchers) == 1 and fetchers[0] is not holder, "one survivor fetched the new token for the others"


# Redis out of reach

def test_with_redis_killed_every_broker_serves_and_fetches_alone_then_rejoins_when_it_is_back(issuer, redis, fleet):
    brokers = fleet(4)
    refreshed(brokers, token(brokers[0])["version"])  # just refreshed
    before, killed_at = issuer.requests(), time.time()
    redis.kill()
    statuses, stop = [], threading.Event()

    def keep_reading():
        while not stop.is_set():
            statuses.extend(broker.request("GET", "/token")[0] for broker in brokers)
            time.sleep(0.1)

    reader = threading.Thread(target=keep_reading, daemon=True)
    reader.start()
    try:
        assert wait_until(lambda: all(broker.metric(FETCHES, **{"for": "alone"}) >= 2 for broker in brokers), timeout=3 * CYCLE)
        elapsed = time.time() - killed_at
        assert wait_until(lambda: issuer.requests() - before == total(brokers, FETCHES, **{"for": "alone"}), timeout=5), \
            "every fetch since Redis died is a broker's own"
        alone = [broker.metric(FETCHES, **{"for": "alone"}) for broker in brokers]
        assert max(alone) <= elapsed / (0.75 * LIFETIME) + 2, (alone, elapsed)  # about one per broker per cycle
        for broker in brokers:
            assert len(lines(broker, "token store out of reach; fetching alone until it answers")) == 1, broker.stderr()
            status, ready = readyz(broker)
            assert status == 200 and ready["store"]["type"] == "redis" and ready["store"]["degraded"] is True, ready
            assert ready["store"]["problem"], ready
            assert broker.metric("token_broker_store_reachable") == 0
            assert broker.metric("token_broker_store_seconds_since_reachable") > 0
    finally:
        stop.set()
        reader.join(5)
        redis.start()
        back_at = time.time()
    assert statuses and set(statuses) == {200}, f"/token answered {sorted(set(statuses))} while Redis was down"
    # Tokens fetched alone left each broker on its own schedule: within two refreshes the fleet
    # shares one record again, and then makes one fetch per refresh.
    current = refreshed(brokers, 0, timeout=3 * CYCLE)["version"]
    rejoined = issuer.requests()
    for _ in range(3):
        current = refreshed(brokers, current)["version"]
    # One fetch per refresh for the four (at most one more, from the race that
    # test_a_broker_that_read_the_old_record_just_before_another_stored_a_new_one_does_not_fetch_again shows).
    assert issuer.requests() - rejoined <= 4, f"3 refreshes after the rejoin:\n{fetched_lines(brokers)}"
    # Every broker says it rejoined (Redis has answered them all for several refreshes by now). Fails
    # now and then with this build: see test_a_broker_taking_the_fleets_records_again_once_redis_answers_…
    print(f"\nRedis back: 'token store reachable' logged by {sum(bool(lines(b, 'token store reachable')) for b in brokers)} "
          f"of 4 brokers after {time.time() - back_at:.1f} s")
    assert all(lines(broker, "token store reachable") for broker in brokers), \
        f"not every broker rejoined:\n{fetched_lines(brokers, '')}"
    assert all(readyz(broker)[1]["store"] == {"type": "redis", "degraded": False} for broker in brokers), \
        [readyz(broker)[1]["store"] for broker in brokers]
    assert all(broker.metric("token_broker_store_reachable") == 1 for broker in brokers)


def test_a_broker_taking_the_fleets_records_again_once_redis_answers_reports_the_store_reachable(issuer, redis, fleet):
    """README: a broker out of reach "tries Redis again at most once a second, and rejoins when it
    answers (`token store reachable`)". Redis is stopped (SIGSTOP) until every broker has fetched
    alone, then resumed: the first broker due fetches for the fleet and the others take its record
    from the channel, so Redis answers all of them. Two seconds later none may still say degraded.

    A bug this test found: only the command connection marked the store reachable, and a
    broker calls it only for its own refresh; one that gets the fleet's records through its
    subscriber (whose connection outlived the stop) never refreshes first, so it stays "degraded"
    in /readyz, at token_broker_store_reachable 0, without logging "token store reachable".
    (Fixed: the subscriber marks the store reachable when Redis answers it, and pings it once a
    second while the store is out of reach.)"""
    brokers = fleet(4)
    refreshed(brokers, token(brokers[0])["version"])
    redis.process.send_signal(signal.SIGSTOP)
    try:
        assert wait_until(lambda: all(readyz(broker)[1]["store"]["degraded"] for broker in brokers), timeout=2 * CYCLE)
    finally:
        redis.process.send_signal(signal.SIGCONT)
    received = [broker.metric(OPS, operation="record", result="from_fleet") for broker in brokers]
    # Redis answers: one broker fetches for the fleet, and every other takes the record from the channel.
    # The last broker to say degraded did so as its refresh gave up on Redis (500 ms), with its fetch
    # alone still to come: its 4-second token may have run out meanwhile (503 for a moment), so
    # only what the others serve is newest yet.
    newest = max((document["version"] for document in served(brokers) if document), default=0)
    refreshed(brokers, newest, timeout=2 * CYCLE)
    time.sleep(2)
    took = [broker.metric(OPS, operation="record", result="from_fleet") - count for broker, count in zip(brokers, received)]
    assert sum(count > 0 for count in took) >= 3, f"the others took the fleet's record from Redis: {took}"
    stores = [readyz(broker)[1]["store"] for broker in brokers]
    print(f"\nRedis resumed; records taken from the fleet since {took}; 2 s later /readyz says {stores}")
    assert all(store == {"type": "redis", "degraded": False} for store in stores), \
        f"brokers taking the fleet's records from Redis still say it is out of reach: {stores}\n{fetched_lines(brokers, '')}"
    assert all(lines(broker, "token store reachable") for broker in brokers)


def test_with_redis_stopped_token_answers_at_once_on_every_broker_as_it_fetches_alone(issuer, redis, fleet):
    """With Redis stopped (SIGSTOP), each refresh first waits for its call to Redis to fail, then
    fetches alone: refresh at 3.0–3.4 s of the 4-second token, plus `timeoutMsec`, plus the fetch.
    At the default 500 ms that left 100–500 ms, less the fetch, before the token ran out, and a
    stall of the shared CI machine turned it into a 503; at 150 ms it leaves 450–850 ms. /token
    must still answer 200 on every poll, at once, from every broker, with new versions fetched
    alone, and /readyz must say degraded."""
    brokers = fleet(4, timeoutMsec=150)
    refreshed(brokers, 0, timeout=5)

    def timed(rounds, pause):
        took, versions = [], {}
        for _ in range(rounds):
            for broker in brokers:
                started = time.monotonic()
                status, _, body = broker.request("GET", "/token", timeout=10)
                took.append(time.monotonic() - started)
                assert status == 200, (status, body)
                document = json.loads(body)
                SEEN.add(document["access_token"])
                versions.setdefault(broker.log_path, set()).add(document["version"])
            time.sleep(pause)
        return took, versions

    running, _ = timed(50, 0)
    redis.process.send_signal(signal.SIGSTOP)
    try:
        stopped, versions = timed(50, (LIFETIME + 1) / 50)  # across a refresh point
        degraded = [readyz(broker) for broker in brokers]
    finally:
        redis.process.send_signal(signal.SIGCONT)

    def describe(took):
        return f"median {statistics.median(took) * 1000:.2f} ms, max {max(took) * 1000:.2f} ms"

    print(f"\n/token, 200 requests on 4 brokers, Redis running: {describe(running)}"
          f"\n/token, 200 requests on 4 brokers, Redis stopped:  {describe(stopped)}")
    assert max(stopped) < 1.0, describe(stopped)
    assert all(len(seen) >= 2 for seen in versions.values()), f"each broker refreshed while Redis was stopped: {versions}"
    assert all(status == 200 and ready["store"]["degraded"] is True for status, ready in degraded), degraded
    assert all(broker.metric(FETCHES, **{"for": "alone"}) >= 1 for broker in brokers)
    refreshed(brokers, 0, timeout=3 * CYCLE)  # and, Redis resumed, the fleet shares one record again


# A template's children across the fleet

@pytest.fixture(scope="module")
def slow_issuer(tmp_path_factory):
    """The OAuth server with 300 s tokens: no refresh comes unless a test forces one."""
    server = OAuthServer(str(tmp_path_factory.mktemp("fleet-slow")), {"fleet": SECRET}, lifetime=300)
    yield server
    server.close()


@pytest.mark.parametrize("made_again", ["dropped", "reloaded"])
def test_a_template_child_made_again_serves_each_fleet_token_under_the_fleet_s_version(slow_issuer, redis, key, made_again):
    """Broker 1's child for aud-y runs five versions ahead of aud-x's (forced refreshes). Its children are then made anew: dropped after childIdleSec (60 s, the least
    allowed) while broker 2 keeps reading aud-x, or replaced by a reload that changes the
    template. Its new aud-x child numbers its tokens after aud-y's versions, above the fleet's
    for aud-x. It serves the record it reads at start under the record's own version, as
    broker 2 does. Broker 2 then forces a refresh of aud-x. Once both brokers serve one token
    again, that token must carry one version on both. And a client whose token broker 2 serves
    was refused must not get that same token back from broker 1's retrier. Before the fix,
    broker 1 served broker 2's forced token under a number of its own (aud-y's plus one), and
    answered a retry naming broker 2's number with that very token."""
    template = {"name": "default", "perRequest": ["audience"], "allowedAudiences": ["aud-*"], "childIdleSec": 60,
                "forcedRefreshMaxAttempts": 20, "maxErrorTokenRefreshDelayMsec": 500,
                "source": {"type": "oauth2", "tokenURL": slow_issuer.base + "/o/token/", "clientID": "fleet",
                           "clientSecret": SECRET, "scope": "api", "timeoutMsec": 1500, "connectTimeoutMsec": 500}}
    # Redis calls may take 2 s: one that a stall of the shared machine holds past the default 500 ms
    # makes its broker fetch alone, and the other broker would not find its record.
    config = {"providers": [template], "store": {"type": "redis", "address": "unix:" + redis.socket, "keyFile": key[1],
                                                 "timeoutMsec": 2000}}
    one, two = FleetBroker(config), FleetBroker(config)
    served, history = {}, ([], [])  # {access token: {broker: versions}}; each broker's aud-x versions in turn

    def child(index, audience="aud-x"):
        document, _ = (one, two)[index].get_json(f"/providers/default/token?audience={audience}")
        SEEN.add(document["access_token"])
        if audience == "aud-x":
            served.setdefault(document["access_token"], {}).setdefault(index, set()).add(document["version"])
            history[index].append(document["version"])
        return document

    def refresh(index, rejected, audience="aud-x"):
        status, _, body = (one, two)[index].request(
            "POST", f"/providers/default/token/refresh?audience={audience}",
            body=json.dumps({"rejected_version": rejected}).encode())
        assert status == 200, (status, body)
        document = json.loads(body)
        SEEN.add(document["access_token"])
        return document

    try:
        first = child(0)
        assert (child(1)["access_token"], history[1]) == (first["access_token"], [first["version"]]), \
            "broker 2 serves broker 1's record"
        ahead = child(0, "aud-y")
        for _ in range(5):
            ahead = refresh(0, ahead["version"], "aud-y")
        assert ahead["version"] >= first["version"] + 5, (first, ahead)

        if made_again == "dropped":
            def dropped():
                child(1)  # broker 2 keeps its child
                return one.metric("token_broker_template_children_dropped_total", provider="default") == 2

            assert wait_until(dropped, timeout=150, interval=1), one.stderr()
        else:
            rewrite(one, {**config, "providers": [{**template, "maxChildren": 99}]})
            status, _, body = one.request("POST", "/reload", listener="admin", timeout=60)
            assert status == 200, (status, body)

        again = child(0)
        assert (again["access_token"], again["version"]) == (first["access_token"], first["version"]), \
            "broker 1's new child serves the stored record under its own version"

        forced = refresh(1, again["version"])
        assert forced["access_token"] != again["access_token"]

        def agreed():
            tokens = [child(0)["access_token"], child(1)["access_token"]]
            return tokens[0] == tokens[1] != again["access_token"]

        def by_fingerprint():
            return {fingerprint(token): versions for token, versions in served.items()}

        assert wait_until(agreed, timeout=30, interval=0.1), (by_fingerprint(), fetched_lines([one, two]))
        split = {token: versions for token, versions in by_fingerprint().items() if len(set().union(*versions.values())) > 1}
        assert not split, f"one token under several versions (by broker): {split}"

        current = child(1)
        answer = refresh(0, current["version"])
        assert fingerprint(answer["access_token"]) != fingerprint(current["access_token"]), \
            f"broker 1 answered a retry refusing version {current['version']} with that very token"
        assert answer["version"] > current["version"], (current, answer)
        assert wait_until(lambda: child(1)["access_token"] == answer["access_token"], timeout=10)
        assert child(1)["version"] == answer["version"]
        assert all(versions == sorted(versions) for versions in history), history
    finally:
        one.stop()
        two.stop()


# A broker with another key

@pytest.mark.parametrize("fence", ["-1000000", "999999999999999"])
def test_a_fence_counter_out_of_range_is_redis_refusing_the_broker_fetches_alone_and_says_so(redis, key, tmp_key, fence):
    """A fence counter set by hand outside what the broker hands out (a version has at most 15
    digits, as /token/refresh and /token/ready read it) is Redis refusing: the broker fetches alone,
    here with a local signer, from version 1, logs it once and reads as degraded in /readyz; once
    the counter is deleted, a forced refresh takes the lease again and the store is reachable."""
    fence_key = "token-broker:fence:" + HASH
    redis.command("SET", fence_key, fence)
    config = {"providers": [{"name": "default", "source": {"type": "jwt", "keyFile": tmp_key("ec"), "lifetimeSec": 300}}],
              "store": {"type": "redis", "address": "unix:" + redis.socket, "keyFile": key[1]}}
    with Broker(config) as broker:
        assert wait_until(lambda: broker.request("GET", "/token")[0] == 200, timeout=30), broker.stderr()
        first = token(broker)
        assert first["version"] == 1, first
        status, ready = readyz(broker)
        assert status == 200 and ready["store"]["degraded"] is True, ready
        assert f"the fence counter {fence_key} is outside" in ready["store"]["problem"], ready
        refused = lines(broker, "token store out of reach; fetching alone until it answers")
        assert len(refused) == 1 and fence_key in refused[0], broker.stderr()
        assert redis.command("GET", fence_key) == fence.encode(), "the counter is left as it was"
        assert redis.command("GET", f"token-broker:record:{HASH}") is None, "nothing stored for the fleet"

        redis.command("DEL", fence_key)
        status, _, body = broker.request("POST", "/token/refresh", body=json.dumps({"rejected_version": 1}).encode(),
                                         headers={"Content-Type": "application/json"})
        assert status == 200 and json.loads(body)["version"] == 2, (status, body)
        SEEN.add(json.loads(body)["access_token"])
        assert wait_until(lambda: readyz(broker)[1]["store"] == {"type": "redis", "degraded": False}, timeout=20), \
            readyz(broker)
        assert redis.command("GET", fence_key) == b"1"
        assert lines(broker, "token store reachable"), broker.stderr()


def test_a_broker_with_another_key_file_fetches_for_itself_and_no_broker_serves_a_token_it_cannot_authenticate(
        issuer, fleet, tmp_path):
    good = fleet(3)
    fleet_token = refreshed(good, 0, timeout=5)["access_token"]
    write_key(tmp_path / "other.key")
    odd = fleet(1, key_file=str(tmp_path / "other.key"))[0]
    refused = lines(odd, "stored record refused; fetching")
    assert len(refused) == 1 and "level=warn" in refused[0] and "does not authenticate" in refused[0], odd.stderr()
    assert token(odd)["access_token"] != fleet_token
    seen = {broker.log_path: set() for broker in good + [odd]}
    before, deadline = issuer.requests(), time.monotonic() + 3 * LIFETIME
    while time.monotonic() < deadline:
        for broker in good + [odd]:
            seen[broker.log_path].add(token(broker)["access_token"])
        time.sleep(0.05)
    odd_tokens = seen[odd.log_path]
    good_tokens = set().union(*(seen[broker.log_path] for broker in good))
    assert not odd_tokens & good_tokens, "a token was served on both sides of the key"
    assert len(good_tokens) >= 3 and len(odd_tokens) >= 3, (len(good_tokens), len(odd_tokens))
    refreshed(good, 0, timeout=5)  # the good brokers serve one token
    odd_fetched, good_fetched = set(fingerprints(odd)), [found for broker in good for found in fingerprints(broker)]
    assert {fingerprint(seen) for seen in odd_tokens} <= odd_fetched, "the odd broker served a token it did not fetch"
    assert {fingerprint(seen) for seen in good_tokens} <= set(good_fetched), "a good broker served a token none of them fetched"
    assert not lines(odd, "token from the fleet") and odd.metric(OPS, operation="record", result="from_fleet") == 0
    assert all(sha256(seen) in issuer.issued() for seen in odd_tokens | good_tokens)
    assert len(lines(odd, "stored record refused; fetching")) == 1, "the refusal is logged once"
    # The good brokers still make one fetch per refresh among them: one per token they served (at
    # most one more, from the race shown below); the odd one adds its own.
    assert len(good_fetched) <= len(good_tokens | {fleet_token}) + 1, fetched_lines(good)
    assert issuer.requests() - before <= 2 * (3 / 0.75 + 1) + 1


def test_a_record_holding_a_token_this_broker_would_refuse_is_fetched_past_and_replaced(issuer, redis, key, fleet):
    """A record sealed with the fleet's key and settings whose token breaks this broker's rules
    (`x;Domain=…` where `setTokenCookie` is on: another broker with it off, or of an older version,
    may store one). A forced refresh finds it newer than the token held; the broker does not serve
    it (before, its `Set-Cookie` ended early and gained a `Domain`), takes the lease, fetches, and
    replaces it."""
    broker = fleet(1, provider={"setTokenCookie": True})[0]
    current = token(broker)
    record = redis.command("GET", f"token-broker:record:{HASH}")
    document = json.loads(AESGCM(key[0]).decrypt(record[16:28], record[28:], record[:16] + b"default"))
    forged, version, now_ms = "forged;Domain=evil.example", current["version"] + 5, int(time.time() * 1000)
    SEEN.add(forged)
    document.update(access_token=forged, issued_at_ms=now_ms - 1000, expires_at_ms=now_ms + 60_000)
    header, nonce = b"TBSTORE1" + version.to_bytes(8, "big"), os.urandom(12)
    sealed = header + nonce + AESGCM(key[0]).encrypt(nonce, json.dumps(document).encode(), header + b"default")
    name = f"token-broker:record:{HASH}".encode()
    with redis.connect() as connection:  # SET with a binary value (`RedisServer.command` sends text)
        connection.sendall(b"*5\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n$2\r\nPX\r\n$5\r\n60000\r\n"
                           % (len(name), name, len(sealed), sealed))
        assert read_reply(connection.makefile("rb")) == "OK"
    status, _, body = broker.request(
        "POST", "/token/refresh", body=json.dumps({"rejected_version": current["version"]}).encode())
    assert status == 200, body
    answer = json.loads(body)
    SEEN.add(answer["access_token"])
    assert answer["access_token"] != forged and sha256(answer["access_token"]) in issuer.issued()
    assert answer["version"] > version and "evil" not in answer["set_cookie"]
    refused = lines(broker, "token from the fleet refused; fetching")
    assert len(refused) == 1 and "level=warn" in refused[0], broker.stderr()
    assert f"version={version} " in refused[0] and fingerprint(forged) in refused[0], refused[0]
    assert "a cookie value cannot" in refused[0], refused[0]
    assert broker.metric(OPS, operation="record", result="refused") == 1
    assert not lines(broker, "token from the fleet")
    stored = redis.command("GET", f"token-broker:record:{HASH}")
    assert json.loads(AESGCM(key[0]).decrypt(stored[16:28], stored[28:], stored[:16] + b"default"))["access_token"] \
        == answer["access_token"], "the refused record is replaced"


# What Redis holds

def test_redis_holds_no_token_and_no_secret_in_clear_in_its_values_or_its_traffic(issuer, redis, key, fleet):
    monitor = Capture(redis, "MONITOR")
    channel = Capture(redis, "SUBSCRIBE", "token-broker:records")
    brokers = fleet(3)
    first = token(brokers[0])["version"]
    fresh = refreshed(brokers, first)
    traffic, published = monitor.stop(), channel.stop()
    tokens = {token(broker)["access_token"] for broker in brokers} | {fresh["access_token"]}
    keys = sorted(name.decode() for name in redis.command("KEYS", "token-broker:*"))
    assert f"token-broker:record:{HASH}" in keys and f"token-broker:fence:{HASH}" in keys, keys
    values = {name: redis.command("GET", name) for name in keys}
    assert b'"EVAL"' in traffic and f"record:{HASH}".encode() in traffic, "MONITOR saw the brokers' commands"
    assert HASH.encode() in published, "a record was published"
    secrets_ = [*tokens, *(seen for seen in SEEN if len(seen) > 20), SECRET, key[0].hex()]
    for where, data in [*values.items(), ("MONITOR", traffic), ("the channel", published)]:
        for secret in secrets_:
            assert secret.encode() not in data, f"{where} holds a secret in clear: {secret[:8]}…"
        assert key[0] not in data
    record = values[f"token-broker:record:{HASH}"]
    assert record[:8] == b"TBSTORE1" and int.from_bytes(record[8:16], "big") == fresh["version"]
    document = json.loads(AESGCM(key[0]).decrypt(record[16:28], record[28:], record[:16] + b"default"))
    assert document["access_token"] == fresh["access_token"], "the record sealed the token the fleet serves"
    assert 0 < redis.command("PTTL", f"token-broker:record:{HASH}") <= LIFETIME * 1000


def test_a_redis_answering_a_byte_at_a_time_is_given_up_at_the_timeout_and_the_broker_still_stops(issuer, redis, fleet):
    """Redis's replies come a byte every 50 ms once the link drips: hiredis's own timeout bounds
    each read, not a reply, so each call to Redis once lasted as long as its reply did (a record,
    274 bytes with its framing: some 14 s), every refresh of the broker waited behind it on the
    store's queue until the token expired, and SIGTERM waited for it too. Now each call ends at
    `timeoutMsec` (150 ms, three gaps; the shortest reply, 4 bytes, takes 200 ms): the store is out
    of reach, the broker refreshes alone, and it stops at once. (With the default 500 ms and a
    200 ms gap, the refresh at 3.0–3.4 s of the 4-second token, plus the call, left 100–500 ms
    for the fetch alone, and a stall of a busy machine let the token run out: a 503 here.)"""
    link = DrippingLink(redis, gap=0.05)
    try:
        [broker] = fleet(1, address=link.address, timeoutMsec=150)
        first = token(broker)["version"]
        before = issuer.requests()
        link.drip.set()
        assert wait_until(lambda: token(broker)["version"] > first, CYCLE), \
            f"no new token within {CYCLE} s of Redis dripping its replies:\n{fetched_lines([broker])}"
        assert issuer.requests() > before, "the refresh was the broker's own fetch"
        assert wait_until(lambda: readyz(broker)[1]["store"]["degraded"], CYCLE), readyz(broker)
        assert "did not answer within 150 ms" in readyz(broker)[1]["store"]["problem"], readyz(broker)
        assert broker.stop(timeout=15) == 0
    finally:
        link.stop()
