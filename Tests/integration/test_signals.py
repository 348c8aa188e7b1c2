"""Real signals: SIGHUP reloads the configuration (its default action would end the broker), and
drops no waiter."""
import signal
import threading

from broker import Broker
from test_http_api import wait_until
from test_logs import logfmt


def test_sighup_reloads_an_unchanged_file_and_a_long_poll_waiting_across_it_is_answered():
    with Broker({"providers": [{"name": "default"}]}) as broker:
        token = broker.get_json("/token")[0]
        version = token["version"]
        fetches = broker.fetches("default")
        answer = {}

        def long_poll():
            answer["status"], _, answer["body"] = broker.request(
                "GET", f"/token/ready?after={version}&timeout=20", timeout=30)

        waiter = threading.Thread(target=long_poll)
        waiter.start()
        assert wait_until(lambda: broker.metric("token_broker_longpoll_waiters", provider="default") == 1, timeout=10)
        broker.process.send_signal(signal.SIGHUP)
        assert wait_until(lambda: 'msg="configuration reloaded"' in broker.stderr(), timeout=15), broker.stderr()
        assert broker.process.poll() is None, "SIGHUP ended the broker"
        [line] = [line for line in broker.stderr().splitlines() if 'msg="configuration reloaded"' in line]
        fields = logfmt(line)
        assert fields.get("unchanged") == "default", line
        assert not any(fields.get(field) for field in ("added", "changed", "removed")), line
        assert broker.metric("token_broker_reloads_total", result="reloaded") == 1
        assert broker.fetches("default") == fetches, "an unchanged provider fetches nothing at a reload"
        served = broker.get_json("/token")[0]
        assert (served["access_token"], served["version"]) == (token["access_token"], version)
        assert broker.metric("token_broker_longpoll_waiters", provider="default") == 1, "the waiter is still there"
        status, _ = broker.request("POST", "/token/refresh", body=f'{{"rejected_version": {version}}}'.encode())[:2]
        assert status == 200
        waiter.join(30)
        assert not waiter.is_alive()
        assert answer["status"] == 200 and b'"version"' in answer["body"]
        assert broker.fetches("default") == fetches + 1
