#!/usr/bin/env python3
"""Writes the broker's link order, Sources/token-broker/link-order.txt: the functions the broker
runs when it starts, while it idles and on its common requests, which the release link (lld's
--symbol-ordering-file, see Package.swift) places side by side at the start of the text.

    make link-order        # builds the release binary and the tracer, then runs this

Why: those functions are about 420 KB of a 5 MB text, and without an order they are spread over
nearly all of it. The kernel maps a file's pages up to 64 KB at a time around each first touch
(fault-around), so an idle broker kept about 4.3 MB of its text resident. Side by side they fill
a few hundred KB. A stale list costs nothing but that saving: names it lacks go where the linker
would put them anyway, names it has that no longer exist are ignored.

How: runs the release binary on its embedded default, on loopback ports, under trace.c (a
one-shot breakpoint on every function's entry), sends the requests below, then names each
function reached, in the order first reached. Bounded: every request has a timeout, the whole run
takes a few seconds.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))
from run import free_port, request  # noqa: E402
GUARD = {"Token-Broker-Request": "true"}


def http(address, method, path, headers=None, body=None, timeout=15):
    return request(address, method, path, headers, body, timeout)


def wait_for(port, deadline):
    while time.monotonic() < deadline:
        try:
            if http(f"127.0.0.1:{port}", "GET", "/healthz", timeout=2)[0] == 200:
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("the broker did not answer /healthz under the tracer")


def workload(token_port, admin_port):
    """The requests whose code should sit with the start-up code: what a running broker does."""
    token, admin = f"127.0.0.1:{token_port}", f"127.0.0.1:{admin_port}"
    for path in ("/healthz", "/readyz", "/metrics"):
        http(admin, "GET", path)
    _, body = http(token, "GET", "/token", GUARD)
    version = json.loads(body)["version"]
    http(token, "GET", "/token")  # refused by the guard
    http(token, "GET", "/no-such-route", GUARD)
    http(token, "DELETE", "/token", GUARD)
    http(token, "GET", "/.well-known/jwks.json")
    http(token, "GET", "/providers/default/token", GUARD)
    http(token, "GET", f"/token/ready?after={version - 1}", GUARD)
    http(token, "GET", f"/token/ready?after={version}&timeout=1", GUARD)  # 304 after a second
    woken = threading.Thread(target=http, args=(token, "GET", f"/token/ready?after={version}&timeout=10", GUARD))
    woken.start()
    time.sleep(0.5)
    http(token, "POST", "/token/refresh", {**GUARD, "Content-Type": "application/json"},
         json.dumps({"rejected_version": version}).encode())
    woken.join(15)
    http(token, "POST", "/token/refresh", GUARD, b"not json")
    http(token, "GET", "/token", GUARD)
    http(admin, "GET", "/metrics")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary", default=os.path.join(ROOT, ".build/release/token-broker"))
    parser.add_argument("--trace", default=os.path.join(ROOT, ".build/link-order/trace"))
    parser.add_argument("--out", default=os.path.join(ROOT, "Sources/token-broker/link-order.txt"))
    options = parser.parse_args()

    symbols = {}
    listing = subprocess.run(["nm", "-n", "-S", "--defined-only", options.binary], capture_output=True, text=True, check=True)
    for line in listing.stdout.splitlines():
        fields = line.split()
        if len(fields) == 4 and fields[2] in "tTwW" and int(fields[1], 16) > 0:
            symbols.setdefault(int(fields[0], 16), []).append(fields[3])
    entries = tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False)
    entries.write("".join(f"{address:x}\n" for address in symbols))
    entries.close()

    token, admin = free_port(), free_port()
    env = {"PATH": "/usr/bin:/bin", "TOKEN_BROKER_LISTEN": f"127.0.0.1:{token}", "TOKEN_BROKER_ADMIN_LISTEN": f"127.0.0.1:{admin}"}
    tracer = subprocess.Popen([options.trace, entries.name, "--", options.binary], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, env=env, text=True)
    reached = []
    reader = threading.Thread(target=lambda: reached.extend(tracer.stdout.read().split()))
    reader.start()
    try:
        wait_for(admin, time.monotonic() + 60)
        time.sleep(1)  # a second of idling: the timers and watcher threads
        workload(token, admin)
        time.sleep(1)
    finally:
        tracer.send_signal(signal.SIGINT)
        tracer.wait(30)
        reader.join(30)
        os.unlink(entries.name)

    names = [name for address in dict.fromkeys(int(entry, 16) for entry in reached) for name in symbols.get(address, [])]
    if len(names) < 500:
        sys.exit(f"only {len(names)} functions reached: the trace did not work")
    with open(options.out, "w") as out:
        out.write("# The broker's link order, written by bench/link-order/generate.py (make link-order): the\n"
                  "# functions it runs at start, when idle and on common requests, in the order first run.\n"
                  "# lld's --symbol-ordering-file places them together (Package.swift).\n")
        out.write("".join(name + "\n" for name in names))
    print(f"{len(names)} functions written to {os.path.relpath(options.out, ROOT)}")


if __name__ == "__main__":
    main()
