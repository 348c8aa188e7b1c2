#!/usr/bin/env bash
# The contract: openapi.yaml is valid OpenAPI 3.1, and the real broker agrees with it.
#
#   Tests/contract/run.sh path/to/token-broker path/to/venv
#
# Starts the broker on loopback with broker-contract.json (whose proxy forwards to upstream.py, a
# target that answers every method) and a caller key made for the run, then runs schemathesis (examples, coverage and fuzzing phases, every check) against each
# listener, with fixed seeds so that a failure can be replayed; the token listener's requests carry
# the caller key, and its run reads schemathesis.toml (why 400 can answer schema-valid template values). Fails on any schemathesis failure, and unless SIGTERM stops the broker with
# status 0 afterwards.
set -euo pipefail

binary=$(realpath "${1:?usage: run.sh path/to/token-broker path/to/venv}")
bin_dir=$(cd "${2:?usage: run.sh path/to/token-broker path/to/venv}/bin" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
spec=$(realpath "$here/../../openapi.yaml")

"$bin_dir/openapi-spec-validator" "$spec"

work=$(mktemp -d)
log="$work/broker.log"
key=$(openssl rand -hex 32)
printf '{"keys": [{"name": "contract", "sha256": "%s", "providers": ["*"]}]}\n' \
    "$(printf %s "$key" | sha256sum | cut -d' ' -f1)" > "$work/callers.json"
# Proxy mode's target: a small server that answers every method with 200.
coproc UPSTREAM { exec "$bin_dir/python" "$here/upstream.py"; }
upstream_pid=$UPSTREAM_PID
read -r _ upstream <&"${UPSTREAM[0]}"
sed -e "s|\"providers\":|\"clientKeysFile\": \"$work/callers.json\",\n  \"providers\":|" \
    -e "s|UPSTREAM|$upstream|" "$here/broker-contract.json" > "$work/config.json"
TOKEN_BROKER_LISTEN=127.0.0.1:0 TOKEN_BROKER_ADMIN_LISTEN=127.0.0.1:0 \
    "$binary" --config "$work/config.json" 2> "$log" &
pid=$!
trap 'kill $pid $upstream_pid 2>/dev/null || true; rm -rf "$work"' EXIT

for _ in $(seq 1 100); do
    [ "$(grep -c 'msg=listening' "$log")" -ge 2 ] && break
    kill -0 $pid 2>/dev/null || { cat "$log" >&2; exit 1; }
    sleep 0.05
done
token=$(sed -n 's/.*msg=listening listener=token address=\([^ ]*\).*/\1/p' "$log")
admin=$(sed -n 's/.*msg=listening listener=admin address=\([^ ]*\).*/\1/p' "$log")
echo "contract: token listener $token, admin listener $admin"

cd "$work"
"$bin_dir/schemathesis" --config-file "$here/schemathesis.toml" run "$spec" --url "http://$token" --exclude-path-regex '^/(healthz|readyz|metrics)$' \
    --header "Authorization: Bearer $key" --checks all --max-examples 50 --seed 20261129 --no-color
"$bin_dir/schemathesis" run "$spec" --url "http://$admin" --include-path-regex '^/(healthz|readyz|metrics)$' \
    --checks all --max-examples 30 --seed 20261129 --no-color

kill -TERM $pid
status=0
wait $pid || status=$?
[ "$status" -eq 0 ] || { echo "contract: the broker exited with $status after SIGTERM" >&2; cat "$log" >&2; exit 1; }
echo "contract: passed"
