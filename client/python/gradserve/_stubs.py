"""Finds the generated protobuf/gRPC modules and makes them importable as gradserve.v1.

The stubs are generated at build time by client/python/generate.sh OUTDIR and never committed.
The package looks for OUTDIR in the environment variable GRADSERVE_PY_STUBS first, then in every
sys.path entry, and takes the first directory that holds gradserve/v1/gradserve_pb2.py. It
appends OUTDIR/gradserve to this package's __path__, so that the generated code's own imports
(``from gradserve.v1 import tensor_pb2``) resolve to the generated files.

The health protocol's messages (module path grpc/health/v1, which would shadow grpcio's grpc
package) live in OUTDIR/health and are loaded by file path.

Errors: ImportError naming GRADSERVE_PY_STUBS and generate.sh when no stubs are found.
"""

import importlib.util
import os
import sys

ENV_VAR = "GRADSERVE_PY_STUBS"
_MARKER = os.path.join("gradserve", "v1", "gradserve_pb2.py")


def find_stubs_dir():
    """Returns the directory generate.sh wrote to, or raises ImportError."""
    candidates = []
    if os.environ.get(ENV_VAR):
        candidates.append(os.environ[ENV_VAR])
    candidates.extend(p for p in sys.path if p)
    for directory in candidates:
        if os.path.isfile(os.path.join(directory, _MARKER)):
            return os.path.abspath(directory)
    raise ImportError(
        "gradserve: generated stubs not found; run client/python/generate.sh OUTDIR and set "
        f"{ENV_VAR}=OUTDIR (looked in {ENV_VAR}={os.environ.get(ENV_VAR, '')!r} and sys.path)")


def install(package_path):
    """Extends the gradserve package's __path__ with the stubs; returns the stubs directory."""
    stubs = find_stubs_dir()
    generated = os.path.join(stubs, "gradserve")
    if generated not in package_path:
        package_path.append(generated)
    return stubs


def load_health_module(stubs_dir):
    """The generated grpc.health.v1 messages module, loaded from its file under a private name."""
    name = "gradserve._health_pb2"
    if name in sys.modules:
        return sys.modules[name]
    path = os.path.join(stubs_dir, "health", "grpc", "health", "v1", "health_pb2.py")
    if not os.path.isfile(path):
        raise ImportError(f"gradserve: {path} missing; rerun client/python/generate.sh")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
