// Command go is the gradserve Go client's example: it sends loss = sum(tanh(W x)^2) to a
// server and prints the loss and its gradients with respect to x and W.
//
//	go run . [-tls_ca=ca.pem -token_file=trainer-1.token] 127.0.0.1:50051
//
// The target may also be a list of IP addresses or dns:///NAME:PORT (client/go/README.md).
// Exits 1 with the gRPC status on a failed call, 2 on a bad flag.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"google.golang.org/grpc/status"

	gradserve "gradserve.dev/client/go"
)

func main() {
	caFile := flag.String("tls_ca", "", "PEM file of the CAs the server's certificate must chain to; turns TLS on")
	certFile := flag.String("tls_cert", "", "this client's certificate chain (PEM), for mutual TLS")
	keyFile := flag.String("tls_key", "", "this client's key (PEM), for mutual TLS")
	tokenFile := flag.String("token_file", "", "file whose first line is the bearer token (default: $GRADSERVE_TOKEN)")
	deadline := flag.Duration("timeout", 30*time.Second, "deadline of the call")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: %s [flags] TARGET\n", os.Args[0])
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}

	var opts []gradserve.Option
	if *caFile != "" {
		opts = append(opts, gradserve.WithTLS(*caFile))
	}
	if *certFile != "" || *keyFile != "" {
		opts = append(opts, gradserve.WithClientCert(*certFile, *keyFile))
	}
	if *tokenFile != "" {
		opts = append(opts, gradserve.WithTokenFile(*tokenFile))
	}
	client, err := gradserve.Dial(flag.Arg(0), opts...)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	defer client.Close()

	// loss = sum(tanh(W x)^2)
	g := gradserve.NewGraph()
	g.Leaf("x", g.Must(gradserve.Float64([]float64{0.5, -1.0, 2.0})), gradserve.RequiresGrad()).
		Leaf("W", g.Must(gradserve.Float64([]float64{0.1, 0.2, -0.3, 0.4, -0.5, 0.6}, 2, 3)),
			gradserve.RequiresGrad()).
		Op("matmul", []string{"W", "x"}, "h").
		Op("tanh", []string{"h"}, "t").
		Op("mul", []string{"t", "t"}, "sq").
		Op("sum", []string{"sq"}, "loss").
		Backward([]string{"loss"}, gradserve.Inputs("x", "W")).
		ReturnValues("loss")
	req, err := g.Request("example-go")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}

	ctx, cancel := context.WithTimeout(context.Background(), *deadline)
	defer cancel()
	result, err := client.Grad(ctx, req)
	if err != nil {
		s := status.Convert(err)
		fmt.Fprintf(os.Stderr, "gradserve: %v: %s\n", s.Code(), s.Message())
		os.Exit(1)
	}
	loss, _ := result.Values["loss"].Float64s()
	dx, _ := result.Calls[0].Floats("x")
	dw, _ := result.Calls[0].Floats("W")
	fmt.Printf("loss %.10g\n", loss[0])
	fmt.Printf("dloss/dx %.10g\n", dx)
	fmt.Printf("dloss/dW %.10g (shape %v)\n", dw, result.Calls[0].Gradients["W"].Shape())
}
