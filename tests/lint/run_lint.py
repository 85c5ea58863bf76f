#!/usr/bin/env python3
"""ctest's lint.device_runtime_calls: the scanner's self-test, then the scan of ROOT."""
import subprocess
import sys
from pathlib import Path

scanner = Path(__file__).with_name("device_runtime_calls.py")
for args in (["--self-test"], [sys.argv[1]]):
    status = subprocess.call([sys.executable, str(scanner), *args])
    if status != 0:
        sys.exit(status)
