package gradserve_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	gradserve "gradserve.dev/client/go"
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

// A graph session (compiled, not run: it needs a server): the forward pass, a look at its
// outputs, a backward call with a seed picked from them, then a loss added with Extend.
func ExampleClient_Forward() {
	client, err := gradserve.Dial("127.0.0.1:50051")
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	g := gradserve.NewGraph()
	g.Leaf("x", g.Must(gradserve.Float64([]float64{0.5, -1, 2})), gradserve.RequiresGrad()).
		Leaf("W", g.Must(gradserve.Float64([]float64{0.1, 0.2, -0.3, 0.4, -0.5, 0.6}, 2, 3)),
			gradserve.RequiresGrad()).
		Op("matmul", []string{"W", "x"}, "h").
		Op("tanh", []string{"h"}, "t")
	s, err := client.Forward(ctx, g, "t")
	if err != nil {
		log.Fatal(err) // status.Code(err): INVALID_ARGUMENT, RESOURCE_EXHAUSTED, ...
	}
	defer s.Release(ctx)

	t, err := s.Values["t"].Float64s()
	if err != nil {
		log.Fatal(err)
	}
	seed, err := gradserve.Float64([]float64{2 * t[0], 2 * t[1]}) // d(sum t^2)/dt
	if err != nil {
		log.Fatal(err)
	}
	grads, err := s.Backward(ctx, []string{"t"}, gradserve.Seed("t", seed),
		gradserve.Inputs("x", "W"), gradserve.RetainGraph()) // kept for the next call
	if err != nil {
		log.Fatal(err)
	}
	dW, _ := grads.Floats("W")
	fmt.Println("dW", dW)

	loss := gradserve.NewGraph() // over the session's values
	loss.Leaf("target", loss.Must(gradserve.Float64([]float64{1, -1}))).
		Op("mse_loss", []string{"t", "target"}, "loss")
	values, err := s.Extend(ctx, loss, "loss")
	if err != nil {
		log.Fatal(err)
	}
	grads, err = s.Backward(ctx, []string{"loss"}, gradserve.Inputs("W"))
	if err != nil {
		log.Fatal(err) // NOT_FOUND: the session expired; FAILED_PRECONDITION: graph freed
	}
	l, _ := values["loss"].Float64s()
	dW, _ = grads.Floats("W")
	fmt.Println("loss", l, "dW", dW)
}
