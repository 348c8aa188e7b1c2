import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from broker import SANITIZER, Broker  # noqa: E402

# Tests that hold the broker to a release build's speed or memory, skipped (with the reason shown)
# when the binary is a sanitizer build (`make sanitize`), which is 2 to 20 times slower and keeps
# shadow memory. Every other test runs there.
RELEASE_BUILD_ONLY = {
    "test_proxied_requests_leave_no_memory_behind":
        "measures RSS, which the sanitizers' shadow memory and freed-memory quarantine inflate",
    "test_an_upstream_fault_is_survived_reported_retried_by_the_policy_and_healed":
        "checks retry gaps and counters against the issuer's clock at release-build speed",
    "test_malloc_keeps_to_one_arena_unless_the_environment_sets_glibcs_limit":
        "counts glibc's malloc arenas, and the sanitizers bring an allocator of their own",
    "test_with_proxies_each_libcurl_loop_gets_an_arena_of_its_own":
        "counts glibc's malloc arenas, and the sanitizers bring an allocator of their own",
}


def pytest_collection_modifyitems(config, items):
    if not SANITIZER:
        return
    for item in items:
        reason = RELEASE_BUILD_ONLY.get(item.originalname)
        if reason:
            item.add_marker(pytest.mark.skip(reason=f"{SANITIZER} sanitizer build: {reason}"))


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
