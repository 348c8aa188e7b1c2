"""The harness itself: sanitizer settings reach the broker, and a sanitizer's report fails the test.

A stand-in for the binary (a shell script) prints what a broker built with a sanitizer would.
"""
import os
import stat

import pytest

from broker import Broker, check_sanitizer_reports

# Prints its TSAN_OPTIONS, says where it listens as the broker does, then a report at SIGTERM if
# asked to. The trap and the options come first: Broker() returns, and a test may send SIGTERM, as
# soon as both listening lines are out, and a shell that had not set its trap yet would die of it.
STAND_IN = """#!/bin/sh
trap 'if [ -n "$REPORT" ]; then printf "==1==%s\\nSUMMARY: ThreadSanitizer: data race\\n" "$REPORT" >&2; fi; exit 0' TERM
echo "TSAN_OPTIONS=$TSAN_OPTIONS ASAN_OPTIONS=$ASAN_OPTIONS" >&2
echo "msg=listening listener=token address=127.0.0.1:1" >&2
echo "msg=listening listener=admin address=127.0.0.1:2" >&2
while :; do sleep 0.05; done
"""


@pytest.fixture
def stand_in(tmp_path):
    path = tmp_path / "token-broker"
    path.write_text(STAND_IN)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_sanitizer_options_reach_the_broker(stand_in, monkeypatch):
    monkeypatch.setenv("TSAN_OPTIONS", "halt_on_error=0:history_size=3")
    monkeypatch.setenv("ASAN_OPTIONS", "detect_leaks=1")
    with Broker(binary=stand_in, fetching=()) as broker:
        pass
    assert "TSAN_OPTIONS=halt_on_error=0:history_size=3 ASAN_OPTIONS=detect_leaks=1" in broker.stderr()


@pytest.mark.parametrize("report", ["WARNING: ThreadSanitizer: data race (pid=1)", "ERROR: AddressSanitizer: heap-use-after-free",
                                    "ERROR: LeakSanitizer: detected memory leaks"])
def test_a_report_at_stop_fails_the_test(stand_in, report):
    broker = Broker(binary=stand_in, env={"REPORT": report}, fetching=())
    try:
        with pytest.raises(AssertionError, match="sanitizer finding"):
            broker.stop()
    finally:
        Broker.started.remove(broker)
    assert report in broker.stderr()


def test_a_clean_log_passes():
    check_sanitizer_reports('time=1 level=info msg="token fetched" provider=default\n')
    with pytest.raises(AssertionError, match="1 sanitizer finding"):
        check_sanitizer_reports("x\n/a.swift:3:1: runtime error: signed integer overflow\n")
