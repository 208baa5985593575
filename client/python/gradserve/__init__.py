"""gradserve: a Python client for the gradserve gradient service.

Installed with `pip install --no-build-isolation client/python` (README.md), the package has its
stubs and needs no setup. From the source tree: the protobuf/gRPC stubs are generated, never
committed. Generate them once with

    client/python/generate.sh OUTDIR

and tell the package where they are with the environment variable GRADSERVE_PY_STUBS=OUTDIR
(or put OUTDIR on sys.path). Then, with client/python on sys.path (PYTHONPATH), Debian's
/usr/bin/python3 and its python3-grpcio, python3-protobuf and python3-numpy:

    import numpy as np
    from gradserve import Client, GraphBuilder

    g = (GraphBuilder()
         .leaf("x", np.array([1.0, 2.0, 3.0]), requires_grad=True)
         .op("mul", ["x", "x"], out="y")
         .op("sum", ["y"], out="loss")
         .backward_call("loss", inputs=["x"]))
    with Client("127.0.0.1:50051", timeout=10) as client:
        print(client.grad(g).calls[0]["x"])      # [2. 4. 6.]

Over TLS with a token (docs/security.md), as the `gradserve` tool's flags of the same names:

    Client("gradserve.example:50051", tls_ca="ca.pem", token_file="trainer-1.token")
    # mutual TLS: add tls_cert="client.pem", tls_key="client-key.pem"; the token may also come
    # from token="..." or the environment variable GRADSERVE_TOKEN

Modules: client (Client, GradResult, CallResult, GradserveError), aio (AsyncClient, the same
calls as coroutines on grpc.aio), torch (to_graph: a torch.fx-traced module as a graph; imports
PyTorch), graph (GraphBuilder),
tensors (to_tensor, from_tensor), shared_memory (SharedMemory: tensors and gradients through a
POSIX shared-memory object, for clients on the server's host), credentials
(channel_credentials, read_token_file). The generated messages are
gradserve.v1.{tensor,graph,gradserve}_pb2. Importing raises ImportError, naming
GRADSERVE_PY_STUBS, if no stubs are found.
"""

from gradserve import _stubs

_stubs.install(__path__)

from gradserve.client import (CallResult, Client, GradResult, GradserveError,  # noqa: E402
                              Session)
from gradserve.credentials import channel_credentials  # noqa: E402
from gradserve.graph import GraphBuilder, attr_value, backward_call  # noqa: E402
from gradserve.shared_memory import SharedMemory  # noqa: E402
from gradserve.tensors import (BFLOAT16, from_bfloat16, from_tensor, to_bfloat16,  # noqa: E402
                               to_tensor)

__all__ = ["BFLOAT16", "CallResult", "Client", "GradResult", "GradserveError", "GraphBuilder",
           "Session", "SharedMemory", "attr_value", "backward_call", "channel_credentials",
           "from_bfloat16", "from_tensor", "to_bfloat16", "to_tensor"]
