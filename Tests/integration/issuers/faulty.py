"""A token endpoint that answers however a test tells it to, to check bad upstream answers.

Runs in a thread of the test process on 127.0.0.1. `mode` picks the answer:
ok, html, no_token, negative, zero, huge, oversized, slow, hang, reset, status_500, status_429,
status_503 (503 with `Retry-After: retry_after`, 120 unless the test set it), redirect, echo (a 400 whose error_description repeats the request's Authorization, X-Api-Key and
body, as some issuers do, with DEL and a terminal's CSI in it), echo_encoded (a 400 whose
error_description repeats the client secret the request sent, percent-encoded again as
urllib.parse.quote writes it, with every byte escaped in lower-case hex, and the request's
form of it encoded again; with Basic credentials, also those without their padding), body (200 with `body`, a JSON value
or bytes, as the test set it). With `tls=(certificate, key)` it speaks HTTPS; with `client_ca` as well, it wants a client
certificate signed by that CA (mutual TLS), and records the subject of each it saw.
"""
import base64
import json
import socket
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import quote, unquote_plus


class FaultyIssuer:
    def __init__(self, tls=None, client_ca=None):
        self.mode = "ok"
        self.body = {}
        self.retry_after = "120"
        self.scheme = "https" if tls else "http"
        self.requests = 0
        self.served = 0
        self.client_subjects = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                length = int(self.headers.get("Content-Length", 0))
                self.request_body = self.rfile.read(length)
                owner.requests += 1
                if client_ca:
                    peer = self.connection.getpeercert()
                    owner.client_subjects.append(dict(item[0] for item in peer["subject"]).get("commonName"))
                owner.answer(self)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        if tls:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            if client_ca:
                context.verify_mode = ssl.CERT_REQUIRED
                context.load_verify_locations(client_ca)
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self):
        return f"{self.scheme}://127.0.0.1:{self.server.server_port}/token"

    def send(self, handler, status, body, content_type="application/json", headers=()):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(data)))
        for name, value in headers:
            handler.send_header(name, value)
        handler.end_headers()
        handler.wfile.write(data)

    def answer(self, handler):
        mode = self.mode
        if mode == "ok":
            self.served += 1
            self.send(handler, 200, {"access_token": f"good-{self.served}", "token_type": "bearer", "expires_in": 30})
        elif mode == "html":
            self.send(handler, 200, b"<html><body>Welcome to the captive portal</body></html>", "text/html")
        elif mode == "no_token":
            self.send(handler, 200, {"token_type": "Bearer", "expires_in": 30})
        elif mode in ("negative", "zero", "huge"):
            self.send(handler, 200, {"access_token": "bad", "expires_in": {"negative": -5, "zero": 0, "huge": 10**12}[mode]})
        elif mode == "oversized":
            self.send(handler, 200, b'{"access_token": "' + b"x" * (2 << 20) + b'"}')
        elif mode == "slow":
            time.sleep(3)
            self.send(handler, 200, {"access_token": "late", "expires_in": 30})
        elif mode == "hang":
            time.sleep(30)
        elif mode == "reset":
            handler.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            handler.connection.close()
        elif mode == "status_500":
            self.send(handler, 500, {"error": "server_error"})
        elif mode == "redirect":
            self.send(handler, 302, b"", headers=[("Location", "http://127.0.0.1:1/elsewhere")])
        elif mode == "echo":
            sent = " ".join([handler.headers.get("Authorization", ""), handler.headers.get("X-Api-Key", ""),
                             handler.request_body.decode(errors="replace")])
            self.send(handler, 400, {"error": "invalid_client", "error_description": f"you sent {sent} \x7f\x9b31m"})
        elif mode == "echo_encoded":
            # The secret as the request carried it (form-encoded), in the body or the Basic credentials.
            sent = dict(field.split("=", 1) for field in handler.request_body.decode().split("&")).get("client_secret", "")
            authorization = handler.headers.get("Authorization", "")
            if authorization.startswith("Basic "):
                sent = base64.b64decode(authorization[6:]).decode().split(":", 1)[1]
            secret = unquote_plus(sent)
            encoded = [quote(secret), quote(secret, safe=""), "".join("%%%02x" % byte for byte in secret.encode()),
                       quote(sent, safe="")]  # the request's form, encoded again
            if authorization.startswith("Basic "):
                encoded.append(authorization[6:].rstrip("="))  # the credentials without their padding
            self.send(handler, 400, {"error": "invalid_client", "error_description": "you sent " + " and ".join(encoded)})
        elif mode == "body":
            self.served += 1
            self.send(handler, 200, self.body)
        elif mode == "status_429":
            self.send(handler, 429, {"error": "slow_down"}, headers=[("Retry-After", "2")])
        elif mode == "status_503":
            self.send(handler, 503, {"error": "temporarily_unavailable"}, headers=[("Retry-After", self.retry_after)])

    def close(self):
        self.server.shutdown()
        self.server.server_close()
