#!/usr/bin/env bash
# Proves the Dockerfile's runtime stage without a Docker engine.
#
#   Tests/container/runtime-check.sh path/to/token-broker
#
# 1. debootstraps a Debian bookworm minbase root (cached under .build/container/ between runs);
# 2. installs in a copy of it exactly the Dockerfile's RUNTIME_PACKAGES, and adds its user;
# 3. runs the binary there as that non-root user, with the Dockerfile's environment, inside
#    private network, mount and PID namespaces, and fetches /healthz and /token; runs `token-broker healthcheck`;
# 4. as a control, shows that the same root without libmicrohttpd12 cannot run the binary, so
#    this check fails when the Dockerfile's list misses a library.
# Needs root (debootstrap, chroot, unshare). Talks to nothing but Debian's mirror and loopback.
set -euo pipefail

binary=$(realpath "${1:?usage: runtime-check.sh path/to/token-broker}")
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cache="$root/.build/container"
mkdir -p "$cache"

packages=$(sed -n 's/^ARG RUNTIME_PACKAGES="\(.*\)"$/\1/p' "$root/Dockerfile")
[ -n "$packages" ] || { echo "runtime-check: no ARG RUNTIME_PACKAGES=\"...\" line in the Dockerfile" >&2; exit 1; }
user_line=$(grep -o 'useradd [^&]*token-broker' "$root/Dockerfile")
echo "runtime-check: packages from the Dockerfile: $packages"

# The mirror this machine's apt already uses, so the check needs no other address.
mirror=$(sed -n 's/^URIs: *\([^ ]*\).*/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n 1)
[ -n "$mirror" ] || mirror=$(awk '$1 == "deb" && $3 ~ /^bookworm$/ {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)

base="$cache/bookworm-minbase"
if [ ! -f "$base/.complete" ]; then
    rm -rf "$base"
    echo "runtime-check: debootstrap --variant=minbase bookworm ${mirror:-the default mirror}"
    debootstrap --variant=minbase bookworm "$base" ${mirror:+"$mirror"} > "$cache/debootstrap.log" 2>&1 \
        || { tail -n 30 "$cache/debootstrap.log" >&2; exit 1; }
    touch "$base/.complete"
fi

# make_root NAME PACKAGES...: a fresh copy of the base with those packages and the image's user.
make_root() {
    local name=$1; shift
    local target="$cache/$name"
    rm -rf "$target"
    cp -a "$base" "$target"
    cp /etc/resolv.conf "$target/etc/resolv.conf" 2>/dev/null || true
    chroot "$target" apt-get update -qq > "$cache/$name-apt.log" 2>&1
    DEBIAN_FRONTEND=noninteractive chroot "$target" apt-get install -y -qq --no-install-recommends "$@" >> "$cache/$name-apt.log" 2>&1 \
        || { tail -n 30 "$cache/$name-apt.log" >&2; exit 1; }
    chroot "$target" $user_line
    install -m 0755 "$binary" "$target/usr/local/bin/token-broker"
    # A configuration with a token store in files, so that the run also proves the store's
    # libraries (hiredis is linked whichever store is used) and its writes as the non-root user.
    install -d -m 0755 "$target/etc/token-broker"
    install -d -m 0700 -o 10001 -g 10001 "$target/var/lib/token-broker"
    openssl rand -hex 32 > "$target/etc/token-broker/store.key"
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$target/etc/token-broker/signing.pem" 2> /dev/null
    chown 10001:10001 "$target/etc/token-broker/store.key" "$target/etc/token-broker/signing.pem"
    chmod 0600 "$target/etc/token-broker/store.key" "$target/etc/token-broker/signing.pem"
    cat > "$target/etc/token-broker/config.json" <<'JSON'
{"providers": [{"name": "default", "source": {"type": "jwt", "keyFile": "signing.pem"}}],
 "store": {"type": "file", "path": "/var/lib/token-broker", "keyFile": "store.key"}}
JSON
    echo "$target"
}

# run_in NAME: runs the broker in that root as uid 10001 in a private network namespace, and
# fetches from it over that namespace's loopback. Prints what it saw; exits non-zero on failure.
run_in() {
    local target=$1
    # Private network, mount and PID namespaces; /proc is mounted as in a container (the Swift
    # runtime reads the command line from /proc/self/cmdline).
    unshare --net --mount --pid --fork --mount-proc="$target/proc" bash -euo pipefail -c '
        target=$1
        ip link set lo up
        log=$(mktemp)
        chroot --userspec=10001:10001 "$target" /usr/bin/env -i \
            TOKEN_BROKER_LISTEN=0.0.0.0:8080 TOKEN_BROKER_ADMIN_LISTEN=0.0.0.0:9090 \
            /usr/local/bin/token-broker --config /etc/token-broker/config.json > "$log" 2>&1 &
        pid=$!
        trap "kill $pid 2>/dev/null || true" EXIT
        for _ in $(seq 1 100); do
            if curl -fsS --max-time 2 http://127.0.0.1:9090/healthz > /dev/null 2>&1; then break; fi
            if ! kill -0 $pid 2>/dev/null; then echo "the broker did not start:"; cat "$log"; exit 1; fi
            sleep 0.1
        done
        echo "healthz: $(curl -fsS --max-time 2 http://127.0.0.1:9090/healthz)"
        token=$(curl -fsS --max-time 2 -H "Token-Broker-Request: true" http://127.0.0.1:8080/token)
        case "$token" in *\"access_token\":\"ey*) echo "token: served (${#token} bytes of JSON)";; *) echo "no token: $token"; exit 1;; esac
        for _ in $(seq 1 50); do ls "$target"/var/lib/token-broker/*.record > /dev/null 2>&1 && break; sleep 0.1; done
        record=$(ls "$target"/var/lib/token-broker/*.record 2> /dev/null | head -n 1)
        [ -n "$record" ] || { echo "no record in the token store"; cat "$log"; exit 1; }
        echo "token store: $(stat -c "%a %u" "$record") $(head -c 8 "$record")"
        if chroot --userspec=10001:10001 "$target" /usr/bin/env -i TOKEN_BROKER_ADMIN_LISTEN=0.0.0.0:9090 \
            /usr/local/bin/token-broker healthcheck; then
            echo "healthcheck command: exit 0"
        else
            echo "healthcheck command failed"; exit 1
        fi
        uid=$(grep "^Uid:" "$target/proc/$pid/status" | cut -f2)
        echo "process uid: $uid"
        [ "$uid" = 10001 ]
        kill -TERM $pid
        wait $pid && echo "stopped with status 0 on SIGTERM"
    ' bash "$target"
}

echo "runtime-check: the runtime root, as the Dockerfile builds it"
full=$(make_root runtime $packages)
run_in "$full"

echo "runtime-check: control: the same root without libmicrohttpd12 must not run the binary"
reduced=$(echo " $packages " | sed 's/ libmicrohttpd12 / /')
control=$(make_root control $reduced)
if run_in "$control" > "$cache/control.log" 2>&1; then
    echo "runtime-check: FAILED: the binary ran without libmicrohttpd12, so this check could not catch a missing library" >&2
    exit 1
fi
grep -m 1 -o 'libmicrohttpd.so.12[^"]*' "$cache/control.log" || true
rm -rf "$control"
echo "runtime-check: passed"
