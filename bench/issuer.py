"""A counting token issuer for the benchmarks, in a thread on 127.0.0.1.

Answers `POST /token` with a fresh opaque token. It records the time of every request, so the
benchmarks count upstream fetches where they happen, at the issuer. `delay` holds each answer
back; `failing` answers 503 instead.
"""
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class CountingIssuer:
    def __init__(self, lifetime=30, delay=0.0):
        self.lifetime = lifetime
        self.delay = delay
        self.failing = False
        self.times = []
        self.lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with owner.lock:
                    owner.times.append(time.monotonic())
                    number = len(owner.times)
                if owner.delay:
                    time.sleep(owner.delay)
                if owner.failing:
                    body, status = b'{"error":"temporarily_unavailable"}', 503
                else:
                    body, status = json.dumps({"access_token": f"bench-{number}", "token_type": "Bearer", "expires_in": owner.lifetime}).encode(), 200
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server.server_port}/token"

    @property
    def count(self):
        with self.lock:
            return len(self.times)

    def close(self):
        self.server.shutdown()
        self.server.server_close()
