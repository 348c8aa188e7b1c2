"""The contract run's proxy target: answers every method on every path with 200 and a small JSON body.

    python upstream.py      (prints `listening 127.0.0.1:PORT`, serves until killed)
"""
import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Head and body go out in separate writes; with Nagle, a reused connection would hold the
    # body for the peer's delayed ACK (40 ms).
    disable_nagle_algorithm = True

    def log_message(self, *args):
        pass

    def answer(self):
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            while (size := int(self.rfile.readline().split(b";")[0], 16)) > 0:
                self.rfile.read(size + 2)
            self.rfile.readline()
        else:
            self.rfile.read(int(self.headers.get("Content-Length", 0) or 0))
        body = json.dumps({"method": self.command, "target": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = answer


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256

    def handle_error(self, request, client_address):
        pass  # a client (the broker) that stopped an exchange, as it does when its own client leaves


server = Server(("127.0.0.1", 0), Handler)
print(f"listening 127.0.0.1:{server.server_port}", flush=True)
server.serve_forever()
