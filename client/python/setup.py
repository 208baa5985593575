"""Generates the protobuf and gRPC stubs into the package while it is built.

build_py runs Debian's protoc with grpc_python_plugin (packages protobuf-compiler and
protobuf-compiler-grpc; PROTOC and GRPC_PYTHON_PLUGIN override them) over the wire contract in
../../proto (GRADSERVE_PROTO_DIR overrides it), writing gradserve/v1/*_pb2.py,
gradserve_pb2_grpc.py and gradserve/_health/health_pb2.py into the build folder: the installed
package needs no GRADSERVE_PY_STUBS and no PYTHONPATH. Everything else is in pyproject.toml.
"""

import os
import shutil
import subprocess
import tempfile

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
PROTOS = ["gradserve/v1/tensor.proto", "gradserve/v1/graph.proto", "gradserve/v1/gradserve.proto"]
HEALTH = "grpc/health/v1/health.proto"


def _tool(env, name, package):
    path = os.environ.get(env) or shutil.which(name)
    if not path:
        raise SystemExit(f"gradserve: {name} not found; apt-get install {package} "
                         f"(or set {env})")
    return path


class BuildWithStubs(build_py):
    """build_py, then the generated modules into the build folder's gradserve/."""

    def run(self):
        super().run()
        proto_dir = os.environ.get("GRADSERVE_PROTO_DIR") or os.path.join(HERE, "..", "..", "proto")
        if not os.path.isfile(os.path.join(proto_dir, PROTOS[-1])):
            raise SystemExit(f"gradserve: {proto_dir}/{PROTOS[-1]} not found; build from the "
                             "repository (client/python) or set GRADSERVE_PROTO_DIR")
        protoc = _tool("PROTOC", "protoc", "protobuf-compiler")
        plugin = _tool("GRPC_PYTHON_PLUGIN", "grpc_python_plugin", "protobuf-compiler-grpc")
        package = os.path.join(self.build_lib, "gradserve")
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run([protoc, "-I", proto_dir, f"--python_out={tmp}", f"--grpc_out={tmp}",
                            f"--plugin=protoc-gen-grpc={plugin}"] + PROTOS, check=True)
            subprocess.run([protoc, "-I", proto_dir, f"--python_out={tmp}", HEALTH], check=True)
            os.makedirs(os.path.join(package, "v1"), exist_ok=True)
            os.makedirs(os.path.join(package, "_health"), exist_ok=True)
            for name in os.listdir(os.path.join(tmp, "gradserve", "v1")):
                shutil.copy(os.path.join(tmp, "gradserve", "v1", name), os.path.join(package, "v1"))
            shutil.copy(os.path.join(tmp, "grpc", "health", "v1", "health_pb2.py"),
                        os.path.join(package, "_health", "health_pb2.py"))
        for sub in ("v1", "_health"):
            init = os.path.join(package, sub, "__init__.py")
            if not os.path.exists(init):
                with open(init, "w") as f:
                    f.write('"""Generated from proto/ when the package was built."""\n')


setup(cmdclass={"build_py": BuildWithStubs})
