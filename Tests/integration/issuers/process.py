"""Runs `oauth_server.py` as a process the tests can stop and start again on the same port."""
import json
import os
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(__file__)


class OAuthServer:
    def __init__(self, workdir, clients, lifetime=5, pkjwt_keys=(), api_key=""):
        self.arguments = [sys.executable, os.path.join(HERE, "oauth_server.py"), "--db", os.path.join(workdir, "oauth.sqlite3"),
                          "--lifetime", str(lifetime), "--api-key", api_key]
        for client_id, secret in clients.items():
            self.arguments += ["--client", f"{client_id}:{secret}"]
        for client_id, key in pkjwt_keys:
            self.arguments += ["--pkjwt-key", f"{client_id}:{key}"]
        self.log = open(os.path.join(workdir, "oauth-server.log"), "w")
        self.port = 0
        self.process = None
        self.start()

    def start(self, timeout=60):
        self.process = subprocess.Popen(self.arguments + ["--port", str(self.port)], stdout=subprocess.PIPE, stderr=self.log, text=True)
        deadline = time.monotonic() + timeout
        line = self.process.stdout.readline()
        if not line.startswith("listening ") or time.monotonic() > deadline:
            raise RuntimeError(f"the OAuth server did not start: {line!r}")
        self.port = int(line.rsplit(":", 1)[1])

    def stop(self):
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)

    @property
    def base(self):
        return f"http://127.0.0.1:{self.port}"

    def stats(self):
        with urllib.request.urlopen(self.base + "/stats", timeout=5) as response:
            return json.load(response)

    def requests(self, route="oauth2", status=None):
        counts = self.stats().get(route, {})
        return sum(counts.values()) if status is None else counts.get(str(status), 0)

    def post(self, path, document):
        request = urllib.request.Request(self.base + path, data=json.dumps(document).encode(), method="POST")
        with urllib.request.urlopen(request, timeout=5) as response:
            return json.load(response)

    def fault(self, mode, retry_after=1):
        """Makes the token endpoint misbehave (see oauth_server.py); `none` heals it."""
        return self.post("/faults", {"mode": mode, "retry_after": retry_after})

    def attempts(self, since=0.0):
        """[(arrival time, outcome)] of token requests that arrived after `since` (time.time())."""
        with urllib.request.urlopen(self.base + "/attempts", timeout=5) as response:
            return [(at, outcome) for at, outcome in json.load(response)["attempts"] if at >= since]

    def token_requests(self, route="oauth2", since=0.0):
        """What each token request to `route` (`oauth2`, `custom`) that arrived after `since` asked
        for and got, oldest first: dicts, see `GET /token-requests` in oauth_server.py."""
        with urllib.request.urlopen(self.base + "/token-requests", timeout=5) as response:
            found = json.load(response)["requests"]
        return sorted((r for r in found if r["route"] == route and r["at"] >= since), key=lambda r: r["at"])

    def issued(self, route="oauth2"):
        """{SHA-256 hex of an access token: the request it was issued for}."""
        return {r["token_sha256"]: r for r in self.token_requests(route) if "token_sha256" in r}

    def get(self, path, token=None):
        request = urllib.request.Request(self.base + path, headers={"Authorization": f"Bearer {token}"} if token else {})
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return response.status
        except urllib.error.HTTPError as error:
            return error.code

    def close(self):
        self.stop()
        self.log.close()
