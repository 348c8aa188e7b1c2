"""Proxy mode's upstream loops: connections reused, answers that come whole or trickle, trailers,
and many exchanges at once, against an upstream written on raw sockets that counts what it sees.
"""
import concurrent.futures
import socket
import threading
import time

import pytest

from broker import GUARD, Broker


class CountingUpstream:
    """An HTTP/1.1 upstream on 127.0.0.1 that keeps connections open and counts them.

    `/small` answers 2 bytes with Content-Length; `/trickle` sends its head and `first`, then
    waits for `release` before the rest; `/trailers` answers chunked with a trailer field;
    `/sized/N` answers N bytes; any other path answers 404.
    """

    def __init__(self):
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(512)
        self.address = "127.0.0.1:%d" % self.listener.getsockname()[1]
        self.accepted = 0
        self.requests = 0
        self.lock = threading.Lock()
        self.release = threading.Event()
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.closed:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            with self.lock:
                self.accepted += 1
            threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    def _serve(self, connection):
        connection.settimeout(30)
        buffered = b""
        try:
            while True:
                while b"\r\n\r\n" not in buffered:
                    data = connection.recv(65536)
                    if not data:
                        return
                    buffered += data
                head, buffered = buffered.split(b"\r\n\r\n", 1)
                lines = head.decode("latin-1").split("\r\n")
                length = 0
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value.strip())
                while len(buffered) < length:
                    data = connection.recv(65536)
                    if not data:
                        return
                    buffered += data
                buffered = buffered[length:]
                with self.lock:
                    self.requests += 1
                self._answer(connection, lines[0].split(" ")[1])
        except OSError:
            return
        finally:
            connection.close()

    def _answer(self, connection, path):
        if path == "/small":
            connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok")
        elif path.startswith("/sized/"):
            size = int(path.split("/")[2])
            connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size + bytes(i % 251 for i in range(size)))
        elif path == "/trickle":
            connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\nX-Trickle: yes\r\n\r\nfirst")
            self.release.wait(30)
            connection.sendall(b"-rest")
        elif path == "/trailers":
            connection.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Late\r\n\r\n"
                               b"5\r\nhello\r\n0\r\nX-Late: trailer-value\r\n\r\n")
        else:
            connection.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")

    def counts(self):
        with self.lock:
            return self.accepted, self.requests

    def close(self):
        self.closed = True
        self.release.set()
        self.listener.close()


@pytest.fixture
def upstream():
    server = CountingUpstream()
    yield server
    server.close()


@pytest.fixture
def broker(upstream):
    with Broker({"proxies": [{"name": "u", "target": "http://" + upstream.address}]}) as running:
        yield running


def test_sequential_requests_reuse_one_upstream_connection_per_loop(broker, upstream):
    connection = broker.connection(timeout=10)
    for _ in range(200):
        connection.request("GET", "/proxy/u/small", headers=GUARD)
        response = connection.getresponse()
        assert (response.status, response.read()) == (200, b"ok")
    connection.close()
    accepted, requests = upstream.counts()
    assert requests == 200
    # Exchanges are spread over one loop per processor (at most eight), each with its own
    # connections; none is opened twice.
    assert accepted <= 8, f"{accepted} upstream connections for 200 sequential requests"


def test_concurrent_requests_are_all_answered_and_connections_stay_bounded(broker, upstream):
    def client(_):
        connection = broker.connection(timeout=30)
        answers = []
        for _ in range(50):
            connection.request("GET", "/proxy/u/small", headers=GUARD)
            response = connection.getresponse()
            answers.append((response.status, response.read()))
        connection.close()
        return answers

    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        results = [answer for answers in pool.map(client, range(32)) for answer in answers]
    assert results == [(200, b"ok")] * (32 * 50)
    accepted, requests = upstream.counts()
    assert requests == 32 * 50
    # At most one connection per request in flight on each loop, kept and reused afterwards.
    assert accepted <= 32 + 8, f"{accepted} upstream connections for 32 clients"


def test_an_answer_that_trickles_is_passed_on_as_it_comes(broker, upstream):
    connection = broker.connection(timeout=30)
    connection.request("GET", "/proxy/u/trickle", headers=GUARD)
    response = connection.getresponse()  # the head arrives while the upstream still holds the rest
    assert response.status == 200
    assert response.getheader("X-Trickle") == "yes"
    assert response.read(5) == b"first"
    assert not upstream.release.is_set()
    upstream.release.set()
    assert response.read() == b"-rest"
    connection.close()


def test_a_trailer_never_becomes_a_header_of_the_answer(broker):
    status, headers, body = broker.request("GET", "/proxy/u/trailers")
    assert (status, body) == (200, b"hello")
    assert "x-late" not in headers


@pytest.mark.parametrize("size", [0, 1, 16383, 16384, 65535, 65536, 65537, 200_000, 1_000_000])
def test_answers_of_every_size_around_the_held_limit_arrive_whole(broker, size):
    status, headers, body = broker.request("GET", f"/proxy/u/sized/{size}", timeout=30)
    assert status == 200
    assert body == bytes(i % 251 for i in range(size))
    assert headers.get("content-length") == str(size)


def test_a_post_body_reaches_the_upstream_whole_and_the_connection_is_reused(broker, upstream):
    body = bytes(range(256)) * 256  # 64 KiB, read whole by the broker and sent with its length
    connection = broker.connection(timeout=10)
    for _ in range(20):
        connection.request("POST", "/proxy/u/small", body=body, headers={**GUARD, "Content-Type": "application/octet-stream"})
        response = connection.getresponse()
        assert (response.status, response.read()) == (200, b"ok")
    connection.close()
    accepted, requests = upstream.counts()
    assert requests == 20, "the upstream read every body whole, by its Content-Length, and found the next request after it"
    assert accepted <= 8
