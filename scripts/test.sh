#!/usr/bin/env bash
# The whole test suite, as the README's second quick-start command: install what is needed
# (the Debian packages, and a virtual environment with a current PyTorch from PyPI for the
# Python tests), build (library, unit tests, their AddressSanitizer+UBSan copies, benchmark),
# and run ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh --torch-venv
bash scripts/configure-and-build.sh
ctest --test-dir build --output-on-failure -j "$(nproc)"
