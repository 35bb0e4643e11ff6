"""Generates the Python protobuf/gRPC modules of attnserve.v1 from proto/ with grpcio-tools.

The generated code is not committed: it is written to attnserve_client/_generated/ (git-ignored)
the first time the package is imported, and again whenever the .proto file changes (a SHA-256
stamp records what it was generated from). deploy/setup.sh and the ctest test run it ahead of
time through client/python/gen_proto.py. An installed package (`pip install ./client/python`,
setup.py) carries its generated modules and a copy of the .proto, so it needs neither the
repository nor grpcio-tools.

The .proto file is found at $ATTNSERVE_PROTO_DIR/attnserve/v1/attention_service.proto, else in
the repository's proto/ folder (this file lives in client/python/attnserve_client/), else in the
copy an installed package carries (attnserve_client/proto/).
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
    if env:
        return Path(env)
    repository = PACKAGE_DIR.parents[2] / "proto"
    if (repository / PROTO_RELATIVE).is_file():
        return repository
    return PACKAGE_DIR / "proto"  # an installed package's copy


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
    # Concurrent first imports (parallel tests) take turns; the loser finds the work done.
    with open(PACKAGE_DIR / ".codegen.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not force and is_current():
            return GENERATED_DIR
        _generate_into(PACKAGE_DIR, proto_root)
    return GENERATED_DIR


def _generate_into(package_dir: Path, proto_root: Path) -> None:
    """Writes package_dir/_generated (with its stamp) from proto_root, replacing what was there."""
    try:
        from grpc_tools import protoc  # noqa: PLC0415 (only needed when generating)
    except ImportError as exc:
        raise ImportError(
            "attnserve_client needs grpcio-tools to generate its protobuf modules; run "
            "deploy/setup.sh (or pip install -r requirements.txt into the venv)") from exc
    import importlib.resources  # noqa: PLC0415

    well_known = str(importlib.resources.files("grpc_tools") / "_proto")
    tmp = Path(tempfile.mkdtemp(prefix="_generated.", dir=package_dir))
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
        target = package_dir / GENERATED_DIR.name
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def package_into(package_dir: Path) -> None:
    """For setup.py: puts the generated modules and a copy of the .proto into a built package
    (package_dir is the build tree's attnserve_client/), so the installed package needs neither
    this repository nor grpcio-tools."""
    proto_root = proto_dir()
    source = proto_root / PROTO_RELATIVE
    if not source.is_file():
        raise FileNotFoundError(f"{source} not found: build from the attnserve repository "
                                "(client/python), or set ATTNSERVE_PROTO_DIR")
    copy = package_dir / "proto" / PROTO_RELATIVE
    copy.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, copy)
    _generate_into(package_dir, proto_root)


def ensure_on_path() -> None:
    """Generates if needed and makes `import attnserve.v1.attention_service_pb2` work."""
    path = str(generate())
    if path not in sys.path:
        sys.path.insert(0, path)
