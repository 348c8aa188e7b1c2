"""A resource server that checks tokens on its own, for proxy-mode tests.

    python resource_server.py        (prints `listening 127.0.0.1:PORT`)

Every route under `/api/` wants `Authorization: Bearer <JWT>` (or the token in the cookie or
header named by `/admin/config`), verified with PyJWT against the broker's JWKS; otherwise 401
with `WWW-Authenticate`. Tokens can be revoked one by one, as an issuer would.

- `ANY /api/echo/...`: what arrived, as JSON: method, raw target, headers, body length and SHA-256.
  Header values are as http.server reads them, each byte one Latin-1 character, so
  `.encode("latin-1")` gives back the bytes sent. With `?raw_header=1`, the answer also carries
  `X-Raw: caf<E9> <FF> end`, with bytes that are not UTF-8, `X-Raw-Utf8: caf<C3 A9>`, UTF-8,
  and `X-Raw-Empty:` with an empty value.
- `GET /api/big?bytes=N`: N bytes, chunked; the rest waits after the first 64 KiB until
  `/admin/release` (to prove the answer streams).
- `GET /api/slow?seconds=S`: answers after S seconds.
- `ANY /api/status/CODE?header=NAME`: answers CODE, with header NAME if given.
- `POST /api/refuse-early`: 403 before reading the body, then closes gracefully (a lingering close).
- `POST /api/head-then-reset`: a 403 head promising a 20-byte body, before reading the request
  body; then, a moment later, resets the connection without sending that body.
- `POST /admin/config` `{"jwks": URL, "cookie": NAME, "header": NAME}`; `POST /admin/revoke`
  `{"token": T}`; `POST /admin/release`; `GET /admin/stats`: counts by status, and the requests seen.
"""
import hashlib
import json
import socket
import struct
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import jwt

CONFIG = {"jwks": None, "cookie": None, "header": None}
REVOKED = set()
STATS = {"statuses": {}, "seen": []}
LOCK = threading.Lock()
RELEASE = threading.Event()
JWKS_CLIENT = {}


def verify(token):
    if token in REVOKED:
        return False
    url = CONFIG["jwks"]
    client = JWKS_CLIENT.setdefault(url, jwt.PyJWKClient(url, cache_keys=False))
    try:
        key = client.get_signing_key_from_jwt(token)
        jwt.decode(token, key.key, algorithms=["ES256", "RS256"], audience="token-broker")
        return True
    except jwt.PyJWTError:
        return False


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Head and body go out in separate writes; with Nagle, a reused connection would hold the
    # body for the peer's delayed ACK (40 ms).
    disable_nagle_algorithm = True

    def log_message(self, *args):
        pass

    def read_body(self):
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            body = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if size == 0:
                    self.rfile.readline()
                    return body
                body += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length", 0) or 0))

    def answer(self, status, body=b"", headers=()):
        with LOCK:
            STATS["statuses"][str(status)] = STATS["statuses"].get(str(status), 0) + 1
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def presented_token(self):
        if CONFIG["header"]:
            return self.headers.get(CONFIG["header"])
        if CONFIG["cookie"]:
            for pair in self.headers.get("Cookie", "").split(";"):
                name, _, value = pair.strip().partition("=")
                if name == CONFIG["cookie"]:
                    return value
            return None
        authorization = self.headers.get("Authorization", "")
        return authorization[7:] if authorization.startswith("Bearer ") else None

    def handle_any(self):
        split = urlsplit(self.path)
        if split.path == "/api/refuse-early":
            # Answers before reading the body, as servers do with uploads they will not take;
            # then closes as they do (nginx's lingering close, RFC 9112 §9.6): stops writing, and
            # reads and drops what the client still sends for a while, so that no reset of unread
            # data can destroy the answer before the client reads it. (`head-then-reset` resets.)
            self.close_connection = True
            self.answer(403, b'{"error":"not_here"}', [("Connection", "close")])
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_WR)
            self.connection.settimeout(1)
            deadline = time.monotonic() + 5
            try:
                while time.monotonic() < deadline and self.connection.recv(65536):
                    pass
            except OSError:
                pass
            return None
        if split.path == "/api/head-then-reset":
            self.close_connection = True
            self.send_response(403)
            self.send_header("Content-Length", "20")
            self.end_headers()
            time.sleep(0.2)  # long enough for the proxy to take the head before the reset
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
            return None
        body = self.read_body()
        if split.path.startswith("/admin/"):
            return self.admin(split.path, body)
        with LOCK:
            STATS["seen"].append({"method": self.command, "target": self.path, "headers": [[k, v] for k, v in self.headers.items()],
                                  "body_length": len(body), "token": self.presented_token()})
        token = self.presented_token()
        if not token or not verify(token):
            return self.answer(401, b'{"error":"invalid_token"}', [("WWW-Authenticate", 'Bearer error="invalid_token"'), ("Content-Type", "application/json")])
        query = parse_qs(split.query)
        if split.path.startswith("/api/echo"):
            document = {"method": self.command, "target": self.path, "headers": [[k, v] for k, v in self.headers.items()],
                        "body_length": len(body), "body_sha256": hashlib.sha256(body).hexdigest()}
            # send_header writes each character as one Latin-1 byte: these go out as the bytes written.
            raw = ([("X-Raw", "caf\xe9 \xff end"), ("X-Raw-Utf8", "caf\xc3\xa9"), ("X-Raw-Empty", "")]
                   if "raw_header" in query else [])
            return self.answer(200, json.dumps(document).encode(), [("Content-Type", "application/json"), ("Set-Cookie", "a=1"),
                                                                     ("Set-Cookie", "b=2"), ("X-Upstream", "yes"),
                                                                     ("Connection", "X-Hop"), ("X-Hop", "must-not-pass"), *raw])
        if split.path == "/api/big":
            return self.big(int(query["bytes"][0]))
        if split.path == "/api/slow":
            time.sleep(float(query["seconds"][0]))
            return self.answer(200, b"late")
        if split.path.startswith("/api/status/"):
            code = int(split.path.rsplit("/", 1)[1])
            headers = [(query["header"][0], "challenge")] if "header" in query else []
            return self.answer(code, b'{"status":%d}' % code, headers)
        return self.answer(404, b"{}")

    def big(self, total):
        with LOCK:
            STATS["statuses"]["200"] = STATS["statuses"].get("200", 0) + 1
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Content-Type", "application/octet-stream")
        self.end_headers()
        sent = 0
        while sent < total:
            if sent >= 65536 and not RELEASE.wait(30):
                return
            size = min(65536, total - sent)
            chunk = bytes((sent + i) % 251 for i in range(size))
            self.wfile.write(b"%x\r\n" % size + chunk + b"\r\n")
            self.wfile.flush()
            sent += size
        self.wfile.write(b"0\r\n\r\n")

    def admin(self, path, body):
        if path == "/admin/config":
            CONFIG.update(json.loads(body))
        elif path == "/admin/revoke":
            REVOKED.add(json.loads(body)["token"])
        elif path == "/admin/release":
            RELEASE.set()
        elif path == "/admin/reset":
            with LOCK:
                STATS["statuses"], STATS["seen"] = {}, []
            RELEASE.clear()
        elif path == "/admin/stats":
            with LOCK:
                payload = json.dumps(STATS).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        self.send_response(204)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = handle_any


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # the default 5 would refuse a burst of proxied requests


def main():
    server = Server(("127.0.0.1", 0), Handler)
    print(f"listening 127.0.0.1:{server.server_port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
