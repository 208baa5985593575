"""Channel credentials: plaintext, TLS, mutual TLS, and a bearer token sent with every call.

The same options as the C++ client library (client/library/channel_credentials.h) and the
`gradserve` tool's flags, by the same names (docs/security.md):

    creds = channel_credentials(tls_ca="ca.pem",             # the CA of the server's certificate
                                tls_cert="client.pem",       # mutual TLS: this client's chain ...
                                tls_key="client-key.pem",    # ... and its key
                                token_file="trainer-1.token")  # "authorization: Bearer TOKEN"

Client(target, tls_ca=..., ...) calls it for you. The token comes from `token`, else the first
line of `token_file`, else the environment variable GRADSERVE_TOKEN (as the `gradserve` tool
reads it); pass token="" to ignore the environment.

Errors: ValueError naming the option (tls_ca, tls_cert, tls_key, token_file, GRADSERVE_TOKEN)
for a file that cannot be read, half a key pair, a token that is not printable ASCII without
spaces, or a token without TLS (a token sent in plaintext is anyone's who sees it; the server
refuses that combination too). No message quotes a token or a file's contents.
"""

from __future__ import annotations

import os
from typing import Optional

import grpc

TOKEN_ENV = "GRADSERVE_TOKEN"


def is_valid_token(token: Optional[str]) -> bool:
    """Whether token can be sent as a bearer token: printable ASCII, no spaces, not empty."""
    return token is not None and token != "" and all(" " < c < "\x7f" for c in token)


def _read(path: str, option: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ValueError(f"{option} {path}: cannot be read: {e.strerror}") from None


def read_token_file(path: str) -> str:
    """The token in a file: its first line, surrounding whitespace removed; ValueError if the
    file cannot be read or the line is not printable ASCII without spaces."""
    text = _read(path, "token_file").decode("utf-8", errors="replace")
    token = text.split("\n", 1)[0].strip()
    if not is_valid_token(token):
        raise ValueError(f"token_file {path}: its first line must be the token, printable "
                         "ASCII without spaces")
    return token


def resolve_token(token: Optional[str] = None, token_file: Optional[str] = None
                  ) -> Optional[str]:
    """The bearer token to send, or None: token if given (an empty string: none, and the
    environment is not read), else token_file's first line, else GRADSERVE_TOKEN if set."""
    if token is not None and token_file is not None:
        raise ValueError("give token or token_file, not both")
    if token is not None:
        if token and not is_valid_token(token):
            raise ValueError("the token must be printable ASCII without spaces")
        return token or None
    if token_file is not None:
        return read_token_file(token_file)
    env = os.environ.get(TOKEN_ENV)
    if env:
        if not is_valid_token(env):
            raise ValueError(f"{TOKEN_ENV} must be printable ASCII without spaces")
        return env
    return None


def channel_credentials(*, tls: bool = False, tls_ca: Optional[str] = None,
                        tls_cert: Optional[str] = None, tls_key: Optional[str] = None,
                        token: Optional[str] = None, token_file: Optional[str] = None
                        ) -> Optional[grpc.ChannelCredentials]:
    """grpc.ChannelCredentials for these options, or None for plaintext.

    tls: TLS even without tls_ca (the server's certificate then checked against the system's
    roots); implied by tls_ca, tls_cert and tls_key. tls_ca: PEM file of the CAs the server's
    certificate must chain to. tls_cert, tls_key: PEM files of this client's certificate chain
    and key, for mutual TLS (both or neither). token, token_file: see resolve_token.
    """
    bearer = resolve_token(token, token_file)
    uses_tls = bool(tls or tls_ca or tls_cert or tls_key)
    if not uses_tls:
        if bearer is not None:
            hint = ""
            if token is None and token_file is None:
                hint = f" (it comes from {TOKEN_ENV}; token=\"\" sends none)"
            raise ValueError("a token is sent only over TLS: add tls_ca (or tls=True) for a "
                             f"server with --tls_cert{hint}")
        return None
    if bool(tls_cert) != bool(tls_key):
        raise ValueError("tls_key needs tls_cert" if tls_key else "tls_cert needs tls_key")
    root = _read(tls_ca, "tls_ca") if tls_ca else None
    chain = _read(tls_cert, "tls_cert") if tls_cert else None
    key = _read(tls_key, "tls_key") if tls_key else None
    credentials = grpc.ssl_channel_credentials(root_certificates=root, private_key=key,
                                               certificate_chain=chain)
    if bearer is not None:
        credentials = grpc.composite_channel_credentials(
            credentials, grpc.access_token_call_credentials(bearer))
    return credentials
