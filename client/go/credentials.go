package gradserve

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"

	"google.golang.org/grpc/credentials"
)

// TokenEnv is the environment variable a bearer token is read from when neither WithToken nor
// WithTokenFile is given, as the gradserve tool and the other clients read it.
const TokenEnv = "GRADSERVE_TOKEN"

// validToken: printable ASCII without spaces, not empty.
func validToken(token string) bool {
	if token == "" {
		return false
	}
	for _, c := range token {
		if c <= ' ' || c >= 0x7f {
			return false
		}
	}
	return true
}

func readFile(path, option string) ([]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return nil, fmt.Errorf("gradserve: %s %s: cannot be read: %v", option, path, err)
	}
	return data, nil
}

// ReadTokenFile is the token in a file: its first line, surrounding whitespace removed. The
// error names the file, never its contents.
func ReadTokenFile(path string) (string, error) {
	data, err := readFile(path, "token_file")
	if err != nil {
		return "", err
	}
	token := strings.TrimSpace(strings.SplitN(string(data), "\n", 2)[0])
	if !validToken(token) {
		return "", fmt.Errorf("gradserve: token_file %s: its first line must be the token, printable ASCII without spaces", path)
	}
	return token, nil
}

// resolveToken: the token option, else the token file's, else GRADSERVE_TOKEN; "" for none.
func (o *options) resolveToken() (string, error) {
	if o.tokenSet {
		if o.token != "" && !validToken(o.token) {
			return "", errors.New("gradserve: the token must be printable ASCII without spaces")
		}
		return o.token, nil
	}
	if o.tokenFile != "" {
		return ReadTokenFile(o.tokenFile)
	}
	if env := os.Getenv(TokenEnv); env != "" {
		if !validToken(env) {
			return "", fmt.Errorf("gradserve: %s must be printable ASCII without spaces", TokenEnv)
		}
		return env, nil
	}
	return "", nil
}

// tlsConfig is the client's TLS configuration, or nil for plaintext.
func (o *options) tlsConfig() (*tls.Config, error) {
	if !o.tls && o.caFile == "" && o.certFile == "" && o.keyFile == "" {
		return nil, nil
	}
	config := &tls.Config{MinVersion: tls.VersionTLS12}
	if o.caFile != "" {
		pem, err := readFile(o.caFile, "tls_ca")
		if err != nil {
			return nil, err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("gradserve: tls_ca %s: no PEM certificate in it", o.caFile)
		}
		config.RootCAs = pool
	}
	if (o.certFile == "") != (o.keyFile == "") {
		return nil, errors.New("gradserve: give both tls_cert and tls_key (mutual TLS), or neither")
	}
	if o.certFile != "" {
		if _, err := readFile(o.certFile, "tls_cert"); err != nil {
			return nil, err
		}
		if _, err := readFile(o.keyFile, "tls_key"); err != nil {
			return nil, err
		}
		pair, err := tls.LoadX509KeyPair(o.certFile, o.keyFile)
		if err != nil {
			return nil, fmt.Errorf("gradserve: tls_cert %s and tls_key %s: not a certificate and its key", o.certFile, o.keyFile)
		}
		config.Certificates = []tls.Certificate{pair}
	}
	return config, nil
}

// bearer sends "authorization: Bearer TOKEN" with every call, over TLS only.
type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

func (bearer) RequireTransportSecurity() bool { return true }

var _ credentials.PerRPCCredentials = bearer("")
