#!/usr/bin/env bash
# The project's test command (README): everything CI runs, in order. Later issues add the
# service provisioning (ci/services.sh) in front; tests that need a service then fail instead of
# skipping, because this script sets SECKILL_REQUIRE_SERVICES.
set -euo pipefail
cd "$(dirname "$0")/.."

export SECKILL_REQUIRE_SERVICES=1
export CARGO_TERM_COLOR=never
# `cargo sim` passes --cfg madsim through the alias's config; RUSTFLAGS would silently replace it.
unset RUSTFLAGS

step() { printf '\n== %s (%s)\n' "$*" "$(date -u +%H:%M:%S)"; }

step "toolchain"
cargo --version
rustc --version

step "format"
cargo fmt --all -- --check

step "clippy"
cargo clippy --workspace --all-targets -- -D warnings

step "tests (plain build)"
cargo test --workspace

step "simulation (--cfg madsim)"
cargo sim

step "done"
