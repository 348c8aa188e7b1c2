"""Real signals: SIGHUP must not end the broker (its default action would), nor drop a waiter."""
import signal
import threading

from broker import Broker
from test_http_api import wait_until


def test_sighup_is_logged_and_ignored_and_a_long_poll_waiting_across_it_is_answered():
    with Broker() as broker:
        version = broker.get_json("/token")[0]["version"]
        answer = {}

        def long_poll():
            answer["status"], _, answer["body"] = broker.request(
                "GET", f"/token/ready?after={version}&timeout=20", timeout=30)

        waiter = threading.Thread(target=long_poll)
        waiter.start()
        assert wait_until(lambda: broker.metric("token_broker_longpoll_waiters", provider="default") == 1, timeout=10)
        broker.process.send_signal(signal.SIGHUP)
        assert wait_until(lambda: "SIGHUP ignored" in broker.stderr(), timeout=10)
        assert broker.process.poll() is None, "SIGHUP ended the broker"
        assert broker.request("GET", "/token")[0] == 200
        assert broker.metric("token_broker_longpoll_waiters", provider="default") == 1, "the waiter is still there"
        status, _ = broker.request("POST", "/token/refresh", body=f'{{"rejected_version": {version}}}'.encode())[:2]
        assert status == 200
        waiter.join(30)
        assert answer["status"] == 200 and b'"version"' in answer["body"]
