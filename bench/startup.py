#!/usr/bin/env python3
"""Footprint of the broker on its embedded default: exec → first /healthz 200, and idle RSS.

    python3 bench/startup.py [path/to/token-broker] [--runs 20]

Each run starts the binary on ephemeral loopback ports, polls the admin listener's /healthz every
millisecond until it answers 200 (at most 5 s), then, after 2 s idle, reads VmRSS (and its
anonymous and file-backed parts, RssAnon and RssFile) from /proc/PID/status. Prints the median,
minimum and maximum of each, and the binary's size.
"""
import argparse
import os
import re
import socket
import statistics
import subprocess
import tempfile
import time

LISTENING = re.compile(rb"msg=listening listener=admin address=127\.0\.0\.1:(\d+)")


def one_run(binary):
    log = tempfile.TemporaryFile()
    env = {"TOKEN_BROKER_LISTEN": "127.0.0.1:0", "TOKEN_BROKER_ADMIN_LISTEN": "127.0.0.1:0", "PATH": "/usr/bin:/bin"}
    started = time.monotonic()
    process = subprocess.Popen([binary], stderr=log, stdout=subprocess.DEVNULL, env=env)
    try:
        port = None
        deadline = started + 5
        while time.monotonic() < deadline:
            if port is None:
                log.seek(0)
                found = LISTENING.search(log.read())
                if found:
                    port = int(found.group(1))
            if port is not None:
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=1) as client:
                        client.sendall(b"GET /healthz HTTP/1.1\r\nHost: b\r\nConnection: close\r\n\r\n")
                        if client.recv(64).startswith(b"HTTP/1.1 200"):
                            ready = time.monotonic() - started
                            break
                except OSError:
                    pass
            time.sleep(0.001)
        else:
            raise RuntimeError("no /healthz 200 within 5 s")
        time.sleep(2)
        return (ready,) + memory_kb(process.pid)
    finally:
        process.terminate()
        process.wait(5)


def memory_kb(pid):
    """(VmRSS, RssAnon, RssFile) of a process, in kB; zeros for a process that has exited."""
    with open(f"/proc/{pid}/status") as status:
        fields = dict(line.split(":", 1) for line in status)
    return tuple(int(fields.get(name, "0").split()[0]) for name in ("VmRSS", "RssAnon", "RssFile"))


def idle_memory_kb(command):
    """(VmRSS, RssAnon, RssFile) of a program that prints "ready" once started, 2 s later."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        if process.stdout.readline().strip() != "ready":
            raise RuntimeError(f"{command[0]} did not start")
        time.sleep(2)
        return memory_kb(process.pid)
    finally:
        process.terminate()
        process.wait(5)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("binary", nargs="?", default=os.path.join(os.path.dirname(__file__), "../.build/release/token-broker"))
    parser.add_argument("--runs", type=int, default=20)
    options = parser.parse_args()
    results = [one_run(options.binary) for _ in range(options.runs)]
    ready = [r[0] * 1000 for r in results]
    rss = [r[1] / 1024 for r in results]
    anon = [r[2] / 1024 for r in results]
    print(f"runs: {options.runs}")
    print(f"exec to first /healthz 200: median {statistics.median(ready):.1f} ms (min {min(ready):.1f}, max {max(ready):.1f})")
    print(f"idle RSS after 2 s: median {statistics.median(rss):.1f} MiB (min {min(rss):.1f}, max {max(rss):.1f}), anonymous {statistics.median(anon):.1f} MiB")
    print(f"binary size: {os.path.getsize(options.binary) / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
