"""A `redis` store whose keys another writer has set: a lease, a fence counter, a key of another type.

README: "a lease holds up the fleet for leaseMsec at most", "a fence counter out of range (… or
something that is not a whole number) is Redis refusing: each broker fetches that provider's
tokens alone … and says so (with the counter's key, and /readyz's degraded until a lease is taken
again)". Each test starts its own redis-server on a Unix socket (test_fleet.py's fixture) and
brokers against the real OAuth server, sets one key by hand, and reads what the brokers serve,
log and report. With the broker before the fix:
- a lease set by hand (`SET … PX 600000`) stopped /token once the token ran out (the broker waited
  on the lease until each fetch was given up, "the source did not finish"), and /readyz said nothing;
- a fence counter of `1e5`, or a key of another type (`RPUSH`), made the store out of reach and
  reachable again at every fetch, named the lease script's SHA, and dropped the connection.
"""
import json
import time

import pytest

from issuers.process import OAuthServer
from test_fleet import FETCHES, SEEN, FleetBroker, key, lines, nothing_secret_is_logged, readyz, redis  # noqa: F401 (fixtures)
from test_http_api import wait_until

SECRET = "keys-client-secret-Hn5vX3"
LIFETIME = 10  # a refresh every 7.5-8.5 s, leaving 1.5-2.5 s of the token
CYCLE = LIFETIME + 10  # the longest wait for one refresh, generous
PROVIDER_HASH = "37a8eec1ce19687d132fe29051dca629d164e2c4958ba141d5f4133a33f0688f"  # sha256("default")
RECORD, LEASE, FENCE = (f"token-broker:{kind}:{PROVIDER_HASH}" for kind in ("record", "lease", "fence"))
OUT_OF_REACH = "token store out of reach; fetching alone until it answers"
HELD_UP = "a lease the broker did not take holds up the fleet; fetching alone"


@pytest.fixture(scope="module")
def issuer(tmp_path_factory):
    server = OAuthServer(str(tmp_path_factory.mktemp("keys")), {"keys": SECRET}, lifetime=LIFETIME)
    yield server
    server.close()


@pytest.fixture
def brokers(issuer, redis, key):
    """brokers(count, **store settings): `count` brokers of one fleet, each started once the one
    before has its token; all stopped at the end."""
    started = []
    SEEN.add(SECRET)

    def start(count, **store):
        config = {"providers": [{"name": "default", "maxErrorTokenRefreshDelayMsec": 500, "source": {
                      "type": "oauth2", "tokenURL": issuer.base + "/o/token/", "clientID": "keys", "clientSecret": SECRET,
                      "scope": "api", "timeoutMsec": 1500, "connectTimeoutMsec": 500}}],
                  "store": {"type": "redis", "address": "unix:" + redis.socket, "keyFile": key[1], **store}}
        for _ in range(count):
            started.append(FleetBroker(config))
        return started[-count:]

    yield start
    for broker in started:
        broker.stop()


def served(broker):
    """/token's status, and the document when it is 200."""
    status, _, body = broker.request("GET", "/token")
    document = json.loads(body) if status == 200 else None
    if document:
        SEEN.add(document["access_token"])
    return status, document


def command_connections(redis):
    """The ids of the connections whose last command was one of a broker's calls (not a
    subscriber's, nor the test's own), from CLIENT LIST."""
    listed = redis.command("CLIENT", "LIST").decode().splitlines()
    fields = [dict(field.split("=", 1) for field in line.split(" ") if "=" in field) for line in listed]
    return sorted(field["id"] for field in fields if field.get("cmd") in ("eval", "getrange", "pttl", "ping"))


def force(broker):
    """A forced refresh of the version the broker serves: the new document."""
    _, current = served(broker)
    status, _, body = broker.request("POST", "/token/refresh", body=json.dumps({"rejected_version": current["version"]}).encode(),
                                     headers={"Content-Type": "application/json"})
    assert status == 200, (status, body)
    fresh = json.loads(body)
    SEEN.add(fresh["access_token"])
    assert fresh["version"] > current["version"], (current, fresh)
    return fresh


# A lease set by hand

def test_a_lease_set_by_hand_for_ten_minutes_never_stops_the_token_and_reads_as_degraded_until_it_is_gone(issuer, redis, brokers):
    """The review's case: `SET P lease:H someone-else PX 600000` (the longest lease a broker may
    take) while a broker with the default leaseMsec (10 s) serves 10-second tokens. The broker must
    not let its token expire for that lease: across two refreshes /token answers 200 on every
    poll, with tokens it fetched alone (the lease is left as it is); /readyz says degraded, naming
    the lease's key and not its holder, while the store counts as reachable; the log says so once.
    Once the lease is deleted, the next refresh takes the lease for the fleet again, and the broker
    says the lease has ended. Before the fix: 503 from the token's expiry on, and "the source did
    not finish within 6500 ms" though the source was never called."""
    broker = brokers(1)[0]
    assert wait_until(lambda: served(broker)[0] == 200, timeout=CYCLE), broker.stderr()
    assert redis.command("SET", LEASE, "someone-else", "PX", "600000") == "OK"
    statuses, versions = [], set()

    def polled():
        status, document = served(broker)
        statuses.append(status)
        if document:
            versions.add(document["version"])
        return broker.metric(FETCHES, **{"for": "alone"}) >= 2

    assert wait_until(polled, timeout=3 * CYCLE, interval=0.1), (statuses[-20:], broker.stderr())
    assert set(statuses) == {200}, f"/token answered {sorted(set(statuses))} while the lease was held:\n{broker.stderr()}"
    assert len(versions) >= 2, versions
    status, ready = readyz(broker)
    problem = ready["store"].get("problem", "")
    assert status == 200 and ready["store"]["degraded"] is True and LEASE in problem and "outlives" in problem, ready
    assert "someone-else" not in problem
    assert broker.metric("token_broker_store_reachable") == 1, "Redis answers: the store is not out of reach"
    held = lines(broker, HELD_UP)
    assert len(held) == 1 and "provider=default" in held[0] and LEASE in held[0], broker.stderr()
    assert not lines(broker, "token fetch failed") and not lines(broker, OUT_OF_REACH), broker.stderr()
    assert redis.command("GET", LEASE) == b"someone-else", "the lease is left as it is"

    for_fleet = broker.metric(FETCHES, **{"for": "fleet"})
    assert redis.command("DEL", LEASE) == 1
    assert wait_until(lambda: readyz(broker)[1]["store"] == {"type": "redis", "degraded": False}, timeout=2 * CYCLE), \
        readyz(broker)
    assert wait_until(lambda: broker.metric(FETCHES, **{"for": "fleet"}) > for_fleet, timeout=10), \
        "the lease is taken for the fleet again"
    assert len(lines(broker, "the lease that held up the fleet has ended")) == 1, broker.stderr()


def test_a_broker_without_a_token_waits_on_a_lease_set_by_hand_no_longer_than_its_own_lease_msec(issuer, redis, brokers):
    """A broker starting (no token yet) with leaseMsec 1000 while a lease set by hand has a minute
    left: it waits for that lease no longer than its own leaseMsec, then fetches alone, and says
    degraded. Before the fix it waited until each fetch was given up (6.5 s), again and again,
    until the lease ended, with no token meanwhile."""
    assert redis.command("SET", LEASE, "someone-else", "PX", "60000") == "OK"
    broker = brokers(1, leaseMsec=1000)[0]
    assert wait_until(lambda: served(broker)[0] == 200, timeout=30), broker.stderr()
    assert broker.metric(FETCHES, **{"for": "alone"}) == 1 and broker.metric(FETCHES, **{"for": "fleet"}) == 0
    assert redis.command("GET", LEASE) == b"someone-else", "the lease is left as it is"
    assert not lines(broker, "token fetch failed"), broker.stderr()
    status, ready = readyz(broker)
    assert status == 200 and ready["store"]["degraded"] is True and LEASE in ready["store"]["problem"], ready


# Keys of another type, and a counter INCR refuses

# The key made a list (in one step: a broker may write it meanwhile), or the counter set to 1e5.
LIST = "redis.call('DEL', KEYS[1]) return redis.call('RPUSH', KEYS[1], 'x')"


@pytest.mark.parametrize("command", [("EVAL", LIST, 1, RECORD), ("EVAL", LIST, 1, LEASE), ("EVAL", LIST, 1, FENCE),
                                     ("SET", FENCE, "1e5")], ids=["record-list", "lease-list", "fence-list", "fence-1e5"])
def test_a_key_redis_refuses_is_said_once_keeps_the_connection_and_the_tokens_flow(issuer, redis, brokers, command):
    """A key of another type than a string (`RPUSH` on the record, the lease or the fence of a
    running fleet), or a fence counter Lua reads as a number and INCR refuses (`1e5`): each broker
    fetches alone at each (forced) refresh, and serves the new token; it says so once in the log
    and in /readyz, naming that key (never the lease script's SHA), for every refresh; its
    connection to Redis is the one it had. Once the key is deleted, a refresh takes the lease
    again, and the broker says Redis is reachable. Before the fix, each refresh logged "out of
    reach" naming the script's SHA, then "reachable", /readyz did not stay degraded, and Redis
    closed a connection at each refresh."""
    fleet = brokers(2)
    assert wait_until(lambda: all(served(broker)[0] == 200 for broker in fleet), timeout=CYCLE)
    connections = command_connections(redis)
    assert len(connections) == 2, connections
    assert redis.command(*command) in ("OK", 1)
    key_name = command[-1] if command[0] == "EVAL" else command[1]
    for _ in range(3):
        for broker in fleet:
            force(broker)
        time.sleep(1.5)  # a broker out of reach probes Redis once a second: it would find it reachable
    for broker in fleet:
        assert broker.metric(FETCHES, **{"for": "alone"}) >= 3, broker.stderr()
        said = lines(broker, OUT_OF_REACH)
        assert len(said) == 1 and key_name in said[0] and "script" not in said[0], broker.stderr()
        assert not lines(broker, "token store reachable"), broker.stderr()
        status, ready = readyz(broker)
        assert status == 200 and ready["store"]["degraded"] is True and key_name in ready["store"]["problem"], ready
        assert served(broker)[0] == 200
    assert command_connections(redis) == connections, "a broker's connection to Redis was dropped"
    assert redis.command("TYPE", key_name) == ("list" if command[0] == "EVAL" else "string"), "the key is left as it is"

    assert redis.command("DEL", key_name) == 1
    force(fleet[0])
    assert wait_until(lambda: readyz(fleet[0])[1]["store"] == {"type": "redis", "degraded": False}, timeout=20), \
        readyz(fleet[0])
    assert lines(fleet[0], "token store reachable"), fleet[0].stderr()
