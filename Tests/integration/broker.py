"""Starts the real token-broker binary on ephemeral loopback ports and talks to it over HTTP.

Only 127.0.0.1 and ::1 are ever contacted, and every wait is bounded.
"""
import http.client
import json
import os
import re
import signal
import subprocess
import tempfile
import time

BINARY = os.environ.get("TOKEN_BROKER_BIN", os.path.join(os.path.dirname(__file__), "../../.build/release/token-broker"))
# Set by `make sanitize` ("address", "thread") when BINARY is a debug build with that sanitizer.
SANITIZER = os.environ.get("TOKEN_BROKER_SANITIZER", "")
# The "listening" lines, in logfmt and in JSON (`"logFormat": "json"`).
LISTENING = re.compile(r"msg=listening listener=(token|admin) address=(\S+)"
                       r'|"msg":"listening","listener":"(token|admin)","address":"([^"]+)"')
# The request guard's header, sent by default; tests of the guard leave it out.
GUARD = {"Token-Broker-Request": "true"}
# Settings of the sanitizers (`make sanitize`), handed on to every broker, whose environment is
# otherwise built from nothing.
SANITIZER_ENVIRONMENT = re.compile(r"^(ASAN|TSAN|LSAN|UBSAN|MSAN)_OPTIONS$|^LLVM_SYMBOLIZER_PATH$")
# The first line of a sanitizer's report, in a broker's stderr. Looked for in every run, not only
# in sanitizer builds, since it costs nothing.
SANITIZER_REPORT = re.compile(
    r"ERROR: AddressSanitizer|WARNING: ThreadSanitizer|ERROR: LeakSanitizer|runtime error: |SUMMARY: \w*Sanitizer")


def base_environment():
    """A broker's environment before a test adds to it: PATH and the sanitizers' settings."""
    environment = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    environment.update({name: value for name, value in os.environ.items() if SANITIZER_ENVIRONMENT.match(name)})
    return environment


def check_sanitizer_reports(text, what="the broker"):
    """Fails with the first report when `text` (a broker's stderr) holds a sanitizer's report."""
    found = SANITIZER_REPORT.search(text)
    if found:
        start = text.rfind("\n", 0, found.start()) + 1
        reports = len(SANITIZER_REPORT.findall(text))
        excerpt = "\n".join(text[start:].splitlines()[:60])
        raise AssertionError(f"{what} reported {reports} sanitizer finding(s); the first:\n{excerpt}")


class Broker:
    """One running broker process; use as a context manager.

    Its stderr is checked for sanitizer reports when it is stopped, and again by the test's
    teardown (conftest.py), which also stops any broker a test left running.
    """

    # Every broker started, for the teardown's check.
    started = []

    def __init__(self, config=None, env=None, args=(), listen="127.0.0.1:0", admin="127.0.0.1:0", binary=None, umask=-1,
                 fetching=None):
        """`umask`, when not -1, is the broker's file-creation mask (the files it writes, token files among them).

        `fetching` names the providers whose first fetch to wait for, where `config` cannot tell
        (a configuration given some other way); empty for none (a stand-in for the binary)."""
        self.workdir = tempfile.mkdtemp(prefix="token-broker-it-")
        self.log_path = os.path.join(self.workdir, "stderr.log")
        command = [binary or BINARY, *args]
        if config is not None:
            config_path = os.path.join(self.workdir, "config.json")
            with open(config_path, "w") as handle:
                json.dump(config, handle)
            command += ["--config", config_path]
        environment = base_environment()
        if listen:
            environment["TOKEN_BROKER_LISTEN"] = listen
        if admin:
            environment["TOKEN_BROKER_ADMIN_LISTEN"] = admin
        environment.update(env or {})
        self.log = open(self.log_path, "w+")
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=self.log, env=environment, umask=umask)
        self.checked = False
        Broker.started.append(self)
        self.addresses = self._wait_for_listeners()
        self.fetching = fetching
        self._wait_for_first_fetches(config)

    def _wait_for_listeners(self, timeout=15):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = {a or c: b or d for a, b, c, d in LISTENING.findall(self.stderr())}
            if len(found) == 2:
                return found
            if self.process.poll() is not None:
                raise RuntimeError(f"broker exited with {self.process.returncode}:\n{self.stderr()}")
            time.sleep(0.02)
        raise RuntimeError(f"broker did not start listening in {timeout}s:\n{self.stderr()}")

    def _wait_for_first_fetches(self, config, timeout=10):
        """Waits until each provider that fetches at start has fetched once, or failed to.

        The broker listens before its first fetch (it answers 503 until then, as documented), and
        most tests want a token at once: a release build has it a few milliseconds after it
        listens, but on a loaded machine, or in a sanitizer build (up to twenty times slower), a
        test's first request could come first. Never failing: a fetch that takes longer leaves
        the test to find out. A template (`perRequest`) fetches nothing at start: its children are
        made on request, and each child's first request waits for its first token.
        """
        if self.fetching is not None:
            names = list(self.fetching)
        else:
            providers = (config or {}).get("providers") if isinstance(config, dict) else None
            providers = providers or [{}]
            if not isinstance(providers, list) or not all(isinstance(provider, dict) for provider in providers):
                return
            names = [provider.get("name", "default") for provider in providers
                     if provider.get("backgroundRefreshEnabled", True) and not provider.get("pauseWhenIdle", False)
                     and not provider.get("perRequest")]
        fetched = [re.compile(rf'msg="token fetch(ed| failed)" provider={re.escape(str(name))}( |$)'
                              rf'|"msg":"token fetch(ed| failed)","provider":{re.escape(json.dumps(str(name)))}[,}}]', re.M)
                   for name in names]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.process.poll() is None:
            log = self.stderr()
            if all(pattern.search(log) for pattern in fetched):
                return
            time.sleep(0.01)

    def stderr(self):
        with open(self.log_path) as handle:
            return handle.read()

    def url(self, path, listener="token"):
        return f"http://{self.addresses[listener]}{path}"

    def request(self, method, path, listener="token", headers=None, body=None, timeout=10, guard=True):
        """One request on a new connection: (status, headers dict with lower-case names, body bytes)."""
        host, port = self._split(listener)
        connection = http.client.HTTPConnection(host, port, timeout=timeout)
        try:
            connection.request(method, path, body=body, headers={**(GUARD if guard else {}), **(headers or {})})
            response = connection.getresponse()
            return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
        finally:
            connection.close()

    def get_json(self, path, listener="token", expect=200, **kwargs):
        status, headers, body = self.request("GET", path, listener, **kwargs)
        assert status == expect, (status, body)
        return json.loads(body), headers

    def metrics(self):
        """The admin listener's /metrics, parsed by prometheus_client: {(name, labels tuple): value}."""
        from prometheus_client.parser import text_string_to_metric_families

        status, _, body = self.request("GET", "/metrics", listener="admin")
        assert status == 200
        samples = {}
        for family in text_string_to_metric_families(body.decode()):
            for sample in family.samples:
                samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
        return samples

    def metric(self, name, **labels):
        return self.metrics().get((name, tuple(sorted(labels.items()))), 0)

    def fetches(self, provider="default"):
        """Upstream fetches that succeeded, from the broker's own log lines."""
        log = self.stderr()
        return log.count(f'msg="token fetched" provider={provider} ') + log.count(
            f'"msg":"token fetched","provider":"{provider}",')

    def connection(self, listener="token", timeout=10):
        host, port = self._split(listener)
        return http.client.HTTPConnection(host, port, timeout=timeout)

    def _split(self, listener):
        address = self.addresses[listener]
        host, _, port = address.rpartition(":")
        return host.strip("[]"), int(port)

    def stop(self, sig=signal.SIGTERM, timeout=10):
        """Sends `sig` and returns the exit status, waiting at most `timeout` seconds."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            status = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=5)
            raise AssertionError(f"broker did not stop within {timeout}s after {sig!r}")
        self.check_sanitizer_reports()
        return status

    def check_sanitizer_reports(self):
        """Fails when the broker's stderr holds a sanitizer's report; once, after it has exited."""
        if self.checked:
            return
        self.checked = self.process.poll() is not None
        check_sanitizer_reports(self.stderr(), f"the broker (log {self.log_path})")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        try:
            if self.process.poll() is None:
                self.stop()
            elif exc[0] is None:
                self.check_sanitizer_reports()
        finally:
            self.log.close()
        return False


def run_broker(*args, env=None, timeout=30):
    """Runs the binary to completion (for --help, --check-config, healthcheck)."""
    environment = base_environment()
    environment.update(env or {})
    result = subprocess.run([BINARY, *args], capture_output=True, text=True, env=environment, timeout=timeout)
    check_sanitizer_reports(result.stderr, f"token-broker {' '.join(args)}")
    return result
