#!/usr/bin/env python3
"""token-broker's benchmarks: speed, footprint and manners towards the issuer.

    make bench                          (installs nginx and wrk, builds, then runs this)
    python3 bench/run.py [--rounds 3] [--seconds 8] [--manners-seconds 300] [--out bench/results]

Everything runs on 127.0.0.1 with bounded durations. Comparisons alternate A/B/C in every
round and report medians and ratios. Writes results.json, results.md, rss.png and wakeups.png to --out.
"""
import argparse
import asyncio
import json
import os
import re
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from issuer import CountingIssuer  # noqa: E402
import startup  # noqa: E402

BINARY = os.path.join(ROOT, ".build/release/token-broker")
GUARD = "Token-Broker-Request: true"
TICKS = os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------------------- processes

class Server:
    """A server process the benchmarks started and will stop with SIGTERM."""

    process: subprocess.Popen

    @property
    def pid(self):
        return self.process.pid

    def stop(self):
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(15)


class Broker(Server):
    """The broker on ephemeral ports, with an optional configuration."""

    def __init__(self, config=None, binary=None, wrapper=(), start_seconds=10):
        self.dir = tempfile.mkdtemp(prefix="tb-bench-")
        command = [*wrapper, binary or BINARY]
        if config is not None:
            path = os.path.join(self.dir, "config.json")
            with open(path, "w") as handle:
                json.dump(config, handle)
            command += ["--config", path]
        self.log = open(os.path.join(self.dir, "log"), "w+")
        env = {"PATH": "/usr/bin:/bin", "TOKEN_BROKER_LISTEN": "127.0.0.1:0", "TOKEN_BROKER_ADMIN_LISTEN": "127.0.0.1:0"}
        self.process = subprocess.Popen(command, stderr=self.log, env=env)
        deadline = time.monotonic() + start_seconds
        while time.monotonic() < deadline:
            self.log.seek(0)
            found = dict(re.findall(r"msg=listening listener=(token|admin) address=(\S+)", self.log.read()))
            if len(found) == 2:
                self.token, self.admin = found["token"], found["admin"]
                return
            time.sleep(0.02)
        raise RuntimeError("the broker did not start")


class Nginx:
    def __init__(self, body):
        self.dir = tempfile.mkdtemp(prefix="tb-nginx-")
        escaped = body.replace("\\", "\\\\").replace("'", "\\'")
        with open(os.path.join(self.dir, "nginx.conf"), "w") as handle:
            handle.write(f"""worker_processes 2;
pid {self.dir}/nginx.pid;
error_log {self.dir}/error.log;
daemon off;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  server {{
    listen 127.0.0.1:0;
    location / {{ default_type application/json; add_header Cache-Control no-store; add_header ETag '"1"'; return 200 '{escaped}'; }}
  }}
}}
""")
        # nginx cannot report an ephemeral port, so take one the kernel just handed out.
        port = free_port()
        conf = os.path.join(self.dir, "nginx.conf")
        text = open(conf).read().replace("127.0.0.1:0", f"127.0.0.1:{port}")
        open(conf, "w").write(text)
        self.process = subprocess.Popen(["nginx", "-c", conf, "-p", self.dir])
        self.token = f"127.0.0.1:{port}"
        wait_for_port(port)

    def pids(self):
        """The master and its workers: CPU is counted over all of them."""
        children = subprocess.run(["pgrep", "-P", str(self.process.pid)], capture_output=True, text=True).stdout.split()
        return [self.process.pid] + [int(p) for p in children]

    def stop(self):
        self.process.send_signal(signal.SIGQUIT)
        self.process.wait(15)


class CServer(Server):
    """The minimal C libmicrohttpd server, answering every request with the body in `body_file`."""

    def __init__(self, body_file, binary):
        self.process = subprocess.Popen([binary, "0", body_file], stdout=subprocess.PIPE, text=True)
        line = self.process.stdout.readline()
        self.token = line.split()[1]


def wait_for_port(port, timeout=10):
    import socket
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.02)
    raise RuntimeError(f"nothing listens on {port}")


def cpu_seconds(pids, kernel_only=False):
    """CPU time of `pids`, user and kernel (or the kernel's part alone)."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        total += (0 if kernel_only else int(fields[11])) + int(fields[12])  # utime, stime
    return total / TICKS


def machine_busy_seconds():
    """CPU time the whole machine spent not idle, every core summed (`/proc/stat`): what the
    load generator, the upstream, the proxy and the kernel's network work (softirq, wherever it
    is charged) cost together."""
    with open("/proc/stat") as handle:
        fields = [int(value) for value in handle.readline().split()[1:]]
    idle, iowait = fields[3], fields[4]
    return (sum(fields[:8]) - idle - iowait) / TICKS


def children_cpu_seconds():
    """CPU time of the child processes waited for so far: measured around `wrk`, its own."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class CPUSplit:
    """Where the machine's CPU time went while wrk ran, per request: the server measured
    (`cpu_us_per_request`, and its part in the kernel), the upstream behind it, wrk (`load_…`),
    and the whole machine (`machine_…`); the rest of the machine's is work charged to no process
    of these, and noise. Also how many cores were busy on average (`busy_cores`, of
    `os.cpu_count()`): when the machine is saturated, req/s is the busy cores' time divided by
    the machine's CPU per request. Start it just before wrk, and read it just after."""

    def __init__(self, server_pids, upstream_pids=()):
        self.server_pids, self.upstream_pids = list(server_pids), list(upstream_pids)
        self.start = self.read()
        self.started = time.monotonic()

    def read(self):
        return (cpu_seconds(self.server_pids), cpu_seconds(self.server_pids, kernel_only=True),
                cpu_seconds(self.upstream_pids), children_cpu_seconds(), machine_busy_seconds())

    def per_request(self, requests):
        spent = [end - start for end, start in zip(self.read(), self.start)]
        keys = ["cpu_us_per_request", "kernel_cpu_us_per_request", "upstream_cpu_us_per_request",
                "load_cpu_us_per_request", "machine_cpu_us_per_request"]
        split = {key: value * 1e6 / max(requests, 1) for key, value in zip(keys, spent)}
        if not self.upstream_pids:
            del split["upstream_cpu_us_per_request"]
        split["busy_cores"] = spent[-1] / (time.monotonic() - self.started)
        return split


def split_wrk(server_pids, address, seconds, *wrk_args, upstream_pids=(), **wrk_options):
    """One `wrk` run (`wrk`'s arguments after `address` and `seconds`), with where the machine's
    CPU time went per request (`CPUSplit`) added to its figures."""
    split = CPUSplit(server_pids, upstream_pids)
    run = wrk(address, seconds, *wrk_args, **wrk_options)
    run.update(split.per_request(run["requests"]))
    return run


def rss_mib(pid):
    return startup.memory_kb(pid)[0] / 1024


def medians(runs_by_name):
    """Each name's runs reduced to the median of every measure they hold."""
    return {name: {key: statistics.median(r[key] for r in runs) for key in runs[0]} for name, runs in runs_by_name.items()}


def per_round(runs, reference, key="rps"):
    """`key` of each round of `runs` divided by the same round's of `reference`."""
    return [r[key] / f[key] for r, f in zip(runs, reference)]


def access_token(broker):
    """The token the broker serves now, from its `/token`."""
    status, body = http_get(broker.token, "/token")
    assert status == 200, status
    return json.loads(body)["access_token"]


def token_body_file(broker):
    """The broker's `/token` answer, and a file in its directory holding it (for the C server)."""
    _, body = http_get(broker.token, "/token")
    path = os.path.join(broker.dir, "body.json")
    with open(path, "wb") as handle:
        handle.write(body)
    return body, path


def free_port():
    """A loopback port the kernel just handed out, for servers that cannot report an ephemeral one."""
    import socket
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def request(address, method, path, headers=None, body=None, timeout=30):
    """One HTTP request to `address` ("host:port") on its own connection: (status, body bytes)."""
    import http.client
    host, port = address.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def http_get(address, path, headers=()):
    return request(address, "GET", path, {"Token-Broker-Request": "true", **dict(headers)})


def http_post(address, path, body=b""):
    return request(address, "POST", path, {"Token-Broker-Request": "true"}, body)


# ---------------------------------------------------------------------------- 1. cached GET /token

def wrk(address, seconds, path="/token", headers=(GUARD,), connections=64, script=None):
    flags = [flag for header in headers for flag in ("-H", header)] + (["-s", script] if script else [])
    output = subprocess.run(["wrk", "-t2", f"-c{connections}", f"-d{seconds}s", "--latency", *flags, f"http://{address}{path}"],
                            capture_output=True, text=True, timeout=seconds + 30).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", output).group(1))
    requests = int(re.search(r"(\d+) requests in", output).group(1))
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", output)

    def latency(label):
        value, unit = re.search(rf"\s{label}%\s+([\d.]+)(us|ms|s)", output).groups()
        return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]

    sockets = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", output)
    return {"rps": rps, "requests": requests, "p50_ms": latency("50"), "p99_ms": latency("99"),
            "non_2xx": int(errors.group(1)) if errors else 0,
            "socket_errors": sum(int(n) for n in sockets.groups()) if sockets else 0}


def cached_token(rounds, seconds, c_binary):
    broker = Broker()
    body, body_file = token_body_file(broker)
    servers = {"token-broker": broker, "nginx": Nginx(body.decode()), "c-libmicrohttpd": CServer(body_file, c_binary)}
    results = {name: [] for name in servers}
    try:
        for _ in range(rounds):
            for name, server in servers.items():
                run = split_wrk(server.pids() if isinstance(server, Nginx) else [server.pid], server.token, seconds)
                results[name].append(run)
                time.sleep(1)
    finally:
        for server in servers.values():
            server.stop()
    summary = medians(results)
    ratios = {
        "rps_vs_nginx": per_round(results["token-broker"], results["nginx"]),
        "cpu_vs_c": per_round(results["token-broker"], results["c-libmicrohttpd"], "cpu_us_per_request"),
    }
    return {"rounds": results, "median": summary, "ratios": {k: {"per_round": v, "median": statistics.median(v)} for k, v in ratios.items()},
            "body_bytes": len(body)}


# ---------------------------------------------------------------------------- 2. long-poll scale

def delays_ms(lines, sent):
    """The client's lines as [(arrived ms, status, has the new token, read ms)], times after `sent`."""
    fields = [line.split() for line in lines if line.strip()]
    return [((float(f[0]) - sent) * 1000, int(f[1]), f[2] == "1", (float(f[3]) - sent) * 1000) for f in fields]


def p99(values):
    values = sorted(values)
    return values[int(len(values) * 0.99) - 1]


def long_poll_burst(broker, count, client, mode):
    """Opens `count` waiting long-polls with the C client (`mode`: keep-alive or close), then
    refreshes once. Returns the p50/p99 wake-up delays in ms from the refresh request to each
    answer's arrival (the kernel's receive timestamp) and to its read, and how many got the new token."""
    _, current = http_get(broker.token, "/token")
    version = json.loads(current)["version"]
    host, port = broker.token.rsplit(":", 1)
    process = subprocess.Popen([client, host, port, str(count), str(version), mode], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "sent"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        _, metrics = http_admin(broker.admin, "/metrics")
        if re.search(rf'token_broker_longpoll_waiters{{provider="default"}} {count}\b', metrics):
            break
        time.sleep(0.05)
    sent = time.monotonic()
    http_post(broker.token, "/token/refresh", json.dumps({"rejected_version": version}).encode())
    answers = delays_ms(process.stdout.read().splitlines(), sent)
    process.wait(100)
    arrived = sorted(a for a, _, _, _ in answers)
    return {"answered_200": sum(1 for _, status, new, _ in answers if status == 200 and new),
            "p50_ms": arrived[len(arrived) // 2], "p99_ms": p99(arrived), "max_ms": arrived[-1],
            "read_p99_ms": p99(r for _, _, _, r in answers), "arrived_ms": arrived}


def long_poll(waiters, bursts, client, floors, proxied=False):
    """Bursts of `waiters` long-polls on one broker, first with keep-alive clients, then with
    clients that send `Connection: close`, sampling RSS throughout. After each burst every floor
    in `floors` (name: a function of the mode giving its command line) answers the same number
    of held requests for the same client: broker, floors, broker, floors, ...

    `proxied`: the broker has a proxy configured (never called), so that its token listener
    runs on the libcurl loops, as in a broker that both proxies and serves long-polls."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, waiters * 2 + 1000), hard))
    # Each burst forces one refresh; the refresh window (5 per 30 s) would refuse a sixth.
    config = {"connectionLimit": waiters + 2000, "providers": [{"forcedRefreshMaxAttempts": 100}]}
    if proxied:
        config["proxies"] = [{"name": "unused", "target": "http://127.0.0.1:9"}]
    broker = Broker(config)
    samples = []
    stop = threading.Event()

    def sample():
        started = time.monotonic()
        while not stop.is_set():
            samples.append((time.monotonic() - started, rss_mib(broker.pid)))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample)
    sampler.start()
    results = {"keep-alive": [], "close": []}
    floor_p99s = {mode: {name: [] for name in floors} for mode in results}
    floor_arrivals = {mode: {} for mode in results}  # the last run of each floor, for the plot
    try:
        time.sleep(0.5)
        idle = rss_mib(broker.pid)
        for mode in results:
            for _ in range(bursts):
                burst = long_poll_burst(broker, waiters, client, mode)
                time.sleep(2)
                burst["rss_after_mib"] = rss_mib(broker.pid)
                results[mode].append(burst)
                for name, command in floors.items():
                    arrived = floor_run(waiters, client, command(mode), mode)
                    floor_p99s[mode][name].append(p99(arrived))
                    floor_arrivals[mode][name] = arrived
    finally:
        stop.set()
        sampler.join()
        broker.stop()
    every = results["keep-alive"] + results["close"]
    peak = max(rss for _, rss in samples)
    first_after = every[0]["rss_after_mib"]
    floor = {mode: {name: {"p99_ms_per_run": values, "p99_ms": statistics.median(values), "arrived_ms": floor_arrivals[mode][name]}
                    for name, values in by_name.items()}
             for mode, by_name in floor_p99s.items()}
    return {"waiters": waiters, "bursts": results["keep-alive"], "close_bursts": results["close"], "floor": floor,
            "idle_rss_mib": idle, "peak_rss_mib": peak,
            "rss_growth_after_bursts_pct": (every[-1]["rss_after_mib"] - first_after) / first_after * 100, "samples": samples}


def floor_run(waiters, client, command, mode):
    """One run of a floor: a program that holds `waiters` requests and answers them all on a
    signal, timed by the same client the same way as the broker. The program prints "listening
    HOST:PORT", then "held"; it answers on a line on stdin and stops when stdin ends. Returns the
    times of arrival, in ms after the signal, sorted."""
    server = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    host, port = server.stdout.readline().split()[1].rsplit(":", 1)
    process = subprocess.Popen([client, host, port, str(waiters), "-1", mode], stdout=subprocess.PIPE, text=True)
    process.stdout.readline()
    assert server.stdout.readline().strip() == "held"
    time.sleep(0.5)
    sent = time.monotonic()
    server.stdin.write("go\n")
    server.stdin.flush()
    answers = delays_ms(process.stdout.read().splitlines(), sent)
    process.wait(100)
    server.stdin.close()
    server.wait(30)
    assert len(answers) == waiters
    return sorted(a for a, _, _, _ in answers)


def http_admin(address, path):
    status, body = request(address, "GET", path, timeout=10)
    return status, body.decode()


# ---------------------------------------------------------------------------- 3. coalescing

async def concurrent(address, requests):
    host, port = address.rsplit(":", 1)

    async def one(raw):
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(raw)
        data = await asyncio.wait_for(reader.read(), 60)
        writer.close()
        return data

    results = []
    opened = []
    for start in range(0, len(requests), 250):
        opened += [asyncio.ensure_future(one(raw)) for raw in requests[start:start + 250]]
        await asyncio.sleep(0.01)
    results = await asyncio.gather(*opened)
    return results


def coalescing():
    issuer = CountingIssuer(lifetime=300, delay=2.0)
    config = {"providers": [{"source": {"type": "http", "url": issuer.url, "expiresInPointer": "/expires_in"}}]}
    try:
        broker = Broker(config)
        ready = f"GET /token/ready?timeout=30 HTTP/1.1\r\nHost: b\r\n{GUARD}\r\nConnection: close\r\n\r\n".encode()
        answers = asyncio.run(concurrent(broker.token, [ready] * 1000))
        cold = {"requests": 1000, "answered_200": sum(a.startswith(b"HTTP/1.1 200") for a in answers), "upstream_fetches": issuer.count}
        before = issuer.count
        body = b'{"rejected_version": 1}'
        refresh = (f"POST /token/refresh HTTP/1.1\r\nHost: b\r\n{GUARD}\r\nConnection: close\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
        answers = asyncio.run(concurrent(broker.token, [refresh] * 1000))
        forced = {"requests": 1000, "answered_200": sum(a.startswith(b"HTTP/1.1 200") for a in answers), "upstream_fetches": issuer.count - before}
        broker.stop()
    finally:
        issuer.close()
    return {"cold_start_ready": cold, "refresh_same_version": forced}


# ---------------------------------------------------------------------------- 5. manners

def manners(seconds):
    healthy = CountingIssuer(lifetime=30)
    config = {"providers": [{"source": {"type": "http", "url": healthy.url, "expiresInPointer": "/expires_in"}}]}
    broker = Broker(config)
    started = time.monotonic()
    try:
        while time.monotonic() - started < seconds:  # a client reads every 5 s, so refresh never pauses
            http_get(broker.token, "/token")
            time.sleep(5)
    finally:
        broker.stop()
        healthy.close()
    fetches = healthy.count
    # The rule: a fetch at start, then one at 75–85 % of each 30 s lifetime (22.5–25.5 s apart).
    expected_low = 1 + int(seconds // 25.5)
    expected_high = 1 + int(seconds // 22.5)
    intervals = [b - a for a, b in zip(healthy.times, healthy.times[1:])]
    healthy_result = {"seconds": seconds, "lifetime_s": 30, "upstream_fetches": fetches, "expected": [expected_low, expected_high],
                      "within_rule": expected_low - 1 <= fetches <= expected_high + 1,
                      "median_interval_s": statistics.median(intervals) if intervals else None}

    failing = CountingIssuer(lifetime=30)
    failing.failing = True
    config = {"providers": [{"source": {"type": "http", "url": failing.url}, "maxRetryCount": 5, "maxErrorTokenRefreshDelayMsec": 5000}]}
    broker = Broker(config)
    time.sleep(19)
    broker.stop()
    failing.close()
    observed = [round((b - a) * 1000) for a, b in zip(failing.times, failing.times[1:])]
    expected = [100, 200, 400, 800, 1600] + [5000] * max(0, len(observed) - 5)
    return {"healthy": healthy_result,
            "failing": {"observed_ms": observed, "expected_ms": expected[:len(observed)],
                        "note": "backoff waits have ±20 % jitter; the 5 s cadence has none"}}


# ---------------------------------------------------------------------------- 6. template children

def template_children(rounds, seconds, children):
    """A template's child against a configured provider, in one broker: cached /token req/s and CPU
    per request, alternated round by round; then the RSS that `children` children add."""
    config = {"providers": [
        {"name": "fixed"},
        {"name": "apis", "perRequest": ["audience"], "allowedAudiences": ["https://api.example/*"], "maxChildren": 10000},
    ]}
    broker = Broker(config)
    paths = {"configured provider": "/providers/fixed/token",
             "template child": "/providers/apis/token?audience=https://api.example/0"}
    results = {name: [] for name in paths}
    try:
        for path in paths.values():
            status, _ = http_get(broker.token, path)
            assert status == 200, (path, status)
        for _ in range(rounds):
            for name, path in paths.items():
                run = split_wrk([broker.pid], broker.token, seconds, path)
                results[name].append(run)
                time.sleep(1)
        time.sleep(2)
        rss_before = rss_mib(broker.pid)
        made = 0
        for index in range(1, children):
            status, _ = http_get(broker.token, f"/providers/apis/token?audience=https://api.example/{index}")
            made += status == 200
        time.sleep(2)
        rss_after = rss_mib(broker.pid)
        _, readiness = http_get(broker.admin, "/readyz")
        counted = [t["children"] for t in json.loads(readiness).get("templates", []) if t["name"] == "apis"]
    finally:
        broker.stop()
    summary = medians(results)
    ratio = per_round(results["template child"], results["configured provider"])
    cpu = per_round(results["template child"], results["configured provider"], "cpu_us_per_request")
    return {"rounds": results, "median": summary, "rps_ratio": {"per_round": ratio, "median": statistics.median(ratio)},
            "cpu_ratio": {"per_round": cpu, "median": statistics.median(cpu)},
            "children": {"asked": children, "answered_200": made + 1, "counted_by_readyz": counted[0] if counted else None,
                         "rss_before_mib": rss_before, "rss_after_mib": rss_after,
                         "kib_per_child": (rss_after - rss_before) * 1024 / max(children - 1, 1)}}


# ---------------------------------------------------------------------------- 7. compatibility answers

def compat_config(work):
    """The compatibility benchmark's broker: a configured provider `fixed`, three templates, and
    `compat.gce` and `compat.azure` on the token listener, App Service's secret in `work`."""
    header_file = os.path.join(work, "identity-header")
    with open(header_file, "w") as handle:
        handle.write("bench-secret-of-32-bytes-for-azure\n")
    os.chmod(header_file, 0o600)
    config = {"providers": [
        {"name": "fixed"},
        {"name": "gcp", "perRequest": ["scope"], "allowedScopes": ["https://www.googleapis.com/auth/*"]},
        {"name": "gcp-id", "perRequest": ["audience"], "allowedAudiences": ["https://svc.example/*"]},
        {"name": "vault", "perRequest": ["scope"], "allowedScopes": ["https://vault.azure.net/.default"]},
    ], "compat": {
        "gce": {"provider": "gcp", "identityProvider": "gcp-id", "projectId": "bench", "serviceAccountEmail": "b@bench.example"},
        "azure": {"identities": [{"provider": "vault"}], "identityHeaderFile": header_file, "imds": True},
    }}
    return config


def compat_answers(rounds, seconds, c_binary=None):
    """Cached answers of the cloud SDK protocols against /token, in one broker on the token
    listener: GCE's token (scopes as google-auth sends them) and identity token, Azure IMDS's and
    App Service's token, each a template's child answered from its cache.

    Each protocol's run is paired with a `/token` run just before or just after it, the order
    alternating round by round (A B, then B A): a ratio compares two runs seconds apart, so that
    the machine's drift over the benchmark (other tenants, a warming cache) falls on both sides
    of it alike. A protocol's ratio is the median of its pairs. With an odd number of rounds one
    order has one pair more. The JSON keeps each protocol's runs under `pairs` (`protocol` and the
    `/token` run paired with each), where the other benchmarks have `rounds`.

    With `c_binary` (the minimal C libmicrohttpd server), the same pairs also go to it, which
    answers every one with the same prebuilt body: its ratio for a protocol's request to its
    `/token` request is what the longer request alone costs libmicrohttpd, the kernel and wrk."""
    broker = Broker(compat_config(tempfile.mkdtemp()))
    account = "/computeMetadata/v1/instance/service-accounts/default"
    token_route = ("/token", (GUARD,))
    routes = {
        "GCE token": (account + "/token?scopes=https://www.googleapis.com/auth/cloud-platform", ("Metadata-Flavor: Google",)),
        "GCE identity": (account + "/identity?audience=https://svc.example/a&format=full", ("Metadata-Flavor: Google",)),
        "Azure IMDS": ("/metadata/identity/oauth2/token?api-version=2018-02-01&resource=https://vault.azure.net", ("Metadata: true",)),
        "Azure App Service": ("/msi/token?api-version=2019-08-01&resource=https://vault.azure.net", ("X-IDENTITY-HEADER: bench-secret-of-32-bytes-for-azure",)),
    }
    servers = {"token-broker": broker}
    if c_binary and os.path.exists(c_binary):
        servers["C floor"] = CServer(token_body_file(broker)[1], c_binary)
    # For each server and protocol: the protocol's runs, and the /token run paired with each.
    pairs = {server: {name: {"protocol": [], "/token": []} for name in routes} for server in servers}

    def measure(server, path, headers):
        run = split_wrk([server.pid], server.token, seconds, path, headers)
        time.sleep(1)
        return run

    try:
        for name, (path, headers) in [("/token", token_route), *routes.items()]:
            status, _ = request(broker.token, "GET", path, dict(h.split(": ", 1) for h in headers))
            assert status == 200, (name, status)
        for round_index in range(rounds):
            for name, route in routes.items():
                for server_name, server in servers.items():
                    order = ("/token", "protocol") if round_index % 2 == 0 else ("protocol", "/token")
                    for side in order:
                        path, headers = token_route if side == "/token" else route
                        pairs[server_name][name][side].append(measure(server, path, headers))
    finally:
        for server in servers.values():
            server.stop()

    def summary(server_name):
        by_name = {"/token": [run for name in routes for run in pairs[server_name][name]["/token"]]}
        by_name.update({name: pairs[server_name][name]["protocol"] for name in routes})
        return medians(by_name)

    ratios = {}
    for name in routes:
        mine = pairs["token-broker"][name]
        each = per_round(mine["protocol"], mine["/token"])
        ratios[name] = {"per_round": each, "median": statistics.median(each)}
        if "C floor" in pairs:
            floor = pairs["C floor"][name]
            floor_each = per_round(floor["protocol"], floor["/token"])
            ratios[name].update({"floor_per_round": floor_each, "floor_median": statistics.median(floor_each)})
    out = {"pairs": pairs["token-broker"], "median": summary("token-broker"), "rps_ratio": ratios}
    if "C floor" in pairs:
        out["floor_median"] = summary("C floor")
    return out


# ---------------------------------------------------------------------------- 9. proxy mode

PROXY_CASES = {
    # name: (path on the upstream, wrk connections, method script or None)
    "small GET": ("/x", 64, None),
    "64 KiB answer": ("/big", 64, None),
    "64 KiB POST": ("/post", 64, "post64k.lua"),
    "slow upstream (10 ms), 256 connections": ("/slow", 256, None),
}


class ProxyUpstream:
    """The upstream both proxies forward to: nginx, one worker. `/x` answers 2 bytes, `/big` a
    64 KiB file, `/post` takes any body and answers 2 bytes, `/slow` answers after 10 ms (the echo
    module's timer, which holds no worker). `/status` on a second port counts accepted connections."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="tb-upstream-")
        os.chmod(self.dir, 0o755)  # nginx's worker may run as another user, and reads www/
        os.makedirs(os.path.join(self.dir, "www"))
        with open(os.path.join(self.dir, "www", "big"), "wb") as handle:
            handle.write(b"b" * 65536)
        port, status = free_port(), free_port()
        conf = os.path.join(self.dir, "nginx.conf")
        with open(conf, "w") as handle:
            handle.write(f"""load_module /usr/lib/nginx/modules/ngx_http_echo_module.so;
worker_processes 1;
pid {self.dir}/nginx.pid;
error_log {self.dir}/error.log;
daemon off;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {self.dir}/body;
  client_body_buffer_size 128k;
  client_max_body_size 1m;
  keepalive_requests 1000000;
  server {{
    listen 127.0.0.1:{port} backlog=4096;
    root {self.dir}/www;
    location = /x {{ return 200 'ok'; }}
    location = /big {{ }}
    location = /post {{ return 200 'ok'; }}
    location = /slow {{ echo_sleep 0.01; echo ok; }}
  }}
  server {{
    listen 127.0.0.1:{status};
    location = /status {{ stub_status; }}
  }}
}}
""")
        self.process = subprocess.Popen(["nginx", "-c", conf, "-p", self.dir])
        self.address = f"127.0.0.1:{port}"
        self.status_address = f"127.0.0.1:{status}"
        wait_for_port(port)
        wait_for_port(status)

    pids = Nginx.pids

    def accepted(self):
        """Connections the upstream accepted so far, on both ports (the caller subtracts its own)."""
        _, body = request(self.status_address, "GET", "/status")
        return int(body.decode().splitlines()[2].split()[0])

    def stop(self):
        self.process.send_signal(signal.SIGQUIT)
        self.process.wait(15)


class NginxProxy(Nginx):
    """nginx `proxy_pass` to the upstream with the token put in, one worker, upstream keep-alive 64:
    the configuration the issue measured against. Bodies up to 128 KiB stay in memory both ways.
    Its processes are counted and stopped as `Nginx`'s are."""

    def __init__(self, upstream, token):
        self.dir = tempfile.mkdtemp(prefix="tb-nginx-proxy-")
        port = free_port()
        self.config = f"""worker_processes 1;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  keepalive_requests 1000000;
  client_body_buffer_size 128k;
  client_max_body_size 1m;
  upstream target {{ server {upstream.address}; keepalive 64; keepalive_requests 1000000; }}
  server {{
    listen 127.0.0.1:{port} backlog=4096;
    location /proxy/u/ {{
      proxy_pass http://target/;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Authorization "Bearer {token}";
      proxy_buffers 32 8k;
    }}
  }}
}}
"""
        conf = os.path.join(self.dir, "nginx.conf")
        with open(conf, "w") as handle:
            handle.write(f"pid {self.dir}/nginx.pid;\nerror_log {self.dir}/error.log;\ndaemon off;\n" + self.config
                         .replace("http {", f"http {{\n  client_body_temp_path {self.dir}/body;\n  proxy_temp_path {self.dir}/proxy;", 1))
        self.process = subprocess.Popen(["nginx", "-c", conf, "-p", self.dir])
        self.token = f"127.0.0.1:{port}"
        wait_for_port(port)


class ProxyFloor(Server):
    """`bench/proxy-floor/floor.c`: the broker's two libraries as a bare C proxy, one event loop per
    thread, sending the same token. It proxies GETs only, so it joins the GET cases alone."""

    def __init__(self, upstream, token, binary, work, wrapper=(), start_seconds=10):
        token_file = os.path.join(work, "floor-token")
        with open(token_file, "w") as handle:
            handle.write(token)
        port = free_port()
        self.process = subprocess.Popen([*wrapper, binary, str(port), upstream.address, token_file],
                                        stdout=subprocess.DEVNULL)
        self.token = f"127.0.0.1:{port}"
        wait_for_port(port, start_seconds)


def proxy_budget(run, nginx, target=0.8):
    """The proxy's CPU per request at which `run` would have made `target` times nginx's req/s
    in the same round, with everything else in its run as it was: the machine's busy cores,
    and what the upstream, wrk and the rest cost per request. On a saturated machine req/s is
    the busy cores' time divided by the machine's CPU per request."""
    machine = run["busy_cores"] * 1e6 / (target * nginx["rps"])
    return machine - (run["machine_cpu_us_per_request"] - run["cpu_us_per_request"])


def threads(pid):
    with open(f"/proc/{pid}/status") as handle:
        return int(re.search(r"Threads:\s+(\d+)", handle.read()).group(1))


PROXY_FLOOR = os.path.join(ROOT, ".build/bench/proxy-floor")


def proxy_mode(rounds, seconds, cases=None, baseline=None, floor=PROXY_FLOOR):
    """`/proxy/u/...` against nginx `proxy_pass` to the same upstream, alternated round by round
    (the order flips each round), for each case: req/s, p50/p99, CPU per request of the proxy,
    the upstream connections it opened, and (the broker) its peak thread count. `baseline`, a
    second broker binary (an earlier build), joins the rotation as "token-broker (baseline)".
    `floor`, the C proxy floor's binary when it was built, joins the GET cases as "C floor"."""
    work = tempfile.mkdtemp(prefix="tb-proxy-")
    script = os.path.join(work, "post64k.lua")
    with open(script, "w") as handle:
        handle.write('wrk.method = "POST"\nwrk.body = string.rep("p", 65536)\n'
                     'wrk.headers["Content-Type"] = "application/octet-stream"\n')
    upstream = ProxyUpstream()
    broker = Broker({"proxies": [{"name": "u", "target": "http://" + upstream.address}]})
    token = access_token(broker)
    nginx = NginxProxy(upstream, token)
    proxies = {"token-broker": (broker, lambda: [broker.pid]), "nginx": (nginx, nginx.pids)}
    if baseline:
        earlier = Broker({"proxies": [{"name": "u", "target": "http://" + upstream.address}]}, binary=baseline)
        proxies["token-broker (baseline)"] = (earlier, lambda: [earlier.pid])
    if floor and os.path.exists(floor):
        bare = ProxyFloor(upstream, token, floor, work)
        proxies["C floor"] = (bare, lambda: [bare.pid])
    cases = {name: PROXY_CASES[name] for name in (cases or PROXY_CASES)}

    def takes(name, method):
        return name != "C floor" or method is None

    results = {case: {name: [] for name in proxies if takes(name, method)} for case, (_, _, method) in cases.items()}
    try:
        for name, (server, _) in proxies.items():  # each answers every case before it is measured
            for path, _, method in cases.values():
                if not takes(name, method):
                    continue
                status, _ = request(server.token, "POST" if method else "GET", "/proxy/u" + path,
                                    {"Token-Broker-Request": "true"}, b"p" * 65536 if method else None)
                assert status == 200, (name, path, status)
        for index in range(rounds):
            for case, (path, connections, method) in cases.items():
                order = list(results[case]) if index % 2 == 0 else list(reversed(results[case]))
                for name in order:
                    server, pids = proxies[name]
                    peak = [0]
                    done = threading.Event()

                    watched = server.pid if name.startswith("token-broker") else None

                    def watch():
                        while not done.wait(0.2):
                            peak[0] = max(peak[0], threads(watched))

                    watcher = threading.Thread(target=watch) if watched else None
                    if watcher:
                        watcher.start()
                    accepted = upstream.accepted()
                    run = split_wrk(pids(), server.token, seconds, "/proxy/u" + path, (GUARD,), upstream_pids=upstream.pids(),
                                    connections=connections, script=script if method else None)
                    run["upstream_connections"] = upstream.accepted() - accepted - 1  # less the status query
                    done.set()
                    if watcher:
                        watcher.join()
                        run["peak_threads"] = peak[0]
                    results[case][name].append(run)
                    time.sleep(1)
    finally:
        for name, (server, _) in proxies.items():
            server.stop()
        upstream.stop()
    summary, ratios = {}, {}
    for case, runs in results.items():
        summary[case] = medians(runs)
        rps = per_round(runs["token-broker"], runs["nginx"])
        p99 = per_round(runs["token-broker"], runs["nginx"], "p99_ms")
        budget = [proxy_budget(run, reference) for run, reference in zip(runs["token-broker"], runs["nginx"])]
        ratios[case] = {"rps_per_round": rps, "rps": statistics.median(rps), "p99_per_round": p99, "p99": statistics.median(p99),
                        "budget_us_per_round": budget, "budget_us": statistics.median(budget)}
        if baseline:
            gain = per_round(runs["token-broker"], runs["token-broker (baseline)"])
            ratios[case]["rps_vs_baseline_per_round"] = gain
            ratios[case]["rps_vs_baseline"] = statistics.median(gain)
        if "C floor" in runs:
            bare = per_round(runs["C floor"], runs["nginx"])
            bare_p99 = per_round(runs["C floor"], runs["nginx"], "p99_ms")
            bare_budget = [proxy_budget(run, reference) for run, reference in zip(runs["C floor"], runs["nginx"])]
            ratios[case].update({"floor_rps_per_round": bare, "floor_rps": statistics.median(bare),
                                 "floor_p99_per_round": bare_p99, "floor_p99": statistics.median(bare_p99),
                                 "floor_budget_us": statistics.median(bare_budget)})
    return {"rounds": results, "median": summary, "ratios": ratios, "nginx_config": nginx.config}


# ---------------------------------------------------------------------------- 8. the token store

class Redis(Server):
    """A redis-server on a Unix socket in a temporary directory, keeping nothing on disk."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="tb-redis-")
        self.socket = os.path.join(self.dir, "redis.sock")
        self.process = subprocess.Popen(
            ["redis-server", "--port", "0", "--unixsocket", self.socket, "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while not os.path.exists(self.socket):
            if time.monotonic() > deadline:
                raise RuntimeError("redis-server did not start")
            time.sleep(0.02)


def store_config(work, source, store):
    """A configuration with one provider on `source` and `store` (None: memory), with a store key."""
    key = os.path.join(work, "store.key")
    if not os.path.exists(key):
        with open(key, "w") as handle:
            handle.write(os.urandom(32).hex() + "\n")
        os.chmod(key, 0o600)
    config = {"providers": [{"name": "default", "source": source}]}
    if store is not None:
        config["store"] = {**store, "keyFile": key}
    return config


def token_store(rounds, seconds, fleet_sizes=(1, 5, 20), cycles=5, lifetime=4):
    """The Redis store: cached /token against the memory store (two brokers, same provider,
    alternated round by round), then upstream fetches per refresh cycle for fleets of 1, 5 and 20
    brokers sharing one Redis, counted at the issuer."""
    work = tempfile.mkdtemp(prefix="tb-store-")
    signing = os.path.join(work, "signing.pem")
    subprocess.run(["openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", signing],
                   check=True, capture_output=True)
    redis = Redis()
    jwt_source = {"type": "jwt", "keyFile": signing}
    brokers = {"memory store": Broker(store_config(work, jwt_source, None)),
               "redis store": Broker(store_config(work, jwt_source, {"type": "redis", "address": "unix:" + redis.socket}))}
    results = {name: [] for name in brokers}
    try:
        for broker in brokers.values():
            status, _ = http_get(broker.token, "/token")
            assert status == 200, status
        for _ in range(rounds):
            for name, broker in brokers.items():
                run = split_wrk([broker.pid], broker.token, seconds, "/token")
                results[name].append(run)
                time.sleep(1)
    finally:
        for broker in brokers.values():
            broker.stop()
    summary = medians(results)
    ratio = per_round(results["redis store"], results["memory store"])

    fleets = {}
    for size in fleet_sizes:
        issuer = CountingIssuer(lifetime=lifetime)
        prefix = f"bench-{size}:"
        source = {"type": "http", "url": issuer.url, "expiresInPointer": "/expires_in"}
        config = store_config(work, source, {"type": "redis", "address": "unix:" + redis.socket, "keyPrefix": prefix})
        fleet = []
        try:
            fleet.append(Broker(config))
            while issuer.count < 1:
                time.sleep(0.05)
            fleet += [Broker(config) for _ in range(size - 1)]
            start = issuer.count
            time.sleep(cycles * lifetime)
            fetched = issuer.count - start
        finally:
            for broker in fleet:
                broker.stop()
            issuer.close()
        # One refresh at 75–85 % of each lifetime: `cycles` lifetimes hold cycles / 0.8 refreshes.
        refreshes = cycles * lifetime / (0.8 * lifetime)
        fleets[str(size)] = {"brokers": size, "seconds": cycles * lifetime, "lifetime_s": lifetime,
                             "upstream_fetches": fetched, "refreshes_expected": round(refreshes, 1),
                             "fetches_per_refresh": fetched / refreshes}
    redis.stop()
    return {"rounds": results, "median": summary, "rps_ratio": {"per_round": ratio, "median": statistics.median(ratio)},
            "fleets": fleets}


# ---------------------------------------------------------------------------- report

def plot(longpoll_result, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    times = [t for t, _ in longpoll_result["samples"]]
    rss = [r for _, r in longpoll_result["samples"]]
    figure, axis = plt.subplots(figsize=(8, 4))
    axis.plot(times, rss, linewidth=1.2)
    axis.axhline(96e6 / 2**20, color="red", linestyle="--", linewidth=0.8, label="target: 96 MB (91.6 MiB)")
    axis.set_xlabel("seconds")
    axis.set_ylabel("RSS (MiB)")
    bursts = len(longpoll_result["bursts"]) + len(longpoll_result["close_bursts"])
    axis.set_title(f"token-broker RSS over {bursts} bursts of {longpoll_result['waiters']} long-polls (keep-alive, then close)")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def plot_wakeups(longpoll_result, path):
    """The share of the waiters answered against the time since the signal: each keep-alive burst
    of the broker, and the last run of each floor."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, axis = plt.subplots(figsize=(8, 4.5))

    def cdf(arrived, **style):
        axis.plot(arrived, [(i + 1) / len(arrived) * 100 for i in range(len(arrived))], linewidth=1.2, **style)

    for index, burst in enumerate(longpoll_result["bursts"]):
        cdf(burst["arrived_ms"], color="tab:blue", alpha=1 - index * 0.25, label=f"token-broker, burst {index + 1}")
    floors = longpoll_result["floor"]["keep-alive"]
    cdf(floors["libmicrohttpd"]["arrived_ms"], color="tab:orange", label="libmicrohttpd alone (C)")
    cdf(floors["bare"]["arrived_ms"], color="tab:green", label="bare C server")
    axis.axvline(100, color="red", linestyle="--", linewidth=0.8, label="target: p99 ≤ 100 ms")
    axis.axhline(99, color="grey", linestyle=":", linewidth=0.8)
    axis.set_xlabel("ms after the refresh (the floors: after the signal), at arrival")
    axis.set_ylabel("% of waiters answered")
    axis.set_title(f"Waking {longpoll_result['waiters']} long-polls, keep-alive clients")
    axis.legend(loc="lower right")
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def without_arrivals(longpoll_result):
    """The long-poll result without each answer's time of arrival (plotted, not kept in the JSON)."""
    copy = json.loads(json.dumps(longpoll_result))
    for burst in copy["bursts"] + copy["close_bursts"]:
        burst.pop("arrived_ms")
    for by_name in copy["floor"].values():
        for floor in by_name.values():
            floor.pop("arrived_ms")
    return copy


def markdown(results):
    c = results["cached_token"]["median"]
    r = results["cached_token"]["ratios"]
    lp = results["long_poll"]
    co = results["coalescing"]
    fp = results["footprint"]
    ma = results["manners"]
    lines = ["| benchmark | measure | result | target | met |", "|---|---|---|---|---|"]
    for name in ("token-broker", "nginx", "c-libmicrohttpd"):
        s = c[name]
        lines.append(f"| cached GET /token, {name} | req/s; p50 / p99; CPU per request | {s['rps']:,.0f}; {s['p50_ms']:.2f} / {s['p99_ms']:.2f} ms; {s['cpu_us_per_request']:.1f} µs | | |")
    lines.append(f"| cached GET /token | token-broker ÷ nginx req/s (median of rounds) | {r['rps_vs_nginx']['median']:.2f} | ≥ 0.95 | {'yes' if r['rps_vs_nginx']['median'] >= 0.95 else 'no'} |")
    lines.append(f"| cached GET /token | token-broker ÷ C CPU per request | {r['cpu_vs_c']['median']:.2f} | ≤ 1.10 | {'yes' if r['cpu_vs_c']['median'] <= 1.10 else 'no'} |")
    all_ok = all(b["answered_200"] == lp["waiters"] for b in lp["bursts"] + lp["close_bursts"])
    lines.append(f"| long-poll, {lp['waiters']} waiters × {len(lp['bursts'])} bursts, keep-alive then close | answered 200 with the new token | {', '.join(str(b['answered_200']) for b in lp['bursts'] + lp['close_bursts'])} | all | {'yes' if all_ok else 'no'} |")
    for key, mode, label in (("bursts", "keep-alive", "keep-alive clients"), ("close_bursts", "close", "clients sending `Connection: close`")):
        median = statistics.median(b["p99_ms"] for b in lp[key])
        per_burst = ", ".join(f"{b['p99_ms']:.0f}" for b in lp[key])
        floor = lp["floor"][mode]
        met = "yes" if median <= 100 else "no"
        lines.append(f"| long-poll, {label} | p99 wake-up after the refresh, at arrival (median of bursts; each burst) | {median:.0f} ms ({per_burst}) | ≤ 100 ms | {met} |")
        runs = len(floor["libmicrohttpd"]["p99_ms_per_run"])
        lines.append(f"| long-poll, {label} | floor: libmicrohttpd alone (C, the broker's daemon flags) resuming the same {lp['waiters']} suspended requests, p99 at arrival (median of {runs}; each run) | {floor['libmicrohttpd']['p99_ms']:.0f} ms ({', '.join(f'{v:.0f}' for v in floor['libmicrohttpd']['p99_ms_per_run'])}) | | |")
        lines.append(f"| long-poll, {label} | floor: a bare C server writing the answer on the same {lp['waiters']} held sockets, p99 at arrival (median of {runs}; each run) | {floor['bare']['p99_ms']:.0f} ms ({', '.join(f'{v:.0f}' for v in floor['bare']['p99_ms_per_run'])}) | | |")
        lines.append(f"| long-poll, {label} | token-broker ÷ libmicrohttpd alone, p99 (medians) | {median / floor['libmicrohttpd']['p99_ms']:.2f} | | |")
        lines.append(f"| long-poll, {label} | p99 when the one-thread client read the answers (median of bursts) | {statistics.median(b['read_p99_ms'] for b in lp[key]):.0f} ms | | |")
    lines.append(f"| long-poll | peak RSS | {lp['peak_rss_mib']:.1f} MiB | ≤ 96 MB | {'yes' if lp['peak_rss_mib'] * 1.048576 <= 96 else 'no'} |")
    lines.append(f"| long-poll | RSS after the last of the {len(lp['bursts']) + len(lp['close_bursts'])} bursts vs after the first | {lp['rss_growth_after_bursts_pct']:+.1f} % | at most +10 % | {'yes' if lp['rss_growth_after_bursts_pct'] <= 10 else 'no'} |")
    for key, label in (("cold_start_ready", "1000 × /token/ready at a cold start"), ("refresh_same_version", "1000 × POST /token/refresh, same version")):
        item = co[key]
        lines.append(f"| coalescing | {label}: upstream fetches (answered 200) | {item['upstream_fetches']} ({item['answered_200']}) | 1 | {'yes' if item['upstream_fetches'] == 1 else 'no'} |")
    lines.append(f"| footprint | idle RSS (anonymous + file-backed) | {fp['idle_rss_mib']:.1f} MiB ({fp['idle_anon_mib']:.1f} + {fp['idle_file_mib']:.1f}) | ≤ 16 MB | {'yes' if fp['idle_rss_mib'] * 1.048576 <= 16 else 'no'} |")
    lines.append(f"| footprint | the floor: idle RSS of a Swift program that starts the same libraries and does nothing else (anonymous + file-backed) | {fp['floor_rss_mib']:.1f} MiB ({fp['floor_anon_mib']:.1f} + {fp['floor_file_mib']:.1f}) | | |")
    lines.append(f"| footprint | idle RSS of the C libmicrohttpd server, for reference | {fp['c_server_idle_rss_mib']:.1f} MiB | | |")
    lines.append(f"| footprint | exec → first /healthz 200 (median) | {fp['ready_ms']:.1f} ms | ≤ 100 ms | {'yes' if fp['ready_ms'] <= 100 else 'no'} |")
    lines.append(f"| footprint | binary size (static Swift stdlib; stripped) | {fp['binary_mb']:.1f} MB; {fp['stripped_mb']:.1f} MB | | |")
    t = results.get("template_children")
    if t:
        for name in ("configured provider", "template child"):
            m = t["median"][name]
            lines.append(f"| template child, {name} | cached /token req/s; p50 / p99; CPU per request | {m['rps']:,.0f}; {m['p50_ms']:.2f} / {m['p99_ms']:.2f} ms; {m['cpu_us_per_request']:.1f} µs | | |")
        lines.append(f"| template child | child ÷ configured provider req/s, same broker (median of rounds; each round) | {t['rps_ratio']['median']:.2f} ({', '.join(f'{v:.2f}' for v in t['rps_ratio']['per_round'])}) | as fast | |")
        lines.append(f"| template child | child ÷ configured provider CPU per request (median of rounds) | {t['cpu_ratio']['median']:.2f} | | |")
        ch = t["children"]
        lines.append(f"| template children | RSS with 1 child, then with {ch['asked']} ({ch['answered_200']} answered 200, {ch['counted_by_readyz']} counted by /readyz) | {ch['rss_before_mib']:.1f} → {ch['rss_after_mib']:.1f} MiB ({ch['kib_per_child']:.1f} KiB per child) | recorded | |")
    co_answers = results.get("compat")
    if co_answers:
        for name, m in co_answers["median"].items():
            lines.append(f"| compatibility, {name} | cached req/s; p50 / p99; CPU per request: the broker, wrk; the whole machine, and its cores busy | {m['rps']:,.0f}; {m['p50_ms']:.2f} / {m['p99_ms']:.2f} ms; {m['cpu_us_per_request']:.1f}, {m['load_cpu_us_per_request']:.1f}; {m['machine_cpu_us_per_request']:.1f} µs, {m['busy_cores']:.2f} | | |")
        for name, ratio in co_answers["rps_ratio"].items():
            lines.append(f"| compatibility, {name} | ÷ /token req/s, same broker, each run paired with a /token run beside it (median of pairs; each pair) | {ratio['median']:.2f} ({', '.join(f'{v:.2f}' for v in ratio['per_round'])}) | as fast | |")
            if "floor_median" in ratio:
                lines.append(f"| compatibility, {name} | the C server's own ratio for the same two requests, paired the same way (median; each pair) | {ratio['floor_median']:.2f} ({', '.join(f'{v:.2f}' for v in ratio['floor_per_round'])}) | | |")
        for name, m in co_answers.get("floor_median", {}).items():
            lines.append(f"| compatibility, C server, {name}'s request | req/s; CPU per request: the server, wrk; the whole machine, and its cores busy | {m['rps']:,.0f}; {m['cpu_us_per_request']:.1f}, {m['load_cpu_us_per_request']:.1f}; {m['machine_cpu_us_per_request']:.1f} µs, {m['busy_cores']:.2f} | | |")
    st = results.get("token_store")
    if st:
        for name, m in st["median"].items():
            lines.append(f"| token store, {name} | cached /token req/s; p50 / p99; CPU per request | {m['rps']:,.0f}; {m['p50_ms']:.2f} / {m['p99_ms']:.2f} ms; {m['cpu_us_per_request']:.1f} µs | | |")
        ratio = st["rps_ratio"]
        lines.append(f"| token store | Redis ÷ memory store req/s (median of rounds; each round) | {ratio['median']:.2f} ({', '.join(f'{v:.2f}' for v in ratio['per_round'])}) | ≥ 0.95 | {'yes' if ratio['median'] >= 0.95 else 'no'} |")
        for size, fleet in st["fleets"].items():
            lines.append(f"| token store, fleet of {size} | upstream fetches in {fleet['seconds']} s of {fleet['lifetime_s']} s tokens (about {fleet['refreshes_expected']} refreshes) | {fleet['upstream_fetches']} ({fleet['fetches_per_refresh']:.2f} per refresh) | 1 per refresh | {'yes' if fleet['fetches_per_refresh'] <= 1.25 else 'no'} |")
    px = results.get("proxy")
    if px:
        for case, servers in px["median"].items():
            for name, m in servers.items():
                threads = f"; {m['peak_threads']:.0f} threads at most" if "peak_threads" in m else ""
                lines.append(f"| proxy, {case}, {name} | req/s; p50 / p99; CPU per request; upstream connections opened{threads} | {m['rps']:,.0f}; {m['p50_ms']:.2f} / {m['p99_ms']:.2f} ms; {m['cpu_us_per_request']:.1f} µs; {m['upstream_connections']:.0f} | | |")
                lines.append(f"| proxy, {case}, {name} | CPU per request: the proxy (in the kernel), the upstream, wrk; the whole machine, and its cores busy | {m['cpu_us_per_request']:.1f} ({m['kernel_cpu_us_per_request']:.1f}), {m['upstream_cpu_us_per_request']:.1f}, {m['load_cpu_us_per_request']:.1f}; {m['machine_cpu_us_per_request']:.1f} µs, {m['busy_cores']:.2f} | | |")
            r = px["ratios"][case]
            lines.append(f"| proxy, {case} | token-broker ÷ nginx req/s (median of rounds; each round) | {r['rps']:.2f} ({', '.join(f'{v:.2f}' for v in r['rps_per_round'])}) | ≥ 0.8 | {'yes' if r['rps'] >= 0.8 else 'no'} |")
            lines.append(f"| proxy, {case} | token-broker ÷ nginx p99 (median of rounds) | {r['p99']:.2f} | ≤ 1.5 | {'yes' if r['p99'] <= 1.5 else 'no'} |")
            lines.append(f"| proxy, {case} | the proxy's CPU per request at which the broker's rounds would have made 0.8 × nginx (median of rounds; each round) | {r['budget_us']:.1f} µs ({', '.join(f'{v:.1f}' for v in r['budget_us_per_round'])}) | | |")
            if "floor_rps" in r:
                lines.append(f"| proxy, {case} | C floor ÷ nginx req/s (median of rounds; each round); p99 ratio | {r['floor_rps']:.2f} ({', '.join(f'{v:.2f}' for v in r['floor_rps_per_round'])}); {r['floor_p99']:.2f} | | |")
                lines.append(f"| proxy, {case} | the C floor's CPU per request at which its rounds would have made 0.8 × nginx (median of rounds) | {r['floor_budget_us']:.1f} µs | | |")
    h = ma["healthy"]
    lines.append(f"| manners, healthy issuer | fetches in {h['seconds']} s with 30 s tokens (rule: {h['expected'][0]}–{h['expected'][1]}) | {h['upstream_fetches']} | rule ± 1 | {'yes' if h['within_rule'] else 'no'} |")
    f = ma["failing"]
    lines.append(f"| manners, failing issuer | intervals between fetches, observed vs expected (ms) | {f['observed_ms']} vs {f['expected_ms']} | backoff, then 5 s | |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=int, default=6)
    parser.add_argument("--waiters", type=int, default=10000)
    parser.add_argument("--bursts", type=int, default=3)
    parser.add_argument("--manners-seconds", type=int, default=300)
    parser.add_argument("--c-server", default=os.path.join(ROOT, ".build/bench/minimal"))
    parser.add_argument("--longpoll-client", default=os.path.join(ROOT, ".build/bench/longpoll"))
    parser.add_argument("--release-all", default=os.path.join(ROOT, ".build/bench/release-all"))
    parser.add_argument("--mhd-release-all", default=os.path.join(ROOT, ".build/bench/mhd-release-all"))
    parser.add_argument("--footprint-floor", default=os.path.join(ROOT, ".build/bench/footprint-floor"))
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    parser.add_argument("--children", type=int, default=1000)
    parser.add_argument("--proxy-case", dest="proxy_cases", action="append", choices=list(PROXY_CASES),
                        help="with --only proxy: measure only this case (repeatable)")
    parser.add_argument("--proxy-baseline", help="with --only proxy: an earlier broker binary, measured in the same rotation")
    parser.add_argument("--longpoll-proxied", action="store_true",
                        help="with --only longpoll: the broker has a proxy configured, so its token listener runs on the libcurl loops")
    parser.add_argument("--only", choices=["cached", "longpoll", "templates", "compat", "store", "proxy"], help="run one benchmark and print its JSON (for profiling work)")
    options = parser.parse_args()
    if options.only == "cached":
        print(json.dumps(cached_token(options.rounds, options.seconds, options.c_server)["median"], indent=1))
        return
    if options.only == "templates":
        print(json.dumps(template_children(options.rounds, options.seconds, options.children), indent=1))
        return
    if options.only == "store":
        result = token_store(options.rounds, options.seconds)
        print(json.dumps({"median": result["median"], "rps_ratio": result["rps_ratio"], "fleets": result["fleets"]}, indent=1))
        return
    if options.only == "proxy":
        result = proxy_mode(options.rounds, options.seconds, options.proxy_cases, options.proxy_baseline)
        print(json.dumps({"median": result["median"], "ratios": result["ratios"]}, indent=1))
        return
    if options.only == "compat":
        result = compat_answers(options.rounds, options.seconds, options.c_server)
        print(json.dumps({key: result[key] for key in ("median", "floor_median", "rps_ratio") if key in result}, indent=1))
        return
    floors = {
        "libmicrohttpd": lambda mode: [options.mhd_release_all, str(options.waiters)],
        "bare": lambda mode: [options.release_all, str(options.waiters), mode],
    }
    if options.only == "longpoll":
        result = without_arrivals(long_poll(options.waiters, options.bursts, options.longpoll_client, floors,
                                            proxied=options.longpoll_proxied))
        result.pop("samples")
        print(json.dumps(result, indent=1))
        return
    os.makedirs(options.out, exist_ok=True)

    results = {"machine": {"cpus": os.cpu_count(), "kernel": os.uname().release}}
    print("1/9 cached GET /token ...", flush=True)
    results["cached_token"] = cached_token(options.rounds, options.seconds, options.c_server)
    print("2/9 long-poll scale ...", flush=True)
    results["long_poll"] = long_poll(options.waiters, options.bursts, options.longpoll_client, floors)
    print("3/9 coalescing ...", flush=True)
    results["coalescing"] = coalescing()
    print("4/9 footprint ...", flush=True)
    runs, floor = [], []
    for _ in range(5):  # alternated: the broker, then the floor program
        runs.append(startup.one_run(BINARY))
        floor.append(startup.idle_memory_kb([options.footprint_floor]))
    stripped = os.path.join(tempfile.mkdtemp(), "token-broker")
    subprocess.run(["strip", "-o", stripped, BINARY], check=True)
    reference = CServer(os.devnull, options.c_server)
    time.sleep(2)
    c_rss = rss_mib(reference.pid)
    reference.stop()
    median_mib = lambda rows, column: statistics.median(r[column] for r in rows) / 1024
    results["footprint"] = {"ready_ms": statistics.median(r[0] for r in runs) * 1000, "idle_rss_mib": median_mib(runs, 1),
                            "idle_anon_mib": median_mib(runs, 2), "idle_file_mib": median_mib(runs, 3),
                            "floor_rss_mib": median_mib(floor, 0), "floor_anon_mib": median_mib(floor, 1), "floor_file_mib": median_mib(floor, 2),
                            "binary_mb": os.path.getsize(BINARY) / 1e6, "stripped_mb": os.path.getsize(stripped) / 1e6,
                            "c_server_idle_rss_mib": c_rss}
    print(f"5/9 manners ({options.manners_seconds} s healthy, 19 s failing) ...", flush=True)
    results["manners"] = manners(options.manners_seconds)
    print(f"6/9 template children ({options.children}) ...", flush=True)
    results["template_children"] = template_children(options.rounds, options.seconds, options.children)
    print("7/9 compatibility answers ...", flush=True)
    results["compat"] = compat_answers(options.rounds, options.seconds, options.c_server)
    print("8/9 token store (Redis against memory; fleets of 1, 5, 20) ...", flush=True)
    results["token_store"] = token_store(options.rounds, options.seconds)
    print("9/9 proxy mode against nginx proxy_pass ...", flush=True)
    results["proxy"] = proxy_mode(options.rounds, options.seconds)

    plot(results["long_poll"], os.path.join(options.out, "rss.png"))
    plot_wakeups(results["long_poll"], os.path.join(options.out, "wakeups.png"))
    results["long_poll"] = without_arrivals(results["long_poll"])
    with open(os.path.join(options.out, "results.json"), "w") as handle:
        json.dump(results, handle, indent=2)
    table = markdown(results)
    with open(os.path.join(options.out, "results.md"), "w") as handle:
        handle.write(table)
    print(table)


if __name__ == "__main__":
    main()
