package gradserve_test

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	gradserve "gradserve.dev/client/go"
)

const newKey = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"

// makePKI writes, in dir, with Debian's openssl: ca.pem and other-ca.pem (unrelated CAs);
// server.pem for localhost and 127.0.0.1 signed by ca; client.pem signed by ca;
// other-client.pem signed by other-ca (each with its -key.pem), as tests/python/test_tls.py.
func makePKI(t *testing.T, dir string) {
	t.Helper()
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Skip("openssl not found; apt-get install openssl")
	}
	run := func(command string) {
		cmd := exec.Command("sh", "-c", command)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", command, err, out)
		}
	}
	os.WriteFile(filepath.Join(dir, "server.ext"), []byte("subjectAltName=DNS:localhost,IP:127.0.0.1\n"), 0o600)
	os.WriteFile(filepath.Join(dir, "client.ext"), []byte("extendedKeyUsage=clientAuth\n"), 0o600)
	for _, ca := range []string{"ca", "other-ca"} {
		run(fmt.Sprintf("openssl req -x509 %s -keyout %s-key.pem -out %s.pem -days 2 -subj /CN=%s", newKey, ca, ca, ca))
	}
	for _, c := range [][4]string{{"ca", "server", "localhost", "server.ext"}, {"ca", "client", "alice", "client.ext"},
		{"other-ca", "other-client", "mallory", "client.ext"}} {
		run(fmt.Sprintf("openssl req %s -keyout %s-key.pem -out %s.csr -subj /CN=%s", newKey, c[1], c[1], c[2]))
		run(fmt.Sprintf("openssl x509 -req -in %s.csr -CA %s.pem -CAkey %s-key.pem -CAcreateserial -out %s.pem -days 2 -extfile %s",
			c[1], c[0], c[0], c[1], c[3]))
	}
}

func randomToken(t *testing.T) string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

func digest(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

type pki struct {
	dir                       string
	token, infoToken, unknown string
}

func (p pki) path(name string) string { return filepath.Join(p.dir, name) }

func newPKI(t *testing.T) pki {
	p := pki{dir: t.TempDir(), token: randomToken(t), infoToken: randomToken(t), unknown: randomToken(t)}
	makePKI(t, p.dir)
	tokens := fmt.Sprintf("# NAME TENANT SHA256 METHODS\ntrainer acme %s\ndashboard acme %s info\n",
		digest(p.token), digest(p.infoToken))
	if err := os.WriteFile(p.path("tokens.txt"), []byte(tokens), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p.path("trainer.token"), []byte(p.token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// checkNoSecrets fails if a token reached the server's log or an error message.
func (p pki) checkNoSecrets(t *testing.T, texts ...string) {
	t.Helper()
	for _, text := range texts {
		for _, secret := range []string{p.token, p.infoToken, p.unknown} {
			if strings.Contains(text, secret) {
				t.Fatal("a token was written to the server's log or an error message")
			}
		}
	}
}

func gradCode(t *testing.T, client *gradserve.Client) (codes.Code, string) {
	t.Helper()
	req, err := tanhGraph().Request("")
	if err != nil {
		t.Fatal(err)
	}
	result, err := client.Grad(timeout(t, 10*time.Second), req)
	if err == nil {
		checkTanh(t, result)
	}
	return status.Code(err), fmt.Sprint(err)
}

func TestTLSAndTokens(t *testing.T) {
	p := newPKI(t)
	server := startServer(t, "--tls_cert="+p.path("server.pem"), "--tls_key="+p.path("server-key.pem"),
		"--auth_tokens_file="+p.path("tokens.txt"), "--log_requests=all")
	ca := gradserve.WithTLS(p.path("ca.pem"))
	var messages []string
	for _, c := range []struct {
		name string
		opts []gradserve.Option
		want codes.Code
	}{
		{"token", []gradserve.Option{ca, gradserve.WithToken(p.token)}, codes.OK},
		{"token file", []gradserve.Option{ca, gradserve.WithTokenFile(p.path("trainer.token"))}, codes.OK},
		{"no token", []gradserve.Option{ca}, codes.Unauthenticated},
		{"unknown token", []gradserve.Option{ca, gradserve.WithToken(p.unknown)}, codes.Unauthenticated},
		{"info-only token", []gradserve.Option{ca, gradserve.WithToken(p.infoToken)}, codes.PermissionDenied},
		{"another CA", []gradserve.Option{gradserve.WithTLS(p.path("other-ca.pem")), gradserve.WithToken(p.token)}, codes.Unavailable},
		{"plaintext", nil, codes.Unavailable},
	} {
		client := dial(t, server.address, c.opts...)
		code, message := gradCode(t, client)
		if code != c.want {
			t.Errorf("%s: %v (%s), want %v", c.name, code, message, c.want)
		}
		messages = append(messages, message)
	}
	t.Setenv(gradserve.TokenEnv, p.token)
	client, err := gradserve.Dial(server.address, ca)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	if code, message := gradCode(t, client); code != codes.OK {
		t.Errorf("token from %s: %v (%s)", gradserve.TokenEnv, code, message)
	}
	server.Stop()
	p.checkNoSecrets(t, append(messages, server.Log())...)
}

func TestMutualTLS(t *testing.T) {
	p := newPKI(t)
	server := startServer(t, "--tls_cert="+p.path("server.pem"), "--tls_key="+p.path("server-key.pem"),
		"--tls_client_ca="+p.path("ca.pem"))
	ca := gradserve.WithTLS(p.path("ca.pem"))
	for _, c := range []struct {
		name string
		opts []gradserve.Option
		want codes.Code
	}{
		{"client certificate", []gradserve.Option{ca, gradserve.WithClientCert(p.path("client.pem"), p.path("client-key.pem"))}, codes.OK},
		{"no client certificate", []gradserve.Option{ca}, codes.Unavailable},
		{"certificate of another CA", []gradserve.Option{ca,
			gradserve.WithClientCert(p.path("other-client.pem"), p.path("other-client-key.pem"))}, codes.Unavailable},
	} {
		if code, message := gradCode(t, dial(t, server.address, c.opts...)); code != c.want {
			t.Errorf("%s: %v (%s), want %v", c.name, code, message, c.want)
		}
	}
	if _, err := gradserve.Dial(server.address, ca, gradserve.WithClientCert(p.path("client.pem"), p.path("nothing.pem"))); err == nil ||
		!strings.Contains(err.Error(), "tls_key") {
		t.Errorf("missing key file: %v, want an error naming tls_key", err)
	}
}
