package gradserve

import (
	"errors"
	"fmt"

	"google.golang.org/protobuf/proto"

	pb "gradserve.dev/client/go/gradserve/v1"
)

// A Graph builds a gradserve graph in forward order (graph.proto), and for a top-level graph
// the GradRequest around it: leaves, ops, backward calls and the values to return.
//
//	g := gradserve.NewGraph()
//	g.Leaf("x", x, gradserve.RequiresGrad())
//	g.Op("mul", []string{"x", "x"}, "y")
//	g.Op("sum", []string{"y"}, "loss")
//	g.Backward([]string{"loss"}, gradserve.Inputs("x"))
//	req, err := g.Request("")
//
// Methods return the Graph, so calls chain. The first mistake (an empty or repeated value
// name, an attribute of no known kind, a bad tensor passed in) is kept, and later calls do
// nothing; Request, Proto and Err return it. The server checks everything else. A Graph is not
// safe for concurrent use; build it in one goroutine, then send its request from any.
type Graph struct {
	graph   *pb.Graph
	names   map[string]bool
	calls   []*pb.BackwardCall
	returns []string
	err     error
}

// NewGraph starts a top-level graph.
func NewGraph() *Graph {
	return &Graph{graph: &pb.Graph{}, names: map[string]bool{}}
}

// NewBody starts a checkpoint's sub-graph whose formal inputs are bound, in order, to the
// checkpoint op's inputs. Set its outputs with Outputs and pass it to Op with Body.
func NewBody(inputs ...string) *Graph {
	g := NewGraph()
	for _, name := range inputs {
		g.define(name)
	}
	g.graph.Inputs = append([]string(nil), inputs...)
	return g
}

// Err is the first mistake made building the graph, or nil.
func (g *Graph) Err() error { return g.err }

func (g *Graph) fail(err error) {
	if g.err == nil {
		g.err = err
	}
}

func (g *Graph) define(name string) {
	if name == "" {
		g.fail(errors.New("gradserve: value names must not be empty"))
	} else if g.names[name] {
		g.fail(fmt.Errorf("gradserve: value %q is already defined in this graph", name))
	}
	g.names[name] = true
}

// A LeafOption changes a leaf.
type LeafOption func(*pb.Leaf)

// RequiresGrad makes a leaf one that gradients can be taken for (float32 and float64 only).
func RequiresGrad() LeafOption { return func(l *pb.Leaf) { l.RequiresGrad = true } }

// OnDevice places a leaf on a server device ("cpu", "cuda:0"; GetServerInfo lists them).
func OnDevice(device string) LeafOption {
	return func(l *pb.Leaf) {
		l.Value = cloneTensor(l.Value)
		l.Value.Device = device
	}
}

func cloneTensor(t *pb.Tensor) *pb.Tensor { return proto.Clone(t).(*pb.Tensor) }

// Leaf adds a leaf tensor named name.
func (g *Graph) Leaf(name string, t Tensor, opts ...LeafOption) *Graph {
	if g.err != nil {
		return g
	}
	if t.msg == nil {
		g.fail(fmt.Errorf("gradserve: leaf %q has no tensor", name))
		return g
	}
	g.define(name)
	leaf := &pb.Leaf{Name: name, Value: t.msg}
	for _, o := range opts {
		o(leaf)
	}
	g.graph.Leaves = append(g.graph.Leaves, leaf)
	return g
}

// Must is t, or a failure of the graph if err is not nil, so that tensors can be made inline:
//
//	g.Leaf("x", g.Must(gradserve.Float64(xs, 2, 3)), gradserve.RequiresGrad())
func (g *Graph) Must(t Tensor, err error) Tensor {
	if err != nil {
		g.fail(err)
	}
	return t
}

// An OpOption sets an op's attributes, grad mode or body.
type OpOption func(*Graph, *pb.Op)

// Attr sets the op's attribute name. Go values map to AttrValue by kind: bool -> b, any
// integer -> i, float32/float64 -> f, string -> s, []int/[]int64 -> ints, []float64 -> floats,
// []string -> strings; an *AttrValue message is used as is. Anything else fails the graph.
func Attr(name string, value interface{}) OpOption {
	return func(g *Graph, op *pb.Op) {
		v, err := AttrValue(value)
		if err != nil {
			g.fail(fmt.Errorf("gradserve: op %q attribute %q: %w", op.Op, name, err))
			return
		}
		if op.Attrs == nil {
			op.Attrs = map[string]*pb.AttrValue{}
		}
		op.Attrs[name] = v
	}
}

// NoGrad runs the op with grad mode off: its outputs have no history.
func NoGrad() OpOption { return func(_ *Graph, op *pb.Op) { op.NoGrad = true } }

// Body is a checkpoint op's sub-graph (made with NewBody).
func Body(body *Graph) OpOption {
	return func(g *Graph, op *pb.Op) {
		if body.err != nil {
			g.fail(body.err)
			return
		}
		op.Body = body.graph
	}
}

// AttrValue is the AttrValue message for a Go value; see Attr for the mapping.
func AttrValue(value interface{}) (*pb.AttrValue, error) {
	switch v := value.(type) {
	case *pb.AttrValue:
		return v, nil
	case bool:
		return &pb.AttrValue{Value: &pb.AttrValue_B{B: v}}, nil
	case int:
		return &pb.AttrValue{Value: &pb.AttrValue_I{I: int64(v)}}, nil
	case int32:
		return &pb.AttrValue{Value: &pb.AttrValue_I{I: int64(v)}}, nil
	case int64:
		return &pb.AttrValue{Value: &pb.AttrValue_I{I: v}}, nil
	case float32:
		return &pb.AttrValue{Value: &pb.AttrValue_F{F: float64(v)}}, nil
	case float64:
		return &pb.AttrValue{Value: &pb.AttrValue_F{F: v}}, nil
	case string:
		return &pb.AttrValue{Value: &pb.AttrValue_S{S: v}}, nil
	case []int:
		ints := make([]int64, len(v))
		for i, x := range v {
			ints[i] = int64(x)
		}
		return &pb.AttrValue{Value: &pb.AttrValue_Ints{Ints: &pb.IntList{Values: ints}}}, nil
	case []int64:
		return &pb.AttrValue{Value: &pb.AttrValue_Ints{Ints: &pb.IntList{Values: append([]int64(nil), v...)}}}, nil
	case []float64:
		return &pb.AttrValue{Value: &pb.AttrValue_Floats{Floats: &pb.FloatList{Values: append([]float64(nil), v...)}}}, nil
	case []string:
		return &pb.AttrValue{Value: &pb.AttrValue_Strings{Strings: &pb.StringList{Values: append([]string(nil), v...)}}}, nil
	}
	return nil, fmt.Errorf("value %v (%T) is not a bool, integer, float, string or a slice of int, int64, float64 or string", value, value)
}

// Op adds an op with one output, out: op is its name ("mul", "matmul", "grad", ...), inputs
// the values it reads in its argument order (PyTorch's).
func (g *Graph) Op(op string, inputs []string, out string, opts ...OpOption) *Graph {
	return g.OpOutputs(op, inputs, []string{out}, opts...)
}

// OpOutputs adds an op with any number of outputs (none for "hook", one per wrt for "grad").
func (g *Graph) OpOutputs(op string, inputs []string, outs []string, opts ...OpOption) *Graph {
	if g.err != nil {
		return g
	}
	for _, name := range outs {
		g.define(name)
	}
	m := &pb.Op{Op: op, Inputs: append([]string(nil), inputs...), Outputs: append([]string(nil), outs...)}
	for _, o := range opts {
		o(g, m)
	}
	g.graph.Ops = append(g.graph.Ops, m)
	return g
}

// Outputs sets a checkpoint body's outputs, bound in order to the checkpoint op's outputs.
func (g *Graph) Outputs(names ...string) *Graph {
	g.graph.Outputs = append([]string(nil), names...)
	return g
}

// A CallOption sets a field of a BackwardCall.
type CallOption func(*Graph, *pb.BackwardCall)

// Inputs are the values to return gradients for.
func Inputs(names ...string) CallOption {
	return func(_ *Graph, c *pb.BackwardCall) { c.Inputs = append(c.Inputs, names...) }
}

// Seed is the seed gradient (grad_output) of root; a root without one must have one element.
func Seed(root string, t Tensor) CallOption {
	return func(g *Graph, c *pb.BackwardCall) {
		if t.msg == nil {
			g.fail(fmt.Errorf("gradserve: seed of %q has no tensor", root))
			return
		}
		if c.Seeds == nil {
			c.Seeds = map[string]*pb.Tensor{}
		}
		c.Seeds[root] = t.msg
	}
}

// AccumulateGrad gives the call backward() semantics: gradients sum into .grad across calls.
func AccumulateGrad() CallOption {
	return func(_ *Graph, c *pb.BackwardCall) { c.AccumulateGrad = true }
}

// RetainGraph keeps saved tensors so that a later call can go through the same nodes.
func RetainGraph() CallOption { return func(_ *Graph, c *pb.BackwardCall) { c.RetainGraph = true } }

// CreateGraph records the backward pass, so that later calls can differentiate the gradients.
func CreateGraph() CallOption { return func(_ *Graph, c *pb.BackwardCall) { c.CreateGraph = true } }

// AllowUnused makes an input that the roots do not reach no error.
func AllowUnused() CallOption { return func(_ *Graph, c *pb.BackwardCall) { c.AllowUnused = true } }

// MaterializeGrads gives an input that the roots do not reach a zero gradient.
func MaterializeGrads() CallOption {
	return func(_ *Graph, c *pb.BackwardCall) { c.MaterializeGrads = true }
}

// DetectAnomaly fails the call at the first node whose backward produces NaN, naming it.
func DetectAnomaly() CallOption {
	return func(_ *Graph, c *pb.BackwardCall) { c.DetectAnomaly = true }
}

// Backward appends a backward call from roots (grad() semantics unless AccumulateGrad).
func (g *Graph) Backward(roots []string, opts ...CallOption) *Graph {
	if g.err != nil {
		return g
	}
	c := &pb.BackwardCall{Roots: append([]string(nil), roots...)}
	for _, o := range opts {
		o(g, c)
	}
	g.calls = append(g.calls, c)
	return g
}

// ReturnValues asks for these forward values in the response.
func (g *Graph) ReturnValues(names ...string) *Graph {
	g.returns = append(g.returns, names...)
	return g
}

// Proto is the Graph message built so far (shared: do not change it), or the first mistake.
func (g *Graph) Proto() (*pb.Graph, error) {
	if g.err != nil {
		return nil, g.err
	}
	return g.graph, nil
}

// Request is the GradRequest of this graph, its backward calls and return values, or the
// first mistake made building it. requestID is echoed by the server and logged; may be "".
func (g *Graph) Request(requestID string) (*pb.GradRequest, error) {
	if g.err != nil {
		return nil, g.err
	}
	return &pb.GradRequest{RequestId: requestID, Graph: g.graph, Calls: g.calls, ReturnValues: g.returns}, nil
}
