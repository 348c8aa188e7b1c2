"""A token endpoint that sends the same raw bytes to every request, for answers no HTTP server
library would write: trailers, repeated or conflicting header fields, a head that is not HTTP.

Runs in a thread of the test process on 127.0.0.1. Each connection is read up to the end of its
request (the head, and the body its Content-Length says), answered with `answer`, and closed.
"""
import socket
import threading


class RawIssuer:
    def __init__(self, answer):
        self.answer = answer
        self.requests = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}/token"

    def serve(self):
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self.handle, args=(connection,), daemon=True).start()

    def handle(self, connection):
        with connection:
            connection.settimeout(10)
            try:
                data = b""
                while b"\r\n\r\n" not in data and len(data) < 1 << 20:
                    chunk = connection.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                head, _, body = data.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value.strip())
                while len(body) < length:
                    chunk = connection.recv(65536)
                    if not chunk:
                        return
                    body += chunk
                self.requests += 1
                connection.sendall(self.answer)
                connection.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def close(self):
        self.listener.close()
