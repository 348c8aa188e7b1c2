import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from broker import Broker  # noqa: E402


@pytest.fixture(autouse=True)
def no_sanitizer_reports():
    """After each test, stops the brokers it left running and fails on any sanitizer report."""
    Broker.started.clear()
    yield
    for broker in Broker.started:
        if broker.process.poll() is None:
            broker.stop()
        broker.check_sanitizer_reports()
    Broker.started.clear()


@pytest.fixture
def broker():
    """A broker on the embedded default, on ephemeral loopback ports."""
    with Broker() as running:
        yield running


@pytest.fixture
def tmp_key(tmp_path):
    """Makes a private key with the openssl command line: make(kind) -> path."""

    def make(kind):
        path = tmp_path / f"{kind}.pem"
        if kind == "ec":
            options = ["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"]
        else:
            options = ["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"]
        subprocess.run(["openssl", "genpkey", *options, "-out", str(path)], check=True, capture_output=True)
        return str(path)

    return make
