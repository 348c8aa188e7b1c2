"""A `redis` store whose Redis is slow, hostile or hard to find: the broker carries on alone.

README: "Redis down, slow or refusing: each broker carries on alone". Each test runs one broker
against the real OAuth server and a Redis that misbehaves in one way:
- a real redis-server behind a TCP link that holds each reply 300 ms (every reply well within
  `timeoutMsec`, but slower than twenty providers ask);
- a fake Redis (a small Python server) that answers with the 13-byte head of an array of
  2^31 - 1 elements;
- a real redis-server named by a host whose lookup takes 20 s (a preloaded getaddrinfo).
Each test fails with the broker before the fix: no token for tens of seconds (or minutes), and
a stop that waited for the call to Redis.
"""
import os
import re
import socket
import threading

import pytest

from broker import Broker
from issuers.process import OAuthServer
from test_fleet import Link, LoopbackServer, readyz, redis, write_key  # noqa: F401 (redis: the fixture, a redis-server per test)
from test_http_api import wait_until
from test_reload import preload_library

SECRET = "faults-client-secret-Qw7nB4"
LIFETIME = 300  # no refresh during a test: each provider's first token is what is watched


@pytest.fixture(scope="module")
def issuer(tmp_path_factory):
    server = OAuthServer(str(tmp_path_factory.mktemp("faults")), {"faults": SECRET}, lifetime=LIFETIME)
    yield server
    server.close()


@pytest.fixture
def key_file(tmp_path):
    path = tmp_path / "store.key"
    write_key(path)
    return str(path)


def configuration(issuer, key_file, address, names=("default",), **store):
    return {"providers": [{"name": name, "source": {
                "type": "oauth2", "tokenURL": issuer.base + "/o/token/", "clientID": "faults", "clientSecret": SECRET,
                "scope": "api"}} for name in names],
            "store": {"type": "redis", "address": address, "keyFile": key_file, **store}}


def served(broker, name="default"):
    return broker.request("GET", f"/providers/{name}/token")[0] == 200


def assert_nothing_secret_logged(broker):
    assert SECRET not in broker.stderr(), f"the broker's log ({broker.log_path}) holds the client secret"


class DelayedLink(Link):
    """Holds each chunk Redis sends for `delay` seconds before passing it on, one after the
    other: a Redis whose every reply comes well within the broker's `timeoutMsec`."""

    def __init__(self, redis, delay):
        self.delay = delay
        super().__init__(redis)

    def _pass(self, data, target, outbound):
        if not outbound and self.stopped.wait(self.delay):
            return
        target.sendall(data)


def test_a_redis_answering_each_call_in_time_but_slower_than_twenty_providers_ask_leaves_none_without_a_token(
        issuer, redis, key_file):
    """Each reply of Redis comes 300 ms late, within the default 500 ms `timeoutMsec`; twenty
    providers start at once, each reading its record, then fetching through the store (three
    calls). The calls waited for their turn without bound on the store's one connection: each
    fetch gave up at its 15 s deadline with its calls still queued, which then ran for nobody;
    in a review 40 providers had no token after 102 s, the issuer never called, and /readyz said
    the store was fine. Now each call counts its wait in its `timeoutMsec`: Redis is found slow,
    the store out of reach (logged), and each provider fetches alone."""
    link = DelayedLink(redis, 0.3)
    names = [f"p{index:02d}" for index in range(20)]
    before = issuer.requests()
    try:
        with Broker(configuration(issuer, key_file, link.address, names)) as broker:
            assert wait_until(lambda: all(served(broker, name) for name in names), timeout=30), \
                f"not every provider has a token 30 s after the start:\n{broker.stderr()[-3000:]}"
            assert issuer.requests() > before, "the providers fetched from the issuer"
            slow = [line for line in broker.stderr().splitlines() if 'msg="token store out of reach' in line]
            assert slow and "did not answer within 500 ms" in slow[0], broker.stderr()[-3000:]
            assert_nothing_secret_logged(broker)
            assert broker.stop(timeout=10) == 0
    finally:
        link.stop()


class HostileRedis(LoopbackServer):
    """A fake Redis on 127.0.0.1: `SUBSCRIBE` is confirmed and `PING` answered as Redis does;
    every other command gets `reply`, and nothing more."""

    def __init__(self, reply):
        self.reply, self.commands = reply, []
        super().__init__()

    def _accepted(self, client):
        threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client):
        client.settimeout(0.2)
        stream, buffered = b"", []
        try:
            while not self.stopped.is_set():
                try:
                    chunk = client.recv(65536)
                except socket.timeout:
                    continue
                if not chunk:
                    return
                stream += chunk
                while (parsed := self._command(stream)) is not None:
                    words, stream = parsed
                    self.commands.append(words[0].upper())
                    if words[0].upper() == b"SUBSCRIBE":
                        client.sendall(b"*3\r\n$9\r\nsubscribe\r\n$%d\r\n%s\r\n:1\r\n" % (len(words[1]), words[1]))
                    elif words[0].upper() == b"PING":
                        client.sendall(b"+PONG\r\n")
                    else:
                        client.sendall(self.reply)
        except OSError:
            pass
        finally:
            client.close()

    @staticmethod
    def _command(stream):
        """(the words of the first whole command in `stream`, what follows it), or None."""
        match = re.match(rb"\*(\d+)\r\n", stream)
        if not match:
            return None
        words, position = [], match.end()
        for _ in range(int(match.group(1))):
            header = re.match(rb"\$(\d+)\r\n", stream[position:])
            if not header or len(stream) < position + header.end() + int(header.group(1)) + 2:
                return None
            start = position + header.end()
            words.append(stream[start:start + int(header.group(1))])
            position = start + int(header.group(1)) + 2
        return words, stream[position:]


def test_a_redis_answering_the_head_of_an_array_of_two_billion_elements_is_refused_at_once_and_the_broker_fetches_alone(
        issuer, key_file):
    """hiredis 0.14 makes an array's table of elements when it reads the array's head: the 13
    bytes `*2147483647\\r\\n` cost 16 GB of address space, and freeing the reply at the call's
    timeout walked 2^31 pointers, some 16 s of CPU a call. In a review, /token still answered 503
    after 61 s with a healthy issuer, and a stop took 6-7.5 s. Now the reader refuses any reply
    no command of the store's gets back at its head: the store is out of reach, the broker
    fetches alone, and its stop waits for nothing."""
    fake = HostileRedis(b"*2147483647\r\n")
    before = issuer.requests()
    try:
        with Broker(configuration(issuer, key_file, fake.address)) as broker:
            assert wait_until(lambda: served(broker), timeout=20), \
                f"no token 20 s after the start:\n{broker.stderr()[-3000:]}"
            assert issuer.requests() > before, "the token was fetched from the issuer"
            assert b"GETRANGE" in fake.commands, "the broker asked the fake Redis for its record"
            assert wait_until(lambda: readyz(broker)[1]["store"]["degraded"], timeout=10), readyz(broker)
            assert "Redis sent an array of more than 3 elements" in broker.stderr(), broker.stderr()[-3000:]
            assert_nothing_secret_logged(broker)
            # README: a stop waits for the call under way at most (500 ms), and the subscriber.
            assert broker.stop(timeout=5) == 0
    finally:
        fake.stop()


def slow_dns_environment(library, name, seconds):
    environment = {"LD_PRELOAD": library, "SLOW_DNS_NAME": name, "SLOW_DNS_SECONDS": str(seconds)}
    if os.environ.get("ASAN_OPTIONS") is not None:
        # AddressSanitizer's runtime wants to come first among the preloaded libraries.
        environment["ASAN_OPTIONS"] = os.environ["ASAN_OPTIONS"] + ":verify_asan_link_order=0"
    return environment


def test_a_redis_host_whose_name_takes_twenty_seconds_to_look_up_holds_up_neither_the_first_token_nor_the_stop(
        issuer, redis, key_file, tmp_path):
    """glibc's getaddrinfo has no time limit, and hiredis called it inside each connection: a
    DNS server that does not answer held the first call (and each reconnection) for as long as
    the lookup took, past `timeoutMsec`. In a review, with a 10 s lookup, the first token came
    at 21 s and a stop took 7 s. Now the name is looked up within each call's `timeoutMsec`, and
    a lookup still under way is waited for by the next attempts, never started again alongside:
    the broker fetches alone at once, says why, and stops at once."""
    link = Link(redis)
    port = link.address.rsplit(":", 1)[1]
    environment = slow_dns_environment(preload_library(tmp_path, "slow_dns"), "redis.slowdns.test", 20)
    before = issuer.requests()
    try:
        with Broker(configuration(issuer, key_file, f"redis.slowdns.test:{port}"), env=environment) as broker:
            # The lookup ends 20 s after the start.
            assert wait_until(lambda: served(broker), timeout=10), \
                f"no token 10 s after the start:\n{broker.stderr()[-3000:]}"
            assert issuer.requests() > before, "the token was fetched from the issuer"
            store = readyz(broker)[1]["store"]
            assert store["degraded"] and "looking up redis.slowdns.test took longer than 500 ms" in store["problem"], store
            assert_nothing_secret_logged(broker)
            assert broker.stop(timeout=5) == 0
    finally:
        link.stop()
