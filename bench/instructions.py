#!/usr/bin/env python3
"""Instructions per request, counted by valgrind's callgrind: the user-space work of one route,
repeatable on a shared, noisy machine where req/s move by 15 % between runs.

    python3 bench/instructions.py [--binary B] [--requests 2000] ROUTE [ROUTE ...]
    ROUTE: token, token-with-query, template-child, gce-token, gce-identity, azure-imds,
           azure-app-service, proxy, proxy-floor

For each route: the broker starts under callgrind with the compatibility benchmark's
configuration (a proxy `u` to an nginx upstream for `proxy`), answers the route's first 200
(a 503 while the provider's first token comes is asked again), then 50 requests on one
keep-alive connection, then its counters are zeroed, it answers --requests more, and the
counters are dumped. Every thread is counted, libcurl, libmicrohttpd and libc included; the
kernel is not. The count covers what the process does between the dumps, so its timers count
too (a few thousand instructions per second, spread over all requests). Talks only to 127.0.0.1.

`proxy-floor` counts the C proxy floor (`bench/proxy-floor/floor.c`, built by `make bench`) the
same way, on `proxy`'s request, sending the broker's own token: what libmicrohttpd and libcurl
cost with no broker code.
"""
import argparse
import glob
import http.client
import os
import re
import subprocess
import tempfile
import time

from run import PROXY_FLOOR, Broker, ProxyFloor, ProxyUpstream, access_token, compat_config

ACCOUNT = "/computeMetadata/v1/instance/service-accounts/default"
ROUTES = {
    "token": ("/token", {"Token-Broker-Request": "true"}),
    # /token sent with the GCE token request's query, which it ignores: the cost of the longer target.
    "token-with-query": ("/token?scopes=https://www.googleapis.com/auth/cloud-platform", {"Token-Broker-Request": "true"}),
    # The broker's own route to the child that the GCE token request reaches.
    "template-child": ("/providers/gcp/token?scope=https://www.googleapis.com/auth/cloud-platform",
                       {"Token-Broker-Request": "true"}),
    "gce-token": (ACCOUNT + "/token?scopes=https://www.googleapis.com/auth/cloud-platform", {"Metadata-Flavor": "Google"}),
    "gce-identity": (ACCOUNT + "/identity?audience=https://svc.example/a&format=full", {"Metadata-Flavor": "Google"}),
    "azure-imds": ("/metadata/identity/oauth2/token?api-version=2018-02-01&resource=https://vault.azure.net",
                   {"Metadata": "true"}),
    "azure-app-service": ("/msi/token?api-version=2019-08-01&resource=https://vault.azure.net",
                          {"X-IDENTITY-HEADER": "bench-secret-of-32-bytes-for-azure"}),
    "proxy": ("/proxy/u/x", {"Token-Broker-Request": "true"}),
    "proxy-floor": ("/proxy/u/x", {"Token-Broker-Request": "true"}),
}


def ready(address, path, headers, seconds=120):
    """Waits for the route's first 200: under valgrind, the provider's first token takes a while."""
    host, port = address.rsplit(":", 1)
    deadline = time.monotonic() + seconds
    while True:
        connection = http.client.HTTPConnection(host, int(port), timeout=60)
        connection.request("GET", path, headers=headers)
        status = connection.getresponse().status
        connection.close()
        if status == 200:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{path} answered {status} for {seconds} s")
        time.sleep(0.5)


def send(address, path, headers, count):
    host, port = address.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    for _ in range(count):
        connection.request("GET", path, headers=headers)
        answer = connection.getresponse()
        answer.read()
        assert answer.status == 200, (path, answer.status)
    connection.close()


def count(route, binary, requests):
    work = tempfile.mkdtemp(prefix="tb-instructions-")
    upstream = ProxyUpstream() if route.startswith("proxy") else None
    config = {"proxies": [{"name": "u", "target": "http://" + upstream.address}]} if upstream else compat_config(work)
    out = os.path.join(work, "callgrind.out")
    wrapper = ("valgrind", "--tool=callgrind", f"--callgrind-out-file={out}.%p")
    server = None
    try:
        if route == "proxy-floor":
            broker = Broker(config, binary)  # only for its token, which the floor then sends
            try:
                token = access_token(broker)
            finally:
                broker.stop()
            server = ProxyFloor(upstream, token, PROXY_FLOOR, work, wrapper=wrapper, start_seconds=120)
        else:
            server = Broker(config, binary, wrapper=wrapper, start_seconds=120)
        path, headers = ROUTES[route]
        ready(server.token, path, headers)
        send(server.token, path, headers, 50)
        subprocess.run(["callgrind_control", "--zero", str(server.pid)], check=True, capture_output=True)
        send(server.token, path, headers, requests)
        subprocess.run(["callgrind_control", "--dump", str(server.pid)], check=True, capture_output=True)
        dump = sorted(glob.glob(f"{out}.{server.pid}.*"))[0]
        total = int(re.search(r"^(?:summary|totals):\s+(\d+)", open(dump).read(), re.M).group(1))
    finally:
        if server:
            server.stop()
        if upstream:
            upstream.stop()
    return total / requests


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("routes", nargs="+", choices=sorted(ROUTES))
    parser.add_argument("--binary", default=None, help="the broker (default: .build/release/token-broker)")
    parser.add_argument("--requests", type=int, default=2000)
    arguments = parser.parse_args()
    for route in arguments.routes:
        print(f"{route}: {count(route, arguments.binary, arguments.requests):,.0f} instructions per request", flush=True)


if __name__ == "__main__":
    main()
