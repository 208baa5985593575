package gradserve_test

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	gradserve "gradserve.dev/client/go"
	pb "gradserve.dev/client/go/gradserve/v1"
)

var (
	xs = []float64{0.5, -1.0, 2.0}
	ws = []float64{0.1, 0.2, -0.3, 0.4, -0.5, 0.6} // [2, 3]
)

// tanhGraph: loss = sum(tanh(W x)^2), gradients with respect to x and W.
func tanhGraph() *gradserve.Graph {
	g := gradserve.NewGraph()
	return g.Leaf("x", g.Must(gradserve.Float64(xs)), gradserve.RequiresGrad()).
		Leaf("W", g.Must(gradserve.Float64(ws, 2, 3)), gradserve.RequiresGrad()).
		Op("matmul", []string{"W", "x"}, "h").
		Op("tanh", []string{"h"}, "t").
		Op("mul", []string{"t", "t"}, "sq").
		Op("sum", []string{"sq"}, "loss").
		Backward([]string{"loss"}, gradserve.Inputs("x", "W")).
		ReturnValues("loss")
}

// tanhGradients by hand: dloss/dh = 2 t (1 - t^2); dx = W^T dh; dW = dh x^T.
func tanhGradients() (loss float64, dx, dw []float64) {
	dx, dw = make([]float64, 3), make([]float64, 6)
	for i := 0; i < 2; i++ {
		h := 0.0
		for j := 0; j < 3; j++ {
			h += ws[3*i+j] * xs[j]
		}
		t := math.Tanh(h)
		loss += t * t
		dh := 2 * t * (1 - t*t)
		for j := 0; j < 3; j++ {
			dx[j] += ws[3*i+j] * dh
			dw[3*i+j] = dh * xs[j]
		}
	}
	return loss, dx, dw
}

func assertClose(t *testing.T, what string, got, want []float64, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: got %d values %v, want %d %v", what, len(got), got, len(want), want)
	}
	for i := range got {
		if math.Abs(got[i]-want[i]) > tol*(1+math.Abs(want[i])) {
			t.Fatalf("%s[%d] = %v, want %v (all: %v vs %v)", what, i, got[i], want[i], got, want)
		}
	}
}

// grad sends g's request and fails the test on any error.
func grad(t *testing.T, client *gradserve.Client, g *gradserve.Graph) *gradserve.Result {
	t.Helper()
	req, err := g.Request("")
	if err != nil {
		t.Fatal(err)
	}
	result, err := client.Grad(timeout(t, 30*time.Second), req)
	if err != nil {
		t.Fatal(err)
	}
	return result
}

func dial(t *testing.T, address string, opts ...gradserve.Option) *gradserve.Client {
	t.Helper()
	c, err := gradserve.Dial(address, append([]gradserve.Option{gradserve.WithToken("")}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func checkTanh(t *testing.T, result *gradserve.Result) {
	t.Helper()
	loss, dx, dw := tanhGradients()
	gx, err := result.Calls[0].Floats("x")
	if err != nil {
		t.Fatal(err)
	}
	gw, err := result.Calls[0].Floats("W")
	if err != nil {
		t.Fatal(err)
	}
	assertClose(t, "dx", gx, dx, 1e-12)
	assertClose(t, "dW", gw, dw, 1e-12)
	if shape := result.Calls[0].Gradients["W"].Shape(); len(shape) != 2 || shape[0] != 2 || shape[1] != 3 {
		t.Fatalf("dW shape %v, want [2 3]", shape)
	}
	l, err := result.Values["loss"].Float64s()
	if err != nil {
		t.Fatal(err)
	}
	assertClose(t, "loss", l, []float64{loss}, 1e-12)
}

func TestGradientsMatchByHand(t *testing.T) {
	server := startServer(t)
	client := dial(t, server.address)
	req, err := tanhGraph().Request("go-test")
	if err != nil {
		t.Fatal(err)
	}
	for _, streamed := range []bool{false, true} {
		result, err := client.Grad(timeout(t, 30*time.Second), req, gradserve.Streamed(streamed))
		if err != nil {
			t.Fatalf("streamed=%v: %v", streamed, err)
		}
		checkTanh(t, result)
		if result.Response.RequestId != "go-test" || result.NumNodes == 0 {
			t.Fatalf("request id %q, %d nodes", result.Response.RequestId, result.NumNodes)
		}
	}
}

func TestFloat32AndSeedsAndUnused(t *testing.T) {
	server := startServer(t)
	client := dial(t, server.address)
	g := gradserve.NewGraph()
	g.Leaf("a", g.Must(gradserve.Float32([]float32{1, 2, 3, 4}, 2, 2)), gradserve.RequiresGrad()).
		Leaf("b", g.Must(gradserve.Float32([]float32{5}, 1)), gradserve.RequiresGrad()).
		Op("exp", []string{"a"}, "e").
		Op("sum", []string{"e"}, "s", gradserve.Attr("dim", []int64{1})).
		Backward([]string{"s"}, gradserve.Seed("s", g.Must(gradserve.Float32([]float32{1, 2}))),
			gradserve.Inputs("a", "b"), gradserve.AllowUnused())
	result := grad(t, client, g)
	ga := result.Calls[0].Gradients["a"]
	got, err := ga.Float32s()
	if err != nil {
		t.Fatal(err)
	}
	want := []float64{math.Exp(1), math.Exp(2), 2 * math.Exp(3), 2 * math.Exp(4)}
	for i := range got {
		if math.Abs(float64(got[i])-want[i]) > 1e-5*want[i] {
			t.Fatalf("da = %v, want %v", got, want)
		}
	}
	if result.Calls[0].Gradients["b"] != nil || result.Calls[0].Connected["b"] {
		t.Fatalf("b is unused, got %v", result.Calls[0].Gradients["b"])
	}
	if _, err := result.Calls[0].Floats("b"); err == nil || !strings.Contains(err.Error(), "not connected") {
		t.Fatalf("Floats(b) = %v, want a not-connected error", err)
	}
}

// float16 and bfloat16 leaves: gradients come back in their dtype, read with Floats.
func TestSixteenBitTensors(t *testing.T) {
	server := startServer(t)
	client := dial(t, server.address)
	for _, make16 := range []func([]float32, ...int64) (gradserve.Tensor, error){gradserve.Float16, gradserve.BFloat16} {
		g := gradserve.NewGraph()
		x := g.Must(make16([]float32{0.5, -1.5, 3, 65504}))
		g.Leaf("x", x, gradserve.RequiresGrad()).
			Op("mul", []string{"x", "x"}, "y").
			Op("sum", []string{"y"}, "s").
			Backward([]string{"s"}, gradserve.Inputs("x"))
		result := grad(t, client, g)
		gx := result.Calls[0].Gradients["x"]
		if gx.DType() != x.DType() {
			t.Fatalf("gradient is %v, want %v", gx.DType(), x.DType())
		}
		got, err := gx.Floats()
		if err != nil {
			t.Fatal(err)
		}
		sent, _ := x.Floats()
		for i := range got {
			// 2x is exact in 16 bits, but for 2 * 65504, past float16's range.
			want := 2 * sent[i]
			if x.DType() == pb.DType_DTYPE_FLOAT16 && want > 65504 {
				want = math.Inf(1)
			}
			if got[i] != want {
				t.Fatalf("%v: dx = %v, want %v", x.DType(), got, want)
			}
		}
	}
}

func TestLargeRequestIsStreamed(t *testing.T) {
	// A 6 MiB leaf, over a 5 MiB message limit: Grad streams it without being asked to.
	server := startServer(t, "--max_message_bytes=5242880", "--chunk_bytes=1048576")
	client := dial(t, server.address)
	n := 6 << 20 / 8
	values := make([]float64, n)
	for i := range values {
		values[i] = float64(i%7) - 3
	}
	g := gradserve.NewGraph()
	g.Leaf("x", g.Must(gradserve.Float64(values)), gradserve.RequiresGrad()).
		Op("mul", []string{"x", "x"}, "y").
		Op("sum", []string{"y"}, "loss").
		Backward([]string{"loss"}, gradserve.Inputs("x"))
	req, _ := g.Request("")
	if _, err := client.Grad(timeout(t, 60*time.Second), req, gradserve.Streamed(false)); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("unary over the limit: %v, want RESOURCE_EXHAUSTED", err)
	}
	result, err := client.Grad(timeout(t, 60*time.Second), req)
	if err != nil {
		t.Fatal(err)
	}
	dx, err := result.Calls[0].Floats("x")
	if err != nil {
		t.Fatal(err)
	}
	for i := range dx {
		if dx[i] != 2*values[i] {
			t.Fatalf("dx[%d] = %v, want %v", i, dx[i], 2*values[i])
		}
	}
}

func TestErrorsAreStatuses(t *testing.T) {
	server := startServer(t)
	client := dial(t, server.address)

	g := gradserve.NewGraph()
	g.Leaf("x", g.Must(gradserve.Float64(xs)), gradserve.RequiresGrad()).
		Op("frobnicate", []string{"x"}, "y").
		Backward([]string{"y"}, gradserve.Inputs("x"))
	req, _ := g.Request("")
	_, err := client.Grad(timeout(t, 30*time.Second), req)
	s, ok := status.FromError(err)
	if !ok || s.Code() != codes.InvalidArgument || !strings.Contains(s.Message(), "frobnicate") {
		t.Fatalf("unknown op: %v, want INVALID_ARGUMENT naming frobnicate", err)
	}

	g = gradserve.NewGraph()
	g.Leaf("x", g.Must(gradserve.Float64(xs)), gradserve.RequiresGrad()).
		Leaf("y", g.Must(gradserve.Float64(xs)), gradserve.RequiresGrad()).
		Op("sum", []string{"x"}, "loss").
		Backward([]string{"loss"}, gradserve.Inputs("x", "y"))
	req, _ = g.Request("")
	_, err = client.Grad(timeout(t, 30*time.Second), req)
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "y") {
		t.Fatalf("unused input: %v, want INVALID_ARGUMENT naming y", err)
	}

	// A deadline: a long chain with 1 ms to run.
	g = gradserve.NewGraph()
	g.Leaf("v0", g.Must(gradserve.Float32([]float32{0.5})), gradserve.RequiresGrad())
	prev := "v0"
	for i := 1; i <= 20000; i++ {
		name := "v" + strconv.Itoa(i)
		g.Op("tanh", []string{prev}, name)
		prev = name
	}
	g.Op("sum", []string{prev}, "loss").Backward([]string{"loss"}, gradserve.Inputs("v0"))
	req, err = g.Request("")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	if _, err = client.Grad(ctx, req); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("1 ms deadline: %v, want DEADLINE_EXCEEDED", err)
	}
	// The server is fine afterwards.
	if p, err := client.Ping(timeout(t, 10*time.Second), []byte("ok")); err != nil || string(p) != "ok" {
		t.Fatalf("ping after errors: %q, %v", p, err)
	}
}

func TestBuilderAndClientMistakes(t *testing.T) {
	if _, err := gradserve.Float64([]float64{1, 2, 3}, 2, 2); err == nil {
		t.Fatal("shape [2 2] with 3 values was accepted")
	}
	g := gradserve.NewGraph()
	g.Leaf("x", g.Must(gradserve.Float64(xs)), gradserve.RequiresGrad()).
		Op("neg", []string{"x"}, "x")
	if _, err := g.Request(""); err == nil || !strings.Contains(err.Error(), `"x" is already defined`) {
		t.Fatalf("repeated name: %v", err)
	}
	g = gradserve.NewGraph()
	g.Leaf("x", g.Must(gradserve.Float64(xs))).Op("sum", []string{"x"}, "s", gradserve.Attr("dim", struct{}{}))
	if _, err := g.Request(""); err == nil || !strings.Contains(err.Error(), `attribute "dim"`) {
		t.Fatalf("bad attribute: %v", err)
	}
	if _, err := gradserve.Dial("127.0.0.1:1", gradserve.WithToken("secret-token")); err == nil ||
		!strings.Contains(err.Error(), "needs TLS") || strings.Contains(err.Error(), "secret-token") {
		t.Fatalf("token without TLS: %v", err)
	}
	if _, err := gradserve.Dial("10.0.0.1:5,gradserve:5"); err == nil || !strings.Contains(err.Error(), "dns:///") {
		t.Fatalf("list of names: %v", err)
	}
	if _, err := gradserve.Dial("127.0.0.1:1", gradserve.WithClientCert("c.pem", "")); err == nil {
		t.Fatal("half a key pair was accepted")
	}
	os.Setenv(gradserve.TokenEnv, "bad token")
	defer os.Unsetenv(gradserve.TokenEnv)
	if _, err := gradserve.Dial("127.0.0.1:1"); err == nil || !strings.Contains(err.Error(), gradserve.TokenEnv) {
		t.Fatalf("bad GRADSERVE_TOKEN: %v", err)
	}
}

func TestInfoPingHealth(t *testing.T) {
	server := startServer(t)
	client := dial(t, server.address)
	ctx := timeout(t, 30*time.Second)
	info, err := client.Info(ctx)
	if err != nil || info.Version == "" || len(info.Ops) == 0 || info.Limits.MaxMessageBytes == 0 {
		t.Fatalf("info: %v, %v", info, err)
	}
	if h, err := client.Health(ctx, ""); err != nil || h != "SERVING" {
		t.Fatalf("health: %q, %v", h, err)
	}
}

// TestAgainstPyTorch: a small MLP with a cross-entropy loss, gradients of its weights versus
// Debian's PyTorch (/usr/bin/python3), the reference of every gradserve test.
func TestAgainstPyTorch(t *testing.T) {
	python := os.Getenv("GRADSERVE_PYTHON")
	if python == "" {
		python = "/usr/bin/python3"
	}
	script := `
import json, torch
torch.manual_seed(0)
x = torch.randn(4, 5, dtype=torch.float64)
w1 = torch.randn(5, 8, dtype=torch.float64, requires_grad=True)
b1 = torch.randn(8, dtype=torch.float64, requires_grad=True)
w2 = torch.randn(8, 3, dtype=torch.float64, requires_grad=True)
target = torch.tensor([0, 2, 1, 2])
h = torch.nn.functional.gelu(x @ w1 + b1)
loss = torch.nn.functional.cross_entropy(h @ w2, target)
grads = torch.autograd.grad(loss, [w1, b1, w2])
print(json.dumps({"x": x.flatten().tolist(), "w1": w1.flatten().tolist(), "b1": b1.tolist(),
  "w2": w2.flatten().tolist(), "loss": loss.item(),
  "grads": [g.flatten().tolist() for g in grads]}))
`
	out, err := exec.Command(python, "-c", script).Output()
	if err != nil {
		t.Skipf("no PyTorch reference (%s with python3-torch): %v", python, err)
	}
	var ref struct {
		X, W1, B1, W2 []float64
		Loss          float64
		Grads         [][]float64
	}
	if err := json.Unmarshal(out, &ref); err != nil {
		t.Fatal(err)
	}
	server := startServer(t)
	client := dial(t, server.address)
	// The MLP up to its logits, and the loss over them.
	mlp := func(g *gradserve.Graph) *gradserve.Graph {
		return g.Leaf("x", g.Must(gradserve.Float64(ref.X, 4, 5))).
			Leaf("w1", g.Must(gradserve.Float64(ref.W1, 5, 8)), gradserve.RequiresGrad()).
			Leaf("b1", g.Must(gradserve.Float64(ref.B1)), gradserve.RequiresGrad()).
			Leaf("w2", g.Must(gradserve.Float64(ref.W2, 8, 3)), gradserve.RequiresGrad()).
			Op("matmul", []string{"x", "w1"}, "xw").
			Op("add", []string{"xw", "b1"}, "pre").
			Op("gelu", []string{"pre"}, "h").
			Op("matmul", []string{"h", "w2"}, "logits")
	}
	crossEntropy := func(g *gradserve.Graph) *gradserve.Graph {
		return g.Leaf("target", g.Must(gradserve.Int64([]int64{0, 2, 1, 2}))).
			Op("cross_entropy", []string{"logits", "target"}, "loss").
			ReturnValues("loss")
	}
	check := func(what string, grads gradserve.CallResult, values map[string]gradserve.Tensor) {
		t.Helper()
		for i, name := range []string{"w1", "b1", "w2"} {
			got, err := grads.Floats(name)
			if err != nil {
				t.Fatal(err)
			}
			assertClose(t, what+": d"+name, got, ref.Grads[i], 1e-10)
		}
		loss, _ := values["loss"].Float64s()
		assertClose(t, what+": loss", loss, []float64{ref.Loss}, 1e-12)
	}

	g := crossEntropy(mlp(gradserve.NewGraph())).
		Backward([]string{"loss"}, gradserve.Inputs("w1", "b1", "w2"))
	result := grad(t, client, g)
	check("one-shot", result.Calls[0], result.Values)

	// A session: the forward pass to the logits, then the loss added by Extend.
	ctx := timeout(t, 30*time.Second)
	s, err := client.Forward(ctx, mlp(gradserve.NewGraph()), "logits")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Release(ctx)
	if shape := s.Values["logits"].Shape(); len(shape) != 2 || shape[0] != 4 || shape[1] != 3 {
		t.Fatalf("logits shape %v, want [4 3]", shape)
	}
	values, err := s.Extend(ctx, crossEntropy(gradserve.NewGraph()))
	if err != nil {
		t.Fatal(err)
	}
	grads, err := s.Backward(ctx, []string{"loss"}, gradserve.Inputs("w1", "b1", "w2"))
	if err != nil {
		t.Fatal(err)
	}
	check("session", grads, values)
}

// tanhForward: the forward pass of tanhGraph up to t = tanh(W x), with no loss.
func tanhForward() *gradserve.Graph {
	g := gradserve.NewGraph()
	return g.Leaf("x", g.Must(gradserve.Float64(xs)), gradserve.RequiresGrad()).
		Leaf("W", g.Must(gradserve.Float64(ws, 2, 3)), gradserve.RequiresGrad()).
		Op("matmul", []string{"W", "x"}, "h").
		Op("tanh", []string{"h"}, "t")
}

func floats(t *testing.T, grads gradserve.CallResult, name string) []float64 {
	t.Helper()
	got, err := grads.Floats(name)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// checkSameGradients: grads has the gradients of x and W that want has.
func checkSameGradients(t *testing.T, what string, grads, want gradserve.CallResult) {
	t.Helper()
	for _, name := range []string{"x", "W"} {
		assertClose(t, what+": d"+name, floats(t, grads, name), floats(t, want, name), 1e-15)
	}
}

// TestSessionBackward: a session's backward calls give the one-shot request's gradients, with
// retain_graph as often as asked, with a seed computed from the forward values, and
// FAILED_PRECONDITION through saved tensors a call without retain_graph freed.
func TestSessionBackward(t *testing.T) {
	server := startServer(t)
	client := dial(t, server.address)
	ctx := timeout(t, 30*time.Second)
	req, err := tanhGraph().Request("")
	if err != nil {
		t.Fatal(err)
	}
	oneShot, err := client.Grad(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	checkTanh(t, oneShot)
	want := oneShot.Calls[0]

	s, err := client.Forward(ctx, tanhGraph(), "t")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Release(ctx)
	if len(s.ID) != 32 || s.NumNodes == 0 {
		t.Fatalf("session id %q, %d nodes", s.ID, s.NumNodes)
	}
	loss, _ := s.Values["loss"].Float64s()
	wantLoss, _ := oneShot.Values["loss"].Float64s()
	assertClose(t, "loss", loss, wantLoss, 1e-15)
	for i := 0; i < 2; i++ {
		grads, err := s.Backward(ctx, []string{"loss"}, gradserve.Inputs("x", "W"), gradserve.RetainGraph())
		if err != nil {
			t.Fatalf("backward %d with retain_graph: %v", i, err)
		}
		checkSameGradients(t, "retain_graph", grads, want)
	}
	// d(sum t^2)/dt = 2 t, a seed known only from the forward values: the same gradients.
	tv, err := s.Values["t"].Float64s()
	if err != nil {
		t.Fatal(err)
	}
	for i := range tv {
		tv[i] *= 2
	}
	seed, _ := gradserve.Float64(tv)
	grads, err := s.Backward(ctx, []string{"t"}, gradserve.Seed("t", seed), gradserve.Inputs("x", "W"))
	if err != nil {
		t.Fatal(err)
	}
	checkSameGradients(t, "seeded from t", grads, want)
	// That call did not retain the graph: its saved tensors are gone.
	_, err = s.Backward(ctx, []string{"loss"}, gradserve.Inputs("x", "W"))
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("backward through a freed graph: %v, want FAILED_PRECONDITION", err)
	}
}

// TestSessionExtendAndRelease: a loss added by Extend from a target rounded from the forward
// values gives the one-shot request's gradients; a bad Extend leaves the session as it was;
// after Release the session is NOT_FOUND.
func TestSessionExtendAndRelease(t *testing.T) {
	server := startServer(t)
	client := dial(t, server.address)
	ctx := timeout(t, 30*time.Second)
	s, err := client.Forward(ctx, tanhForward(), "t")
	if err != nil {
		t.Fatal(err)
	}
	tv, err := s.Values["t"].Float64s()
	if err != nil {
		t.Fatal(err)
	}
	target := make([]float64, len(tv))
	for i, v := range tv {
		target[i] = math.Round(v * 4) // a target picked on the client
	}
	// loss = sum((t - target)^2)
	mse := func(g *gradserve.Graph) *gradserve.Graph {
		return g.Leaf("target", g.Must(gradserve.Float64(target))).
			Op("sub", []string{"t", "target"}, "d").
			Op("mul", []string{"d", "d"}, "sq").
			Op("sum", []string{"sq"}, "loss")
	}

	bad := gradserve.NewGraph().Op("mul", []string{"t", "nowhere"}, "y")
	if _, err := s.Extend(ctx, bad); status.Code(err) != codes.InvalidArgument ||
		!strings.Contains(err.Error(), "nowhere") {
		t.Fatalf("extend with an unknown name: %v, want INVALID_ARGUMENT naming it", err)
	}
	values, err := s.Extend(ctx, mse(gradserve.NewGraph()), "loss", "d")
	if err != nil {
		t.Fatal(err)
	}
	grads, err := s.Backward(ctx, []string{"loss"}, gradserve.Inputs("x", "W"))
	if err != nil {
		t.Fatal(err)
	}

	req, err := mse(tanhForward()).Backward([]string{"loss"}, gradserve.Inputs("x", "W")).
		ReturnValues("loss").Request("")
	if err != nil {
		t.Fatal(err)
	}
	oneShot, err := client.Grad(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	checkSameGradients(t, "extended", grads, oneShot.Calls[0])
	got, _ := values["loss"].Float64s()
	want, _ := oneShot.Values["loss"].Float64s()
	assertClose(t, "loss", got, want, 1e-15)
	if _, ok := values["d"]; !ok {
		t.Fatalf("extend returned %v, without d", values)
	}

	if err := s.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx); err != nil {
		t.Fatalf("a second Release: %v, want nil (nothing sent)", err)
	}
	_, err = s.Backward(ctx, []string{"loss"}, gradserve.Inputs("x", "W"))
	if st := status.Convert(err); st.Code() != codes.NotFound {
		t.Fatalf("backward after release: %v, want NOT_FOUND", err)
	}
	if _, err := s.Extend(ctx, gradserve.NewGraph().Op("neg", []string{"t"}, "n")); status.Code(err) != codes.NotFound {
		t.Fatalf("extend after release: %v, want NOT_FOUND", err)
	}
}
