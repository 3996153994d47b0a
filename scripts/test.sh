#!/usr/bin/env bash
# The whole test suite, exactly as CI runs it (`.ci/run` calls this):
# format, lints, unit + integration tests, the Python package's tests, size
# rules, a build with the declared minimum Rust, docs, benchmark build, fuzz
# smoke.
# Installs what it needs on a fresh machine (cargo-fuzz; PostgreSQL and
# Chromium from Debian's packages, via scripts/services.sh, which also starts
# a throwaway PostgreSQL for the L-Bone store tests). Env: FUZZ_SECONDS (default 20
# per target; 0 skips the fuzz run but still builds the targets).
set -euo pipefail
cd "$(dirname "$0")/.."

fuzz_seconds="${FUZZ_SECONDS:-20}"
step() { printf '\n==> %s\n' "$*"; }

step "toolchain components"
if command -v rustup >/dev/null 2>&1; then
    rustup component add rustfmt clippy >/dev/null 2>&1 || true
fi
if ! command -v cargo-fuzz >/dev/null 2>&1; then
    step "installing cargo-fuzz"
    cargo install cargo-fuzz --locked --quiet
fi

step "test services (PostgreSQL, Chromium)"
# shellcheck source=scripts/services.sh
source scripts/services.sh

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "cargo test"
cargo test --workspace --locked

step "Python package: pip install ./python, pytest against real depots"
# A venv of its own under target/ (what CI starts without); the wheel is
# built by maturin from PyPI, in release, as a user's `pip install` builds it.
if [ ! -x target/py-venv/bin/python ]; then
    python3 -m venv target/py-venv
fi
target/py-venv/bin/pip install --quiet --disable-pip-version-check "./python[test]"
LORS_BIN="$PWD/target/debug/lors" target/py-venv/bin/python -m pytest -q python/tests

step "Python typing: mypy, and stubtest of the installed package against its stubs"
target/py-venv/bin/python -m mypy --config-file python/pyproject.toml python/src/lors
target/py-venv/bin/python -m mypy.stubtest lors --mypy-config-file python/pyproject.toml \
    --allowlist python/stubtest-allowlist.txt

step "size rules (scripts/sizes.py)"
python3 scripts/sizes.py

step "layer rules (scripts/layers.py)"
python3 scripts/layers.py

step "minimum Rust (rust-version)"
msrv=$(sed -n 's/^rust-version = "\(.*\)"/\1/p' Cargo.toml)
if command -v rustup >/dev/null 2>&1; then
    rustup toolchain install "$msrv" --profile minimal >/dev/null 2>&1 || true
fi
cargo "+$msrv" check --workspace --all-targets --locked --quiet --target-dir target/msrv

step "cargo doc"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked --quiet

step "cargo bench --no-run"
cargo bench --workspace --no-run --locked --quiet

step "fuzz targets (${fuzz_seconds}s each)"
export RUSTC_BOOTSTRAP=1 # cargo-fuzz needs nightly flags; only stable is installed
targets=$(cargo fuzz list --fuzz-dir fuzz)
cargo fuzz build --fuzz-dir fuzz 2>&1 | tail -n 1
if [ "$fuzz_seconds" -gt 0 ]; then
    for t in $targets; do
        echo "--- $t"
        # Seeds kept in the repository (fuzz/seeds/TARGET) start the search
        # where blind mutation would take long to reach (an erasure-coded
        # exNode); the corpus libFuzzer grows stays out of it.
        seeds=()
        if [ -d "fuzz/seeds/$t" ]; then
            mkdir -p "fuzz/corpus/$t"
            seeds=("fuzz/corpus/$t" "fuzz/seeds/$t")
        fi
        cargo fuzz run --fuzz-dir fuzz "$t" "${seeds[@]}" -- -max_total_time="$fuzz_seconds" 2>&1 | grep -E '^Done|ERROR|panicked' || true
        if [ -d "fuzz/artifacts/$t" ] && [ -n "$(ls -A "fuzz/artifacts/$t" 2>/dev/null)" ]; then
            echo "fuzz target $t found a crash: see fuzz/artifacts/$t" >&2
            exit 1
        fi
    done
fi

printf '\nall checks passed\n'
