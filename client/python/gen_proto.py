#!/usr/bin/env python3
"""Generates attnserve_client/_generated/ from proto/ (grpcio-tools). Run by deploy/setup.sh and
tests/client/python_client_test.sh; importing attnserve_client does the same on first use."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attnserve_client import _codegen  # noqa: E402

if __name__ == "__main__":
    out = _codegen.generate(force="--force" in sys.argv[1:])
    print(f"attnserve_client: generated code in {out}")
