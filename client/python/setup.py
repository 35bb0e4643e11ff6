"""Builds the attnserve_client package (metadata in pyproject.toml) with its protobuf modules:
build_py generates them from the repository's proto/ (grpcio-tools, a build requirement) into the
built package, beside a copy of the .proto, so an installed client needs no build tree."""

import importlib.util
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


class BuildPyWithProtos(build_py):
    def run(self):
        super().run()
        # _codegen.py alone: importing the package would generate into the source tree.
        spec = importlib.util.spec_from_file_location(
            "_attnserve_codegen", HERE / "attnserve_client" / "_codegen.py")
        codegen = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(codegen)
        codegen.package_into(Path(self.build_lib) / "attnserve_client")


setup(cmdclass={"build_py": BuildPyWithProtos})
