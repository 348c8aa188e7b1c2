#!/usr/bin/env bash
# Runs every fuzz target built in .build/fuzz (see the Makefile's fuzz-build), one after another,
# with the libFuzzer options given (such as -runs=1000000 or -max_total_time=30).
#
# Each target starts from its seeds in Fuzz/Corpus/<target>/ plus what earlier runs found in
# .build/fuzz/corpus/<target>/, where new inputs go; the seeds in the repository are not changed.
# An input that crashes is saved as .build/fuzz/crashes/<target>-crash-<sha1>, and the run
# fails. Fuzz/Dictionaries/ holds tokens the mutations use (JSON's, and a target's own words).
# A line per target says how many inputs were run and how large its corpus is.
#
#   Fuzz/run.sh -max_total_time=30
#   FUZZ_TARGETS="FuzzJSON FuzzProxyPath" Fuzz/run.sh -runs=1000000
set -uo pipefail
cd "$(dirname "$0")/.."

BIN=${FUZZ_BIN:-.build/fuzz/release}
TARGETS=${FUZZ_TARGETS:-FuzzJSON FuzzConfiguration FuzzCallerKeys FuzzTokenAnswer FuzzFileToken FuzzQuery FuzzProxyPath FuzzHeaderLine}
mkdir -p .build/fuzz/crashes .build/fuzz/logs
# A trap goes to libFuzzer's handler, which saves the input; Swift's own backtracer would read
# memory that AddressSanitizer then reports instead of the trap.
export SWIFT_BACKTRACE=enable=no
failed=()
for target in $TARGETS; do
    corpus=.build/fuzz/corpus/$target
    log=.build/fuzz/logs/$target.log
    mkdir -p "$corpus"
    # The JSON dictionary, and the target's own if it has one, merged into one file.
    dictionary=.build/fuzz/logs/$target.dict
    cat Fuzz/Dictionaries/json.dict $(ls Fuzz/Dictionaries/$target.dict 2>/dev/null) > "$dictionary"
    "$BIN/$target" "$@" -dict="$dictionary" -print_final_stats=1 -artifact_prefix=".build/fuzz/crashes/$target-" \
        "$corpus" "Fuzz/Corpus/$target" > "$log" 2>&1
    status=$?
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    printf '%-18s %s, %9s inputs run, corpus %5s files, %s\n' "$target" \
        "$([ $status = 0 ] && echo ok || echo "FAILED ($status)")" "${runs:-?}" \
        "$(find "$corpus" -type f | wc -l)" "$(sed -n 's/^stat::peak_rss_mb: *//p' "$log" | tail -1) MB peak RSS"
    if [ $status != 0 ]; then
        failed+=("$target")
        # The trap and the function it is in, or the sanitizer's summary; then where the input went.
        grep -m1 -A1 'Swift runtime failure' "$log" | sed 's/^ *#[0-9]* 0x[0-9a-f]* in /    /' >&2
        grep -E '^SUMMARY|Test unit written to|^Base64' "$log" >&2
    fi
done
if [ ${#failed[@]} != 0 ]; then
    echo "fuzz: crashes in ${failed[*]} (inputs in .build/fuzz/crashes/, logs in .build/fuzz/logs/)" >&2
    exit 1
fi
