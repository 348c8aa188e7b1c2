#!/usr/bin/env bash
# The contract: openapi.yaml is valid OpenAPI 3.1, and the real broker agrees with it.
#
#   Tests/contract/run.sh path/to/token-broker path/to/venv
#
# Starts the broker on loopback with broker-contract.json (whose proxy forwards to upstream.py, a
# target that answers every method, and whose compatibility protocols have listeners of their own)
# and a caller key and an Azure identity header made for the run, then runs schemathesis
# (examples, coverage and fuzzing phases, every check) against each listener, with fixed seeds so
# that a failure can be replayed. The token listener's requests carry the caller key; the Google
# metadata listener's carry `Metadata-Flavor: Google`; the Azure listener's carry the identity
# header and `Metadata: true`. The token and compatibility runs read schemathesis.toml (why 400
# can answer schema-valid template values). Fails on any schemathesis failure, and unless SIGTERM
# stops the broker with status 0 afterwards.
set -euo pipefail

binary=$(realpath "${1:?usage: run.sh path/to/token-broker path/to/venv}")
bin_dir=$(cd "${2:?usage: run.sh path/to/token-broker path/to/venv}/bin" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
spec=$(realpath "$here/../../openapi.yaml")

"$bin_dir/openapi-spec-validator" "$spec"

work=$(mktemp -d)
log="$work/broker.log"
key=$(openssl rand -hex 32)
# App Service's shared secret: the config names the file relative to itself.
identity=$(openssl rand -hex 24)
(umask 077 && printf '%s\n' "$identity" > "$work/identity-header")
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

# Four listeners: token, admin, gce and azure.
for _ in $(seq 1 100); do
    [ "$(grep -c 'msg=listening' "$log")" -ge 4 ] && break
    kill -0 $pid 2>/dev/null || { cat "$log" >&2; exit 1; }
    sleep 0.05
done
token=$(sed -n 's/.*msg=listening listener=token address=\([^ ]*\).*/\1/p' "$log")
admin=$(sed -n 's/.*msg=listening listener=admin address=\([^ ]*\).*/\1/p' "$log")
gce=$(sed -n 's/.*msg=listening listener=gce address=\([^ ]*\).*/\1/p' "$log")
azure=$(sed -n 's/.*msg=listening listener=azure address=\([^ ]*\).*/\1/p' "$log")
[ -n "$token" ] && [ -n "$admin" ] && [ -n "$gce" ] && [ -n "$azure" ] || { cat "$log" >&2; exit 1; }
echo "contract: token listener $token, admin listener $admin, gce listener $gce, azure listener $azure"
# The compatibility routes, run against their own listeners.
compat='^/$|^/computeMetadata/|^/(msi/token|metadata/identity/oauth2/token)$'

cd "$work"
"$bin_dir/schemathesis" --config-file "$here/schemathesis.toml" run "$spec" --url "http://$token" \
    --exclude-path-regex "^/(healthz|readyz|metrics|reload)\$|$compat" \
    --header "Authorization: Bearer $key" --checks all --max-examples 50 --seed 20261129 --no-color
"$bin_dir/schemathesis" run "$spec" --url "http://$admin" --include-path-regex '^/(healthz|readyz|metrics|reload)$' \
    --checks all --max-examples 30 --seed 20261129 --no-color
"$bin_dir/schemathesis" --config-file "$here/schemathesis.toml" run "$spec" --url "http://$gce" \
    --include-path-regex '^/$|^/computeMetadata/' \
    --header "Metadata-Flavor: Google" --checks all --max-examples 30 --seed 20261129 --no-color
"$bin_dir/schemathesis" --config-file "$here/schemathesis.toml" run "$spec" --url "http://$azure" \
    --include-path-regex '^/(msi/token|metadata/identity/oauth2/token)$' \
    --header "X-IDENTITY-HEADER: $identity" --header "Metadata: true" --checks all --max-examples 30 --seed 20261129 --no-color

kill -TERM $pid
status=0
wait $pid || status=$?
[ "$status" -eq 0 ] || { echo "contract: the broker exited with $status after SIGTERM" >&2; cat "$log" >&2; exit 1; }
echo "contract: passed"
