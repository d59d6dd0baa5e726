#!/usr/bin/env bash
# `make release` (and `make bench`): builds the gateway's release binary with profile-guided
# optimisation and prints its path on stdout (everything else goes to stderr).
#
# 1. An instrumented build (`-Cprofile-generate`) in $CARGO_TARGET_DIR/pgo/generate.
# 2. Training: the benchmark's phases at a few seconds each (bench/run.py against the mock upstream:
#    OpenAI and Anthropic formats, whole and paced streams, every guardian stage, the distributed edge
#    where PostgreSQL answers), which is what a gateway's hot path does in use.
# 3. The profile (merged by the llvm-profdata of rustc's own LLVM version) guides the optimised build
#    (`-Cprofile-use`) in $CARGO_TARGET_DIR/pgo/use.
#
# A profile is kept per instrumented binary (named by its hash): unchanged code reuses it and the
# optimised build stays cached; changed code trains again and rebuilds. Without llvm-profdata (it is
# installed from Debian's llvm-N package where apt-get can) or with BR_PGO=0, it builds and prints the
# plain release binary instead.
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}"
mkdir -p "$target"
target="$(cd "$target" && pwd)"
base_flags="${RUSTFLAGS:-}"

plain() {
  echo "release: $1; building without profile-guided optimisation" >&2
  cargo build --release -p brainstorm >&2
  echo "$target/release/brainstorm"
}

[ "${BR_PGO:-1}" = 0 ] && { plain "BR_PGO=0"; exit 0; }

llvm_major="$(rustc -vV | awk '/^LLVM version/ { split($3, version, "."); print version[1] }')"
# llvm-profdata-N, or an unversioned llvm-profdata of that version.
profdata="$(command -v "llvm-profdata-$llvm_major" || true)"
if [ -z "$profdata" ] && command -v llvm-profdata >/dev/null 2>&1 \
  && llvm-profdata --version 2>/dev/null | grep -q "LLVM version $llvm_major\."; then
  profdata="$(command -v llvm-profdata)"
fi
if [ -z "$profdata" ] && command -v apt-get >/dev/null 2>&1; then
  echo "release: installing llvm-$llvm_major for llvm-profdata (once)" >&2
  apt-get install -y -q "llvm-$llvm_major" >/dev/null 2>&1 || true
  profdata="$(command -v "llvm-profdata-$llvm_major" || true)"
fi
[ -z "$profdata" ] && { plain "no llvm-profdata-$llvm_major (rustc's LLVM version)"; exit 0; }

# The training load needs the mock upstream (a plain release build) and oha.
cargo build --release -p brainstorm-mock-upstream >&2
oha="$(scripts/ensure-oha.sh)"

pgo="$target/pgo"
raw="$pgo/raw"
echo "release: instrumented build" >&2
RUSTFLAGS="$base_flags -Cprofile-generate=$raw" CARGO_TARGET_DIR="$pgo/generate" cargo build --release -p brainstorm >&2
instrumented="$pgo/generate/release/brainstorm"
profile="$pgo/profiles/$(sha256sum "$instrumented" | cut -c1-16).profdata"
if [ ! -f "$profile" ]; then
  echo "release: training (the benchmark's phases, a few seconds each)" >&2
  rm -rf "$raw"
  python3 bench/run.py --gateway "$instrumented" --mock "$target/release/mock-upstream" --oha "$oha" \
    --seconds 2 --warmup 1 --repeats 1 --sequential 500 --streams 300 --no-callgrind --no-counters --output "$pgo/training.json" >&2
  rm -rf "$pgo/profiles"
  mkdir -p "$pgo/profiles"
  "$profdata" merge -o "$profile.partial" "$raw"
  mv "$profile.partial" "$profile"
fi
echo "release: optimised build with $profile" >&2
RUSTFLAGS="$base_flags -Cprofile-use=$profile" CARGO_TARGET_DIR="$pgo/use" cargo build --release -p brainstorm >&2
echo "$pgo/use/release/brainstorm"
