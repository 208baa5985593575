package gradserve

import (
	"context"
	"errors"
	"sync"

	pb "gradserve.dev/client/go/gradserve/v1"
)

// A Session is a graph held on one server between its forward pass and later backward passes
// (docs/sessions.md), made by Client.Forward: look at the forward values, then ask for
// gradients with seeds known only now, again with RetainGraph, extend the graph with a loss,
// and Release it.
//
//	s, err := client.Forward(ctx, g, "logits")
//	...
//	defer s.Release(ctx)
//	logits, err := s.Values["logits"].Float64s()
//	grads, err := s.Backward(ctx, []string{"logits"}, gradserve.Seed("logits", seed),
//		gradserve.Inputs("W"), gradserve.RetainGraph())
//
// Every call goes over the connection that answered the Forward (the client's session
// connection: pick_first, no retries), so it reaches the replica that holds the graph. Errors
// are the call's gRPC status, as for Grad: NOT_FOUND for a session the server no longer holds
// (released, expired after --session_idle_ttl, another replica's) and UNAVAILABLE once the
// server drained, both meaning: run the forward pass again; FAILED_PRECONDITION for a backward
// pass through saved tensors that a call without RetainGraph freed, as in PyTorch.
//
// Backward and Extend may be called from several goroutines at once; the server runs a
// session's calls one at a time, in arrival order. Release must not overlap them.
type Session struct {
	// ID is the session's id: 32 hex digits.
	ID string
	// Values are the forward values asked for, by name.
	Values map[string]Tensor
	// NumNodes is the number of autograd nodes the forward pass recorded.
	NumNodes int64
	// Response is the ForwardResponse itself (timings, request id).
	Response *pb.ForwardResponse

	stub     pb.GradServiceClient
	released sync.Once
}

// Forward runs g's leaves and ops forward on the server and holds the recorded graph there
// (its backward calls are ignored). The session's Values are g's ReturnValues followed by
// returnValues. Sent unary over the client's session connection (see Dial), never retried:
// the graph must fit in one message (the server's max_message_bytes). Release the session
// when done; a session not released ends after the server's --session_idle_ttl.
func (c *Client) Forward(ctx context.Context, g *Graph, returnValues ...string) (*Session, error) {
	graph, err := g.Proto()
	if err != nil {
		return nil, err
	}
	stub, err := c.sessionStub()
	if err != nil {
		return nil, err
	}
	response, err := stub.Forward(ctx, &pb.ForwardRequest{Graph: graph,
		ReturnValues: append(append([]string(nil), g.returns...), returnValues...)})
	if err != nil {
		return nil, err
	}
	values, err := newValues(response.Values)
	if err != nil {
		return nil, err
	}
	return &Session{ID: response.SessionId, Values: values, NumNodes: response.NumNodes,
		Response: response, stub: stub}, nil
}

// Backward runs one backward call from roots over the held graph (the options as for
// Graph.Backward: Inputs, Seed, RetainGraph, CreateGraph, AccumulateGrad, ...) and returns its
// gradients. Roots and inputs name any value of the session, an extension's included.
func (s *Session) Backward(ctx context.Context, roots []string, opts ...CallOption) (CallResult, error) {
	results, err := s.BackwardCalls(ctx, NewGraph().Backward(roots, opts...))
	if err != nil {
		return CallResult{}, err
	}
	if len(results) != 1 {
		return CallResult{}, errors.New("gradserve: the server answered a backward call with no gradients")
	}
	return results[0], nil
}

// BackwardCalls runs the backward calls of calls (made with Graph.Backward; its leaves and
// ops, if any, are ignored) in order, in one call to the server, and returns their gradients.
func (s *Session) BackwardCalls(ctx context.Context, calls *Graph) ([]CallResult, error) {
	if calls.err != nil {
		return nil, calls.err
	}
	response, err := s.stub.Backward(ctx, &pb.BackwardRequest{SessionId: s.ID, Calls: calls.calls})
	if err != nil {
		return nil, err
	}
	return newCallResults(response.Calls)
}

// Extend runs g's leaves and ops after the session's, as if they had ended the forward graph
// (docs/sessions.md, "Extending a session"): its ops may read any value of the session by name
// and must define new ones, from which later Backward calls may start (a loss chosen after a
// look at the outputs, say). Returns g's ReturnValues and returnValues, new or old, by name.
// An unknown or repeated name is INVALID_ARGUMENT naming it, and the session is left as it
// was.
func (s *Session) Extend(ctx context.Context, g *Graph, returnValues ...string) (map[string]Tensor, error) {
	graph, err := g.Proto()
	if err != nil {
		return nil, err
	}
	response, err := s.stub.Extend(ctx, &pb.ExtendRequest{SessionId: s.ID, Graph: graph,
		ReturnValues: append(append([]string(nil), g.returns...), returnValues...)})
	if err != nil {
		return nil, err
	}
	return newValues(response.Values)
}

// Release ends the session on the server and frees its memory. Only the first call sends
// anything; later ones return nil. NOT_FOUND means the server had already ended it (expired,
// drained), so nothing is left to free; `defer s.Release(ctx)` may ignore the error.
func (s *Session) Release(ctx context.Context) error {
	var err error
	s.released.Do(func() {
		_, err = s.stub.Release(ctx, &pb.ReleaseRequest{SessionId: s.ID})
	})
	return err
}
