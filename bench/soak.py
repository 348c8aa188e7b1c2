#!/usr/bin/env python3
"""token-broker's soak run: ten minutes of mixed load, watching for leaks and server errors.

    make soak                         (builds, installs wrk, then runs this)
    python3 bench/soak.py [--minutes 10] [--out bench/results]

While it runs:
- wrk loads GET /token (2 threads, 32 connections);
- one POST /token/refresh a second replaces the token (the forced-refresh window is widened);
- 200 long-polls cycle on /token/ready?after=<version>, each woken by the next refresh.

Pass, as the hardening issue sets it: no 5xx anywhere; wrk saw only 2xx and no socket error; both
client threads (refreshes, long-polls) ran to the end; RSS growth under 5 % after the first
minute; a stable number of open file descriptors, and no more at the end than at the start; no
waiter left once the load stops. Writes soak.json and soak.md to --out. Everything runs on
127.0.0.1.
"""
import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from run import GUARD, Broker, http_get, http_post, rss_mib  # noqa: E402

LONG_POLLS = 200


def open_fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def metrics(broker):
    """The broker's own counters: {(name, labels): value}, from its admin listener."""
    import http.client
    host, port = broker.admin.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    connection.request("GET", "/metrics")
    text = connection.getresponse().read().decode()
    connection.close()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            samples[key] = float(value)
    return samples


async def long_polls(address, stop, outcome):
    """LONG_POLLS clients, each asking for the token after the one it last saw, until `stop`."""
    host, port = address.rsplit(":", 1)

    async def one():
        version = 0
        while not stop.is_set():
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(f"GET /token/ready?after={version}&timeout=5 HTTP/1.1\r\nHost: soak\r\n{GUARD}\r\nConnection: close\r\n\r\n".encode())
            await writer.drain()
            answer = await asyncio.wait_for(reader.read(), 30)
            writer.close()
            status = int(answer.split(b" ", 2)[1])
            outcome[status] = outcome.get(status, 0) + 1
            if status == 200:
                version = json.loads(answer.split(b"\r\n\r\n", 1)[1])["version"]

    await asyncio.gather(*(one() for _ in range(LONG_POLLS)))


def recording(errors, name, target, *args):
    """A thread's body that records the exception it dies of, so that a dead client fails the run."""
    def run():
        try:
            target(*args)
        except BaseException as error:  # noqa: B902 - any death of a client thread is a failure
            errors.append(f"{name}: {error!r}")
    return run


def refresher(broker, stop, outcome):
    while not stop.wait(1.0):
        _, body = http_get(broker.token, "/token")
        status, _ = http_post(broker.token, "/token/refresh", json.dumps({"rejected_version": json.loads(body)["version"]}).encode())
        outcome[status] = outcome.get(status, 0) + 1


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    options = parser.parse_args()
    seconds = int(options.minutes * 60)

    broker = Broker({"providers": [{"forcedRefreshMaxAttempts": 100, "forcedRefreshWindowSec": 30}]})
    fds_start = open_fds(broker.pid)
    stop = threading.Event()
    polls, refreshes, client_errors = {}, {}, []
    poller = threading.Thread(target=recording(client_errors, "long-polls", lambda: asyncio.run(long_polls(broker.token, stop, polls))))
    refreshing = threading.Thread(target=recording(client_errors, "refresher", refresher, broker, stop, refreshes))
    poller.start()
    refreshing.start()
    load = subprocess.Popen(["wrk", "-t2", "-c32", f"-d{seconds}s", "-H", GUARD, f"http://{broker.token}/token"],
                            stdout=subprocess.PIPE, text=True)
    samples = []
    started = time.monotonic()
    while load.poll() is None and time.monotonic() - started < seconds + 60:
        samples.append({"t": round(time.monotonic() - started, 1), "rss_mib": round(rss_mib(broker.pid), 2), "fds": open_fds(broker.pid)})
        time.sleep(5)
    wrk_output = load.communicate(timeout=60)[0]
    stop.set()
    poller.join(60)
    refreshing.join(60)
    client_errors += [f"{name}: still running 60 s after the load stopped" for name, thread in
                      (("long-polls", poller), ("refresher", refreshing)) if thread.is_alive()]
    # Let the last connections close (at most 10 s): a descriptor still open after that is kept.
    settle = time.monotonic() + 10
    while open_fds(broker.pid) > fds_start and time.monotonic() < settle:
        time.sleep(0.2)
    final = {"rss_mib": rss_mib(broker.pid), "fds": open_fds(broker.pid)}
    after = metrics(broker)  # after counting descriptors: this request's own connection is one
    broker.stop()

    server_errors = sum(value for key, value in after.items() if key.startswith("token_broker_http_requests_total") and 'code="5' in key)
    non_2xx = wrk_output.split("Non-2xx or 3xx responses:")[1].split()[0] if "Non-2xx" in wrk_output else "0"
    # "Socket errors: connect 0, read 0, write 0, timeout 0", printed only when there are some.
    socket_errors = {kind: int(count) for kind, count in re.findall(r"(connect|read|write|timeout) (\d+)", wrk_output.split("Socket errors:")[1].split("\n")[0])} \
        if "Socket errors:" in wrk_output else {}
    requests = int(wrk_output.split(" requests in ")[0].split()[-1])
    after_first_minute = next(sample for sample in samples if sample["t"] >= 60)
    peak_after = max(sample["rss_mib"] for sample in samples if sample["t"] >= 60)
    growth = (peak_after - after_first_minute["rss_mib"]) / after_first_minute["rss_mib"]
    fds_after_minute = [sample["fds"] for sample in samples if sample["t"] >= 60]
    waiters = sum(value for key, value in after.items() if key.startswith("token_broker_longpoll_waiters"))
    open_connections = after.get('token_broker_open_connections{listener="token"}', -1)
    results = {
        "minutes": options.minutes,
        "wrk_requests": requests, "wrk_non_2xx": int(non_2xx), "wrk_socket_errors": socket_errors,
        "client_errors": client_errors,
        "server_errors_5xx": int(server_errors),
        "long_polls": polls, "refreshes": refreshes,
        "rss_mib_after_first_minute": after_first_minute["rss_mib"], "rss_mib_peak_after_first_minute": peak_after,
        "rss_growth": round(growth, 4), "rss_mib_final": final["rss_mib"],
        "fds_after_first_minute_min_max": [min(fds_after_minute), max(fds_after_minute)], "fds_final": final["fds"], "fds_start": fds_start,
        "waiters_left": waiters, "open_connections_left": open_connections,
        "samples": samples,
    }
    checks = {
        "no 5xx": server_errors == 0 and all(status < 500 for status in list(polls) + list(refreshes)),
        "wrk saw only 2xx, and no socket error": int(non_2xx) == 0 and not any(socket_errors.values()),
        "both client threads ran to the end": not client_errors,
        "RSS growth under 5 % after the first minute": growth < 0.05,
        "stable descriptors (after the first minute, within the load's connections)": max(fds_after_minute) - min(fds_after_minute) <= LONG_POLLS + 64,
        "no more descriptors at the end than at the start": final["fds"] <= fds_start,
        "no waiter left": waiters == 0 and open_connections == 0,
    }
    results["checks"] = checks
    os.makedirs(options.out, exist_ok=True)
    with open(os.path.join(options.out, "soak.json"), "w") as handle:
        json.dump(results, handle, indent=2)
    lines = ["| measure | result |", "|---|---|",
             f"| duration | {options.minutes:g} min |",
             f"| GET /token under wrk -t2 -c32 | {requests:,} requests, {non_2xx} non-2xx, socket errors {socket_errors or 'none'} |",
             f"| client threads | {'; '.join(client_errors) or 'ran to the end'} |",
             f"| POST /token/refresh, one a second | {refreshes} (status: count) |",
             f"| long-polls ({LONG_POLLS} cycling) | {polls} (status: count) |",
             f"| 5xx answered (broker's counters) | {int(server_errors)} |",
             f"| RSS after 1 min → peak after 1 min → final | {after_first_minute['rss_mib']:.1f} → {peak_after:.1f} → {final['rss_mib']:.1f} MiB ({growth:+.1%}) |",
             f"| open descriptors at the start, after 1 min (min–max), final | {fds_start}, {min(fds_after_minute)}–{max(fds_after_minute)}, {final['fds']} |",
             f"| waiters and token connections left after the load | {int(waiters)}, {int(open_connections)} |"]
    lines += [f"| check: {name} | {'pass' if ok else 'FAIL'} |" for name, ok in checks.items()]
    with open(os.path.join(options.out, "soak.md"), "w") as handle:
        handle.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    sys.exit(0 if all(checks.values()) else 1)


if __name__ == "__main__":
    main()
