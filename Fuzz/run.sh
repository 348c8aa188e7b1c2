#!/usr/bin/env bash
# Runs every fuzz target built in .build/fuzz (see the Makefile's fuzz-build) with the libFuzzer
# options given (such as -runs=1000000 or -max_total_time=30), FUZZ_JOBS targets at a time
# (default: one per core), and prints a line per target, in the order given, as each one ends.
#
# Each target starts from its seeds in Fuzz/Corpus/<target>/ plus what earlier runs found in
# .build/fuzz/corpus/<target>/, where new inputs go; the seeds in the repository are not changed.
# An input that crashes is saved as .build/fuzz/crashes/<target>-crash-<sha1>, and the run
# fails. Fuzz/Dictionaries/ holds tokens the mutations use (JSON's, and a target's own words).
# A line per target says how many inputs were run and how large its corpus is.
#
#   Fuzz/run.sh -max_total_time=30
#   FUZZ_TARGETS="FuzzJSON FuzzProxyPath" FUZZ_JOBS=1 Fuzz/run.sh -runs=1000000
set -uo pipefail
cd "$(dirname "$0")/.."

BIN=${FUZZ_BIN:-.build/fuzz/release}
TARGETS=${FUZZ_TARGETS:-FuzzJSON FuzzConfiguration FuzzCallerKeys FuzzTokenAnswer FuzzFileToken FuzzQuery FuzzProxyPath FuzzHeaderLine}
JOBS=${FUZZ_JOBS:-$(nproc)}
mkdir -p .build/fuzz/crashes .build/fuzz/logs
# A trap goes to libFuzzer's handler, which saves the input; Swift's own backtracer would read
# memory that AddressSanitizer then reports instead of the trap.
export SWIFT_BACKTRACE=enable=no

# One target: its log in .build/fuzz/logs/<target>.log, its exit status in <target>.status.
fuzz_one() {
    local target=$1
    shift
    local corpus=.build/fuzz/corpus/$target
    local dictionary=.build/fuzz/logs/$target.dict
    mkdir -p "$corpus"
    # The JSON dictionary, and the target's own if it has one, merged into one file.
    cat Fuzz/Dictionaries/json.dict $(ls Fuzz/Dictionaries/$target.dict 2>/dev/null) > "$dictionary"
    "$BIN/$target" "$@" -dict="$dictionary" -print_final_stats=1 -artifact_prefix=".build/fuzz/crashes/$target-" \
        "$corpus" "Fuzz/Corpus/$target" > ".build/fuzz/logs/$target.log" 2>&1
    echo $? > ".build/fuzz/logs/$target.status"
}

# The line for a target that has ended; with its trap or sanitizer summary on stderr if it failed.
report() {
    local target=$1 log=.build/fuzz/logs/$1.log
    local status runs
    status=$(cat ".build/fuzz/logs/$target.status")
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    printf '%-18s %s, %9s inputs run, corpus %5s files, %s\n' "$target" \
        "$([ "$status" = 0 ] && echo ok || echo "FAILED ($status)")" "${runs:-?}" \
        "$(find ".build/fuzz/corpus/$target" -type f | wc -l)" "$(sed -n 's/^stat::peak_rss_mb: *//p' "$log" | tail -1) MB peak RSS"
    if [ "$status" != 0 ]; then
        # The trap and the function it is in, or the sanitizer's summary; then where the input went.
        grep -m1 -A1 'Swift runtime failure' "$log" | sed 's/^ *#[0-9]* 0x[0-9a-f]* in /    /' >&2
        grep -E '^SUMMARY|Test unit written to|^Base64' "$log" >&2
        return 1
    fi
}

targets=($TARGETS)
pids=()
failed=()
reported=0
for index in "${!targets[@]}"; do
    rm -f ".build/fuzz/logs/${targets[$index]}.status"
    fuzz_one "${targets[$index]}" "$@" &
    pids[$index]=$!
    # At most JOBS running: wait for the oldest still running, and report in order.
    while [ $((index + 1 - reported)) -ge "$JOBS" ] && [ "$reported" -le "$index" ]; do
        wait "${pids[$reported]}"
        report "${targets[$reported]}" || failed+=("${targets[$reported]}")
        reported=$((reported + 1))
    done
done
while [ "$reported" -lt "${#targets[@]}" ]; do
    wait "${pids[$reported]}"
    report "${targets[$reported]}" || failed+=("${targets[$reported]}")
    reported=$((reported + 1))
done
if [ ${#failed[@]} != 0 ]; then
    echo "fuzz: crashes in ${failed[*]} (inputs in .build/fuzz/crashes/, logs in .build/fuzz/logs/)" >&2
    exit 1
fi
