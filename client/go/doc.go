// Package gradserve is the Go client of gradserve, a gRPC service that computes autograd
// gradients remotely: build a graph of PyTorch ops over tensors, send it, get gradients back.
//
//	g := gradserve.NewGraph()
//	g.Leaf("x", g.Must(gradserve.Float64([]float64{1, 2, 3})), gradserve.RequiresGrad())
//	g.Op("mul", []string{"x", "x"}, "y")
//	g.Op("sum", []string{"y"}, "loss")
//	g.Backward([]string{"loss"}, gradserve.Inputs("x"))
//	req, err := g.Request("")
//	...
//	client, err := gradserve.Dial("127.0.0.1:50051")
//	...
//	defer client.Close()
//	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
//	defer cancel()
//	result, err := client.Grad(ctx, req)
//	...
//	dx, err := result.Calls[0].Floats("x") // [2 4 6]
//
// Errors from the server are gRPC statuses: status.Code(err) is INVALID_ARGUMENT,
// RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED, ... and status.Convert(err).Message() the server's
// message, naming the node, op and value involved. Mistakes caught before sending (a bad
// shape, a repeated value name, a token without TLS) are plain errors.
//
// Graph sessions (Client.Forward, Session) hold a recorded graph on the server for backward
// calls decided later, over one connection to the server that answered the Forward; see
// Session and README.md.
//
// The generated messages (package gradservev1, import path gradserve.dev/client/go/gradserve/v1)
// are made from proto/ by generate.sh, which `go generate` runs; see README.md for building
// offline with Debian's Go packages.
package gradserve

//go:generate sh generate.sh
