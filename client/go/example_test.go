package gradserve_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestExample runs examples/go (go run, with this test's Go environment) against a server and
// checks the numbers it prints.
func TestExample(t *testing.T) {
	dir, _ := filepath.Abs("../../examples/go")
	if _, err := os.Stat(filepath.Join(dir, "main.go")); err != nil {
		t.Skipf("examples/go not found at %s", dir)
	}
	server := startServer(t)
	cmd := exec.Command("go", "run", ".", "-timeout=20s", server.address)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GRADSERVE_TOKEN=")
	done := make(chan struct{})
	var out []byte
	var err error
	go func() { out, err = cmd.CombinedOutput(); close(done) }()
	select {
	case <-done:
	case <-time.After(4 * time.Minute):
		cmd.Process.Kill()
		t.Fatal("examples/go did not finish in 4 minutes")
	}
	if err != nil {
		t.Fatalf("examples/go: %v\n%s", err, out)
	}
	loss, dx, dw := tanhGradients()
	for _, want := range []string{fmt.Sprintf("loss %.10g", loss), fmt.Sprintf("dloss/dx %.10g", dx),
		fmt.Sprintf("dloss/dW %.10g (shape [2 3])", dw)} {
		if !strings.Contains(string(out), want) {
			t.Fatalf("examples/go printed\n%s\nwithout %q", out, want)
		}
	}
}
