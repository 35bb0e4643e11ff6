"""Generates the Python protobuf/gRPC modules of attnserve.v1 from proto/ with grpcio-tools.

The generated code is not committed: it is written to attnserve_client/_generated/ (git-ignored)
the first time the package is imported, and again whenever the .proto file changes (a SHA-256
stamp records what it was generated from). deploy/setup.sh and the ctest test run it ahead of
time through client/python/gen_proto.py.

The .proto file is found at $ATTNSERVE_PROTO_DIR/attnserve/v1/attention_service.proto, or by
default in the repository's proto/ folder (this file lives in client/python/attnserve_client/).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

PROTO_RELATIVE = "attnserve/v1/attention_service.proto"
PACKAGE_DIR = Path(__file__).resolve().parent
GENERATED_DIR = PACKAGE_DIR / "_generated"
_STAMP = ".proto.sha256"


def proto_dir() -> Path:
    env = os.environ.get("ATTNSERVE_PROTO_DIR")
    return Path(env) if env else PACKAGE_DIR.parents[2] / "proto"


def _proto_hash(proto_root: Path) -> str:
    return hashlib.sha256((proto_root / PROTO_RELATIVE).read_bytes()).hexdigest()


def is_current() -> bool:
    stamp = GENERATED_DIR / _STAMP
    try:
        return stamp.read_text().strip() == _proto_hash(proto_dir())
    except FileNotFoundError:
        return False


def generate(force: bool = False) -> Path:
    """Generates (if needed) and returns the directory to put on sys.path."""
    proto_root = proto_dir()
    if not (proto_root / PROTO_RELATIVE).is_file():
        raise FileNotFoundError(
            f"{proto_root / PROTO_RELATIVE} not found; set ATTNSERVE_PROTO_DIR to the folder "
            "that holds attnserve/v1/attention_service.proto")
    if not force and is_current():
        return GENERATED_DIR
    try:
        from grpc_tools import protoc  # noqa: PLC0415 (only needed when generating)
    except ImportError as exc:
        raise ImportError(
            "attnserve_client needs grpcio-tools to generate its protobuf modules; run "
            "deploy/setup.sh (or pip install -r requirements.txt into the venv)") from exc
    import importlib.resources  # noqa: PLC0415

    # Concurrent first imports (parallel tests) take turns; the loser finds the work done.
    with open(PACKAGE_DIR / ".codegen.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not force and is_current():
            return GENERATED_DIR
        well_known = str(importlib.resources.files("grpc_tools") / "_proto")
        tmp = Path(tempfile.mkdtemp(prefix="_generated.", dir=PACKAGE_DIR))
        try:
            rc = protoc.main([
                "grpc_tools.protoc",
                f"--proto_path={proto_root}",
                f"--proto_path={well_known}",
                f"--python_out={tmp}",
                f"--pyi_out={tmp}",
                f"--grpc_python_out={tmp}",
                str(proto_root / PROTO_RELATIVE),
            ])
            if rc != 0:
                raise RuntimeError(f"grpc_tools.protoc failed with exit code {rc}")
            for package in (tmp / "attnserve", tmp / "attnserve" / "v1"):
                (package / "__init__.py").touch()
            (tmp / _STAMP).write_text(_proto_hash(proto_root) + "\n")
            if GENERATED_DIR.exists():
                shutil.rmtree(GENERATED_DIR)
            tmp.rename(GENERATED_DIR)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp)
    return GENERATED_DIR


def ensure_on_path() -> None:
    """Generates if needed and makes `import attnserve.v1.attention_service_pb2` work."""
    path = str(generate())
    if path not in sys.path:
        sys.path.insert(0, path)
