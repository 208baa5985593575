"""The Python client over TLS, mutual TLS and with bearer tokens, against a real server started
with --tls_cert, --tls_key, --auth_tokens_file (and --tls_client_ca for mutual TLS).

Certificates are made at test time with Debian's openssl in a temporary folder (as
tests/server/security/test_pki.cc does), and the tokens are random: nothing secret is
committed. The server's whole log is checked for the tokens (docs/security.md: a secret never
reaches a log line).

Run: GRADSERVE_SERVER=... GRADSERVE_PY_STUBS=... /usr/bin/python3 tests/python/test_tls.py
"""

import hashlib
import os
import secrets
import shutil
import subprocess
import tempfile
import time
import unittest
from unittest import mock

import grpc
import numpy as np
import torch

from server_fixture import ServerProcess  # first: puts client/python on sys.path
from gradserve import Client, GradserveError, GraphBuilder, channel_credentials

_NEW_KEY = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
# A call that cannot connect (bad certificate, no client certificate) fails within this.
_FAIL_TIMEOUT_S = 5

X = np.array([0.5, -1.0, 2.0], np.float64)
W = np.array([[0.1, 0.2, -0.3], [0.4, -0.5, 0.6]], np.float64)


def make_pki(folder):
    """In folder: ca.pem and other-ca.pem (unrelated CAs); server.pem/server-key.pem for
    localhost and 127.0.0.1, signed by ca; client.pem/client-key.pem signed by ca;
    other-client.pem/other-client-key.pem signed by other-ca."""

    def run(command):
        subprocess.run(command, shell=True, cwd=folder, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    with open(os.path.join(folder, "server.ext"), "w") as f:
        f.write("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    with open(os.path.join(folder, "client.ext"), "w") as f:
        f.write("extendedKeyUsage=clientAuth\n")
    for ca in ("ca", "other-ca"):
        run(f"openssl req -x509 {_NEW_KEY} -keyout {ca}-key.pem -out {ca}.pem -days 2 "
            f"-subj /CN={ca}")
    for ca, name, cn, ext in (("ca", "server", "localhost", "server.ext"),
                              ("ca", "client", "alice", "client.ext"),
                              ("other-ca", "other-client", "mallory", "client.ext")):
        run(f"openssl req {_NEW_KEY} -keyout {name}-key.pem -out {name}.csr -subj /CN={cn}")
        run(f"openssl x509 -req -in {name}.csr -CA {ca}.pem -CAkey {ca}-key.pem "
            f"-CAcreateserial -out {name}.pem -days 2 -extfile {ext}")


def digest(token):
    return hashlib.sha256(token.encode()).hexdigest()


def graph():
    """loss = sum(tanh(W x)^2), gradients with respect to x and W."""
    return (GraphBuilder()
            .leaf("x", X, requires_grad=True)
            .leaf("W", W, requires_grad=True)
            .op("matmul", ["W", "x"], out="h")
            .op("tanh", ["h"], out="t")
            .op("mul", ["t", "t"], out="sq")
            .op("sum", ["sq"], out="loss")
            .backward_call("loss", inputs=["x", "W"]))


def expected_gradients():
    x = torch.tensor(X, requires_grad=True)
    w = torch.tensor(W, requires_grad=True)
    loss = (torch.tanh(w @ x) ** 2).sum()
    gx, gw = torch.autograd.grad(loss, [x, w])
    return {"x": gx.numpy(), "W": gw.numpy()}


class TlsTestBase(unittest.TestCase):
    """Makes the PKI and the token file, and starts the server with extra_flags."""

    extra_flags = ()

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="gradserve-py-tls-")
        try:
            make_pki(cls.dir)
            cls.token = secrets.token_hex(32)           # trainer: grad
            cls.info_token = secrets.token_hex(32)      # dashboard: info only
            cls.wrong_token = secrets.token_hex(32)     # in no file
            with open(cls.path("tokens.txt"), "w") as f:
                f.write("# NAME TENANT SHA256 METHODS\n"
                        f"trainer acme {digest(cls.token)}\n"
                        f"dashboard acme {digest(cls.info_token)} info\n")
            with open(cls.path("trainer.token"), "w") as f:
                f.write(cls.token + "\n")
            flags = [f"--tls_cert={cls.path('server.pem')}",
                     f"--tls_key={cls.path('server-key.pem')}",
                     f"--auth_tokens_file={cls.path('tokens.txt')}", "--log_requests=all"]
            flags += [flag.format(dir=cls.dir) for flag in cls.extra_flags]
            cls.server = ServerProcess(
                *flags, secrets=(cls.token, cls.info_token, cls.wrong_token)).start()
        except BaseException:
            shutil.rmtree(cls.dir, ignore_errors=True)
            raise
        cls.expected = expected_gradients()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        shutil.rmtree(cls.dir, ignore_errors=True)
        if cls.server.leaked_secrets():
            raise AssertionError(f"{cls.server.leaked_secrets()} token(s) in the server's log")

    @classmethod
    def path(cls, name):
        return os.path.join(cls.dir, name)

    def connect(self, **security):
        """A Client of the server, not waiting for the connection (it may fail)."""
        return Client(self.server.address, timeout=_FAIL_TIMEOUT_S, **security)

    def assert_grad_ok(self, client):
        result = client.grad(graph())
        for name in ("x", "W"):
            np.testing.assert_allclose(result.calls[0][name], self.expected[name], rtol=1e-12)

    def assert_refused(self, code, **security):
        with self.connect(**security) as client:
            with self.assertRaises(GradserveError) as caught:
                client.grad(graph())
        self.assertEqual(caught.exception.code, code, caught.exception)
        for token in (self.token, self.info_token, self.wrong_token):
            self.assertNotIn(token, str(caught.exception))
        return caught.exception


class TlsTokenTest(TlsTestBase):

    def test_the_right_token_over_tls_gets_the_gradients(self):
        with self.server.client(tls_ca=self.path("ca.pem"), token=self.token) as client:
            self.assert_grad_ok(client)
            self.assertEqual(client.ping(b"tls"), b"tls")

    def test_the_log_names_the_tenant_never_the_token(self):
        with self.server.client(tls_ca=self.path("ca.pem"), token=self.token) as client:
            client.grad(graph(), request_id="logged")
        self.assert_refused(grpc.StatusCode.UNAUTHENTICATED, tls_ca=self.path("ca.pem"),
                            token=self.wrong_token)
        deadline = time.monotonic() + 5
        while "tenant=acme" not in self.server.log() and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertIn("tenant=acme", self.server.log())
        self.assertEqual(self.server.leaked_secrets(), 0)  # and again for all tests at the end

    def test_the_token_from_a_file_or_the_environment(self):
        with self.server.client(tls_ca=self.path("ca.pem"),
                                token_file=self.path("trainer.token")) as client:
            self.assert_grad_ok(client)
        with mock.patch.dict(os.environ, {"GRADSERVE_TOKEN": self.token}):
            with self.server.client(tls_ca=self.path("ca.pem")) as client:
                self.assert_grad_ok(client)

    def test_own_credentials_with_a_token(self):
        with open(self.path("ca.pem"), "rb") as f:
            credentials = grpc.ssl_channel_credentials(f.read())
        with self.server.client(credentials=credentials, token=self.token) as client:
            self.assert_grad_ok(client)
        with self.server.client(
                credentials=channel_credentials(tls_ca=self.path("ca.pem"), token=self.token)
        ) as client:
            self.assert_grad_ok(client)

    def test_streamed_grad_with_a_token_not_allowed_info(self):
        # The stream needs the server's limits (GetServerInfo), which "grad" does not allow:
        # the client falls back to the default chunk size.
        with self.server.client(tls_ca=self.path("ca.pem"), token=self.token) as client:
            result = client.grad(graph(), stream=True)
        np.testing.assert_allclose(result.calls[0]["x"], self.expected["x"], rtol=1e-12)

    def test_no_token_is_unauthenticated(self):
        with mock.patch.dict(os.environ, {"GRADSERVE_TOKEN": ""}):
            self.assert_refused(grpc.StatusCode.UNAUTHENTICATED, tls_ca=self.path("ca.pem"))
        self.assert_refused(grpc.StatusCode.UNAUTHENTICATED, tls_ca=self.path("ca.pem"),
                            token="")

    def test_a_wrong_token_is_unauthenticated(self):
        self.assert_refused(grpc.StatusCode.UNAUTHENTICATED, tls_ca=self.path("ca.pem"),
                            token=self.wrong_token)
        self.assert_refused(grpc.StatusCode.UNAUTHENTICATED, tls_ca=self.path("ca.pem"),
                            token=self.token[:-1])

    def test_a_token_not_allowed_grad_is_permission_denied(self):
        self.assert_refused(grpc.StatusCode.PERMISSION_DENIED, tls_ca=self.path("ca.pem"),
                            token=self.info_token)
        with self.server.client(tls_ca=self.path("ca.pem"), token=self.info_token) as client:
            self.assertTrue(client.info().version)

    def test_health_needs_no_token(self):
        with self.server.client(tls_ca=self.path("ca.pem"), token="") as client:
            self.assertEqual(client.health(), "SERVING")

    def test_plaintext_or_another_ca_does_not_connect(self):
        self.assert_refused(grpc.StatusCode.UNAVAILABLE, token="")
        self.assert_refused(grpc.StatusCode.UNAVAILABLE, tls_ca=self.path("other-ca.pem"),
                            token=self.token)

    def test_a_token_without_tls_is_refused_before_sending(self):
        for security in ({"token": self.token},
                         {"token_file": self.path("trainer.token")}):
            with self.assertRaises(ValueError) as caught:
                self.connect(**security)
            self.assertIn("only over TLS", str(caught.exception))
            self.assertNotIn(self.token, str(caught.exception))
        with mock.patch.dict(os.environ, {"GRADSERVE_TOKEN": self.token}):
            with self.assertRaises(ValueError) as caught:
                self.connect()
            self.assertIn("GRADSERVE_TOKEN", str(caught.exception))
            self.assertNotIn(self.token, str(caught.exception))

    def test_bad_security_options_name_the_option(self):
        cases = [({"tls_ca": self.path("missing.pem")}, "tls_ca"),
                 ({"tls_cert": self.path("client.pem")}, "tls_cert needs tls_key"),
                 ({"tls_key": self.path("client-key.pem")}, "tls_key needs tls_cert"),
                 ({"tls": True, "token": "two words"}, "printable ASCII"),
                 ({"tls": True, "token": "a", "token_file": "b"}, "not both"),
                 ({"tls": True, "token_file": self.path("bad.token")}, "token_file"),
                 ({"tls": True, "token_file": self.path("missing.token")}, "token_file")]
        with open(self.path("bad.token"), "w") as f:
            f.write("not a token\n")
        for security, message in cases:
            with self.assertRaises(ValueError) as caught:
                self.connect(**security)
            self.assertIn(message, str(caught.exception))
            self.assertNotIn("not a", str(caught.exception))  # never a file's contents


class MutualTlsTest(TlsTestBase):

    extra_flags = ("--tls_client_ca={dir}/ca.pem",)

    def test_a_client_certificate_and_a_token_get_the_gradients(self):
        with self.server.client(tls_ca=self.path("ca.pem"), tls_cert=self.path("client.pem"),
                                tls_key=self.path("client-key.pem"),
                                token=self.token) as client:
            self.assert_grad_ok(client)

    def test_without_a_client_certificate_it_does_not_connect(self):
        self.assert_refused(grpc.StatusCode.UNAVAILABLE, tls_ca=self.path("ca.pem"),
                            token=self.token)

    def test_a_client_certificate_of_another_ca_does_not_connect(self):
        self.assert_refused(grpc.StatusCode.UNAVAILABLE, tls_ca=self.path("ca.pem"),
                            tls_cert=self.path("other-client.pem"),
                            tls_key=self.path("other-client-key.pem"), token=self.token)

    def test_a_client_certificate_without_a_token_is_unauthenticated(self):
        self.assert_refused(grpc.StatusCode.UNAUTHENTICATED, tls_ca=self.path("ca.pem"),
                            tls_cert=self.path("client.pem"),
                            tls_key=self.path("client-key.pem"), token="")


if __name__ == "__main__":
    unittest.main()
