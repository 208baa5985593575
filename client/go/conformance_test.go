package gradserve_test

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	gradserve "gradserve.dev/client/go"
	pb "gradserve.dev/client/go/gradserve/v1"
)

type conformanceTensor struct {
	Shape  []int64   `json:"shape"`
	Values []float64 `json:"values"`
}

type conformanceCase struct {
	Description string          `json:"description"`
	Request     json.RawMessage `json:"request"`
	Expect      struct {
		Code            string                          `json:"code"`
		MessageContains []string                        `json:"message_contains"`
		Tolerance       float64                         `json:"tolerance"`
		Calls           []map[string]*conformanceTensor `json:"calls"`
		Values          map[string]*conformanceTensor   `json:"values"`
	} `json:"expect"`
}

// TestConformance runs the shared cases of tests/conformance (the Python and Java clients run
// the same files): each request from protobuf JSON, its gradients and values or its status.
func TestConformance(t *testing.T) {
	dir, _ := filepath.Abs("../../tests/conformance")
	paths, _ := filepath.Glob(filepath.Join(dir, "*.json"))
	if len(paths) < 9 {
		t.Fatalf("%d conformance cases in %s, want at least 9", len(paths), dir)
	}
	server := startServer(t)
	client := dial(t, server.address)
	for _, path := range paths {
		path := path
		t.Run(strings.TrimSuffix(filepath.Base(path), ".json"), func(t *testing.T) {
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			var c conformanceCase
			if err := json.Unmarshal(data, &c); err != nil {
				t.Fatal(err)
			}
			req := &pb.GradRequest{}
			if err := protojson.Unmarshal(c.Request, req); err != nil {
				t.Fatal(err)
			}
			result, err := client.Grad(timeout(t, 30*time.Second), req)
			if c.Expect.Code != "OK" {
				s := status.Convert(err)
				if s.Code().String() != toCamel(c.Expect.Code) {
					t.Fatalf("status %v (%v), want %s", s.Code(), err, c.Expect.Code)
				}
				for _, part := range c.Expect.MessageContains {
					if !strings.Contains(s.Message(), part) {
						t.Errorf("message %q lacks %q", s.Message(), part)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(result.Calls) != len(c.Expect.Calls) {
				t.Fatalf("%d calls, want %d", len(result.Calls), len(c.Expect.Calls))
			}
			for i, call := range c.Expect.Calls {
				if len(result.Calls[i].Gradients) != len(call) {
					t.Errorf("call %d: gradients for %v, want %d", i, result.Calls[i].Names, len(call))
				}
				for name, want := range call {
					got, present := result.Calls[i].Gradients[name]
					if !present {
						t.Fatalf("call %d: no gradient entry for %q", i, name)
					}
					if want == nil {
						if got != nil {
							t.Errorf("call %d %s: got %v, want none (not connected)", i, name, got)
						}
						continue
					}
					checkConformanceTensor(t, name, got, want, c.Expect.Tolerance)
				}
			}
			for name, want := range c.Expect.Values {
				v := result.Values[name]
				checkConformanceTensor(t, name, &v, want, c.Expect.Tolerance)
			}
		})
	}
}

// toCamel: "INVALID_ARGUMENT" -> "InvalidArgument", as codes.Code's String.
func toCamel(code string) string {
	var b strings.Builder
	for _, part := range strings.Split(strings.ToLower(code), "_") {
		if part != "" {
			b.WriteString(strings.ToUpper(part[:1]) + part[1:])
		}
	}
	return b.String()
}

func checkConformanceTensor(t *testing.T, name string, got *gradserve.Tensor, want *conformanceTensor, tol float64) {
	t.Helper()
	if got == nil {
		t.Fatalf("%s: no tensor", name)
	}
	shape := got.Shape()
	if len(shape) != len(want.Shape) {
		t.Fatalf("%s: shape %v, want %v", name, shape, want.Shape)
	}
	for i := range shape {
		if shape[i] != want.Shape[i] {
			t.Fatalf("%s: shape %v, want %v", name, shape, want.Shape)
		}
	}
	values, err := got.Floats()
	if err != nil {
		t.Fatal(err)
	}
	for i := range values {
		if math.Abs(values[i]-want.Values[i]) > tol+tol*math.Abs(want.Values[i]) {
			t.Fatalf("%s[%d] = %v, want %v", name, i, values[i], want.Values[i])
		}
	}
}
