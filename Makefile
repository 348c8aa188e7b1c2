# token-broker: the two commands of the README, and the steps under them.
#
#   make run    install what is missing, build in release mode, start the broker on its embedded default
#   make test   the code's format first (`make lint`), then the same set-up and every test: Swift
#               unit tests, integration tests against the real binary, the OpenAPI contract
#               (schemathesis), the container runtime check, and each fuzz target for 20 s
#
# Not part of `make test`: `make fuzz` (each fuzz target to a million inputs) and `make sanitize`
# (the integration tests against AddressSanitizer and ThreadSanitizer builds), longer runs.
#
# Needs the Swift 6 toolchain on PATH and Debian 12 (root, or sudo, to install packages).

SHELL := /bin/bash
SWIFT ?= swift
PYTHON ?= python3
# Build-time libraries, the tools the tests use (redis-server; promtool, from prometheus, for the
# rules and dashboard in deploy/), and debootstrap for the container check.
APT_PACKAGES := pkg-config libmicrohttpd-dev libssl-dev libcurl4-openssl-dev libhiredis-dev openssl curl ca-certificates \
                python3 python3-venv debootstrap iproute2 util-linux redis-server prometheus
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
RELEASE_FLAGS := -c release --static-swift-stdlib
BIN := .build/release/token-broker
VENV := .venv
# Fuzzing (Fuzz/): libFuzzer targets, built only when TOKEN_BROKER_FUZZ is set (see Package.swift),
# with the toolchain's libFuzzer and AddressSanitizer, into a build directory of their own.
FUZZ_TARGETS := FuzzJSON FuzzConfiguration FuzzCallerKeys FuzzTokenAnswer FuzzFileToken FuzzQuery FuzzProxyPath FuzzHeaderLine
FUZZ_BUILD := TOKEN_BROKER_FUZZ=1 $(SWIFT) build -c release --scratch-path .build/fuzz \
              -Xswiftc -sanitize=fuzzer,address -Xswiftc -enable-testing -Xswiftc -use-ld=lld
# Sanitizer runs: reports do not stop the broker, so that every one is in its log, where the
# integration harness looks for them (Tests/integration/broker.py).
ASAN_RUN_OPTIONS := TOKEN_BROKER_SANITIZER=address ASAN_OPTIONS=detect_leaks=1:halt_on_error=0 \
                    LSAN_OPTIONS=suppressions=$(abspath Tests/sanitizers/lsan.supp)
TSAN_RUN_OPTIONS := TOKEN_BROKER_SANITIZER=thread TSAN_OPTIONS=halt_on_error=0:second_deadlock_stack=1
# Unit tests: a crash prints its reason (the runtime's or a C library's message) and the crashed
# thread's frames, without every thread's registers and the list of loaded images, so that the
# reason is still on screen, and in the end of a CI log, when the run stops.
UNIT_TEST := SWIFT_BACKTRACE=enable=yes,interactive=no,color=no,threads=crashed,registers=none,images=none $(SWIFT) test
# Integration tests: most wait on the broker's timers and on servers, not on the CPU (with two
# workers the machine's two cores were 87 % idle), so four workers (pytest-xdist) take about a
# quarter of the time, on two cores as on more; each test file runs whole in one worker, so that
# its module's servers start once. The sanitizer builds use far more CPU per request: two there.
PYTEST_WORKERS := -n 4 --dist loadfile
SANITIZE_WORKERS := -n 2 --dist loadfile
INTEGRATION_TEST := TOKEN_BROKER_BIN=$(abspath $(BIN)) $(VENV)/bin/python -m pytest -q $(PYTEST_WORKERS) Tests/integration

.PHONY: run test deps build lint format unit-test integration-test contract-test container-check fuzz fuzz-build sanitize \
        bench soak link-order clean

run: deps build
	@echo "token-broker: token listener http://127.0.0.1:8080/token, admin http://127.0.0.1:9090/healthz (Ctrl-C stops it)"
	exec $(BIN) $(ARGS)

test: lint deps build $(VENV)/.installed
	$(UNIT_TEST)
	$(INTEGRATION_TEST)
	Tests/contract/run.sh $(BIN) $(VENV)
	$(SUDO) Tests/container/runtime-check.sh $(BIN)
	$(MAKE) fuzz-build
	FUZZ_TARGETS="$(FUZZ_TARGETS)" Fuzz/run.sh -max_total_time=20

build: deps
	$(SWIFT) build $(RELEASE_FLAGS)

# The code as `swift format` (shipped with the toolchain) writes it, by the rules in .swift-format
# (4 spaces, 120 columns): `make lint` fails on any drift, `make format` rewrites the files.
SWIFT_FILES := Package.swift Sources Tests Fuzz bench
lint:
	$(SWIFT) format lint --strict --recursive --parallel $(SWIFT_FILES)

format:
	$(SWIFT) format format --in-place --recursive --parallel $(SWIFT_FILES)

unit-test: deps
	$(UNIT_TEST)

integration-test: build $(VENV)/.installed
	$(INTEGRATION_TEST)

contract-test: build $(VENV)/.installed
	Tests/contract/run.sh $(BIN) $(VENV)

container-check: build
	$(SUDO) Tests/container/runtime-check.sh $(BIN)

# Fuzz targets, each run until it has tried a million inputs (FUZZ_ARGS adds libFuzzer options);
# fails on any crash, whose input is saved in .build/fuzz/crashes/. See Fuzz/run.sh.
fuzz: fuzz-build
	FUZZ_TARGETS="$(FUZZ_TARGETS)" Fuzz/run.sh -runs=1000000 $(FUZZ_ARGS)

# One product at a time: a plain `swift build` would also build the broker itself for fuzzing.
fuzz-build: deps
	@for target in $(FUZZ_TARGETS); do echo "$(FUZZ_BUILD) --product $$target"; $(FUZZ_BUILD) --product $$target || exit 1; done

# The integration tests against a debug build with AddressSanitizer (and LeakSanitizer), then
# against one with ThreadSanitizer; any report in a broker's log fails its test.
sanitize: deps $(VENV)/.installed
	$(SWIFT) build -c debug -Xswiftc -sanitize=address --scratch-path .build/asan
	$(ASAN_RUN_OPTIONS) TOKEN_BROKER_BIN=$(abspath .build/asan/debug/token-broker) \
		$(VENV)/bin/python -m pytest -q -rs $(SANITIZE_WORKERS) Tests/integration
	$(SWIFT) build -c debug -Xswiftc -sanitize=thread --scratch-path .build/tsan
	$(TSAN_RUN_OPTIONS) TOKEN_BROKER_BIN=$(abspath .build/tsan/debug/token-broker) \
		$(VENV)/bin/python -m pytest -q -rs $(SANITIZE_WORKERS) Tests/integration

# Installs only the packages that are missing, so a second run touches nothing.
deps:
	@command -v $(SWIFT) > /dev/null || { echo "make: the Swift 6 toolchain is not on PATH (see README.md, Requirements)" >&2; exit 1; }
	@missing=$$(for package in $(APT_PACKAGES); do dpkg-query -W -f='$${Status}' $$package 2>/dev/null | grep -q 'install ok installed' || echo $$package; done); \
	if [ -n "$$missing" ]; then \
		echo "make: installing Debian packages:" $$missing; \
		$(SUDO) apt-get update -qq && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing && \
		case " $$missing " in *" prometheus "*) \
			if command -v systemctl > /dev/null && [ -d /run/systemd/system ]; then \
				echo "make: stopping the prometheus service Debian started (the tests need only promtool; it takes port 9090)"; \
				$(SUDO) systemctl disable --now prometheus > /dev/null 2>&1 || true; \
			fi;; \
		esac; \
	fi

$(VENV)/.installed: Tests/integration/requirements.txt Tests/integration/constraints.txt | deps
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q -r Tests/integration/requirements.txt -c Tests/integration/constraints.txt
	touch $@

# Benchmarks, not tests: compared with nginx and with floors in C built on the same libraries.
# Results go to bench/results/ (results.json, results.md, rss.png, wakeups.png); see BENCHMARKS.md.
bench: build $(VENV)/.installed
	@for package in nginx-light wrk; do dpkg-query -W -f='$${Status}' $$package 2>/dev/null | grep -q 'install ok installed' || \
		{ $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nginx-light wrk; break; }; done
	$(VENV)/bin/python -m pip install -q -r bench/requirements.txt -c Tests/integration/constraints.txt
	mkdir -p .build/bench
	cc -O2 -Wall -o .build/bench/minimal bench/c-server/minimal.c -lmicrohttpd
	cc -O2 -Wall -o .build/bench/longpoll bench/longpoll-client/longpoll.c
	cc -O2 -Wall -pthread -o .build/bench/release-all bench/longpoll-client/release-all.c
	cc -O2 -Wall -pthread -o .build/bench/mhd-release-all bench/longpoll-client/mhd-release-all.c -lmicrohttpd
	cc -O2 -Wall -pthread -o .build/bench/proxy-floor bench/proxy-floor/floor.c -lmicrohttpd -lcurl
	$(SWIFT)c -O -static-stdlib -use-ld=lld -Xlinker -z -Xlinker pack-relative-relocs \
		-I Sources/CMicroHTTPD -I Sources/COpenSSL -I Sources/CCurl -I Sources/CHiredis \
		-module-cache-path .build/bench/module-cache -o .build/bench/footprint-floor bench/footprint-floor/main.swift
	$(VENV)/bin/python bench/run.py

# Ten minutes of mixed load (wrk on /token, a refresh a second, 200 cycling long-polls); not part of
# `make test`. Fails on any 5xx, RSS growth of 5 % or more after the first minute, a drifting number
# of descriptors, or a waiter left behind. Results go to bench/results/soak.{json,md}.
soak: build
	@dpkg-query -W -f='$${Status}' wrk 2>/dev/null | grep -q 'install ok installed' || \
		{ $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends wrk; }
	$(PYTHON) bench/soak.py $(SOAK_ARGS)

# Rewrites the link order (Sources/token-broker/link-order.txt) from a traced run of the release
# binary, then relinks. Run it when start-up or request code has changed much; not part of make test.
link-order: build
	mkdir -p .build/link-order
	cc -O2 -Wall -o .build/link-order/trace bench/link-order/trace.c
	$(PYTHON) bench/link-order/generate.py
	rm -f $(BIN)  # SwiftPM does not know the link reads the order file
	$(SWIFT) build $(RELEASE_FLAGS)

clean:
	rm -rf .build $(VENV)
