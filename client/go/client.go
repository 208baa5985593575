package gradserve

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "gradserve.dev/client/go/gradserve/v1"
)

const (
	// Every gRPC implementation accepts messages this large by default; a larger request is
	// streamed when it is also over the server's message limit (GetServerInfo).
	defaultMessageLimit = 4 << 20
	// Room left in a chunk for the Chunk message's own fields.
	chunkOverhead = 1 << 10
)

// The retry policy of the other clients' service config (docs/deploy.md): up to 4 attempts,
// backoff from 50 ms doubling to 1 s, for UNAVAILABLE (a server gone) and CANCELLED (a
// draining server's GOAWAY).
const (
	maxAttempts    = 4
	initialBackoff = 50 * time.Millisecond
	maxBackoff     = time.Second
)

type options struct {
	tls                       bool
	caFile, certFile, keyFile string
	token, tokenFile          string
	tokenSet                  bool
	dialOptions               []grpc.DialOption
}

// An Option configures Dial.
type Option func(*options)

// WithTLS turns TLS on, checking the server's certificate against the CAs in caFile (PEM), or
// against the system's roots if caFile is "". The gradserve tool's --tls_ca.
func WithTLS(caFile string) Option {
	return func(o *options) { o.tls, o.caFile = true, caFile }
}

// WithClientCert is this client's certificate chain and key (PEM files), for mutual TLS;
// implies TLS. The gradserve tool's --tls_cert and --tls_key.
func WithClientCert(certFile, keyFile string) Option {
	return func(o *options) { o.tls, o.certFile, o.keyFile = true, certFile, keyFile }
}

// WithToken sends "authorization: Bearer TOKEN" with every call; needs TLS. "" sends none,
// and the environment variable GRADSERVE_TOKEN is then not read. Of WithToken and
// WithTokenFile, the last given wins.
func WithToken(token string) Option {
	return func(o *options) { o.token, o.tokenSet, o.tokenFile = token, true, "" }
}

// WithTokenFile sends the token on the first line of path; the gradserve tool's --token_file.
func WithTokenFile(path string) Option {
	return func(o *options) { o.token, o.tokenSet, o.tokenFile = "", false, path }
}

// WithDialOptions adds gRPC dial options (after the client's own).
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(o *options) { o.dialOptions = append(o.dialOptions, opts...) }
}

// A Client is a connection to one gradserve server or several. It is safe for concurrent use;
// Close it when done.
type Client struct {
	target      string
	dialOptions []grpc.DialOption
	conn        *grpc.ClientConn
	stub        pb.GradServiceClient
	health      grpc_health_v1.HealthClient

	sessionMu   sync.Mutex
	sessionConn *grpc.ClientConn // sessions' calls (Forward), dialed on first use
	closed      bool

	limitsOnce sync.Mutex
	limits     *pb.Limits
}

// Dial makes a Client of target: "host:port", a comma-separated list of IP:PORT or
// [IPV6]:PORT, or a gRPC target such as "dns:///NAME:PORT" (a name whose addresses are the
// servers, a Kubernetes headless Service). Calls are dealt to the addresses in turn
// (round_robin) and a call that ends UNAVAILABLE or CANCELLED by a draining server is retried,
// up to 4 attempts. Dial does not wait for a connection: the first call does. Sessions
// (Forward) go over a second connection to target, with pick_first and no retries, opened by
// the first Forward: a session's calls all reach the replica that answered its Forward.
//
// Security (docs/security.md) as the gradserve tool's flags: WithTLS, WithClientCert,
// WithToken, WithTokenFile; by default the token in GRADSERVE_TOKEN, if set. A token without
// TLS, half a key pair or an unreadable file is an error naming the option; no error quotes a
// token.
func Dial(target string, opts ...Option) (*Client, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	token, err := o.resolveToken()
	if err != nil {
		return nil, err
	}
	config, err := o.tlsConfig()
	if err != nil {
		return nil, err
	}
	if token != "" && config == nil {
		return nil, errors.New("gradserve: a token needs TLS (WithTLS): sent in plaintext it is anyone's who sees it")
	}
	dial := []grpc.DialOption{
		grpc.WithDisableServiceConfig(), // the DNS resolver's config does not replace ours
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(math.MaxInt32),
			grpc.MaxCallSendMsgSize(math.MaxInt32)),
	}
	if config != nil {
		dial = append(dial, grpc.WithTransportCredentials(credentials.NewTLS(config)))
	} else {
		dial = append(dial, grpc.WithInsecure())
	}
	if token != "" {
		dial = append(dial, grpc.WithPerRPCCredentials(bearer(token)))
	}
	c := &Client{target: target, dialOptions: append(dial, o.dialOptions...)}
	if c.conn, err = c.dial(ServiceConfig); err != nil {
		return nil, err
	}
	c.stub = pb.NewGradServiceClient(c.conn)
	c.health = grpc_health_v1.NewHealthClient(c.conn)
	return c, nil
}

// dial opens a connection to the client's target with serviceConfig (its load balancing).
func (c *Client) dial(serviceConfig string) (*grpc.ClientConn, error) {
	grpcTarget, builder, err := resolveTarget(c.target)
	if err != nil {
		return nil, err
	}
	dial := []grpc.DialOption{grpc.WithDefaultServiceConfig(serviceConfig)}
	if builder != nil {
		dial = append(dial, grpc.WithResolvers(builder))
	}
	conn, err := grpc.Dial(grpcTarget, append(dial, c.dialOptions...)...)
	if err != nil {
		return nil, fmt.Errorf("gradserve: %s: %w", c.target, err)
	}
	return conn, nil
}

// sessionStub is the stub of the session connection (pick_first, no retries: every call of a
// session reaches the replica that answered its Forward), dialed on first use.
func (c *Client) sessionStub() (pb.GradServiceClient, error) {
	c.sessionMu.Lock()
	defer c.sessionMu.Unlock()
	if c.closed {
		return nil, status.Error(codes.Canceled, "gradserve: the client is closed")
	}
	if c.sessionConn == nil {
		conn, err := c.dial(SessionServiceConfig)
		if err != nil {
			return nil, err
		}
		c.sessionConn = conn
	}
	return pb.NewGradServiceClient(c.sessionConn), nil
}

// Close closes the connections; calls in flight end CANCELLED.
func (c *Client) Close() error {
	c.sessionMu.Lock()
	c.closed = true
	sessionConn := c.sessionConn
	c.sessionMu.Unlock()
	if sessionConn != nil {
		sessionConn.Close()
	}
	return c.conn.Close()
}

// Conn is the underlying gRPC connection, for other services on the same server.
func (c *Client) Conn() *grpc.ClientConn { return c.conn }

// retry runs call up to maxAttempts times while it ends UNAVAILABLE, or CANCELLED while ctx
// is not done (a draining server's GOAWAY), with gRPC's jittered exponential backoff. Safe:
// every one-shot gradserve call is a pure function of its request. Session calls are never
// retried (session.go).
func retry(ctx context.Context, call func() error) error {
	backoff := initialBackoff
	for attempt := 1; ; attempt++ {
		err := call()
		code := status.Code(err)
		if err == nil || attempt == maxAttempts || ctx.Err() != nil ||
			(code != codes.Unavailable && code != codes.Canceled) {
			return err
		}
		timer := time.NewTimer(time.Duration(rand.Int63n(int64(backoff)) + 1))
		select {
		case <-ctx.Done():
			timer.Stop()
			return err
		case <-timer.C:
		}
		if backoff *= 2; backoff > maxBackoff {
			backoff = maxBackoff
		}
	}
}

// A GradOption changes one Grad call.
type GradOption func(*gradOptions)

type gradOptions struct{ stream *bool }

// Streamed sends the request with ComputeGradientsStream (true) or the unary call (false).
// By default the stream is used only when the request is over the server's message limit.
func Streamed(stream bool) GradOption {
	return func(o *gradOptions) { o.stream = &stream }
}

// Grad sends req (from Graph.Request, or a message of your own): the server records the graph,
// runs its backward calls in order and answers with their gradients. ctx carries the deadline
// and cancellation (the server stops the work). A failed call's error is the gRPC status
// (status.FromError, status.Code): INVALID_ARGUMENT, RESOURCE_EXHAUSTED, ... with the server's
// message, which names the node, op and value involved.
func (c *Client) Grad(ctx context.Context, req *pb.GradRequest, opts ...GradOption) (*Result, error) {
	if req == nil {
		return nil, errors.New("gradserve: Grad needs a request")
	}
	var o gradOptions
	for _, opt := range opts {
		opt(&o)
	}
	stream := false
	if o.stream != nil {
		stream = *o.stream
	} else if size := proto.Size(req); size > defaultMessageLimit {
		limits, err := c.Limits(ctx)
		if err != nil {
			return nil, err
		}
		stream = int64(size) > limits.MaxMessageBytes
	}
	var response *pb.GradResponse
	var err error
	if stream {
		response, err = c.gradStreamed(ctx, req)
	} else {
		err = retry(ctx, func() error {
			var e error
			response, e = c.stub.ComputeGradients(ctx, req)
			return e
		})
	}
	if err != nil {
		return nil, err
	}
	return newResult(response)
}

// Limits are the server's limits (GetServerInfo), asked once per client. A token allowed grad
// but not info gets zeros (unknown) instead of PERMISSION_DENIED.
func (c *Client) Limits(ctx context.Context) (*pb.Limits, error) {
	c.limitsOnce.Lock()
	defer c.limitsOnce.Unlock()
	if c.limits == nil {
		info, err := c.Info(ctx)
		switch {
		case err == nil:
			c.limits = info.GetLimits()
		case status.Code(err) == codes.PermissionDenied:
			c.limits = &pb.Limits{}
		default:
			return nil, err
		}
	}
	return c.limits, nil
}

func (c *Client) gradStreamed(ctx context.Context, req *pb.GradRequest) (*pb.GradResponse, error) {
	limits, err := c.Limits(ctx)
	if err != nil {
		return nil, err
	}
	payload, err := proto.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("gradserve: the request cannot be serialized: %w", err)
	}
	size := limits.ChunkBytes
	if size <= 0 {
		size = defaultMessageLimit
	}
	maxMessage := limits.MaxMessageBytes
	if maxMessage <= 0 {
		maxMessage = defaultMessageLimit
	}
	if size > maxMessage-chunkOverhead {
		size = maxMessage - chunkOverhead
	}
	if size < 1 {
		size = 1
	}
	var data []byte
	err = retry(ctx, func() error {
		var e error
		data, e = c.stream(ctx, payload, int(size))
		return e
	})
	if err != nil {
		return nil, err
	}
	response := &pb.GradResponse{}
	if err := proto.Unmarshal(data, response); err != nil {
		return nil, status.Errorf(codes.Internal, "the server's streamed response is malformed: %v", err)
	}
	return response, nil
}

// stream sends payload in chunks of size bytes and joins the chunks of the answer.
func (c *Client) stream(ctx context.Context, payload []byte, size int) ([]byte, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := c.stub.ComputeGradientsStream(ctx)
	if err != nil {
		return nil, err
	}
	sendErr := make(chan error, 1)
	go func() {
		for start := 0; start < len(payload) || start == 0; start += size {
			end := start + size
			if end > len(payload) {
				end = len(payload)
			}
			chunk := &pb.Chunk{Data: payload[start:end]}
			if start == 0 {
				chunk.TotalBytes = int64(len(payload))
			}
			if err := s.Send(chunk); err != nil {
				sendErr <- nil // the receive side reports the status
				return
			}
			if end == len(payload) {
				break
			}
		}
		sendErr <- s.CloseSend()
	}()
	var data []byte
	for {
		chunk, err := s.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		if data == nil && chunk.TotalBytes > 0 && chunk.TotalBytes <= math.MaxInt32 {
			data = make([]byte, 0, chunk.TotalBytes)
		}
		data = append(data, chunk.Data...)
	}
	if err := <-sendErr; err != nil {
		return nil, err
	}
	return data, nil
}

// Info is the server's ServerInfo: version, limits, devices, ops and counters.
func (c *Client) Info(ctx context.Context) (*pb.ServerInfo, error) {
	var info *pb.ServerInfo
	err := retry(ctx, func() error {
		var e error
		info, e = c.stub.GetServerInfo(ctx, &pb.ServerInfoRequest{})
		return e
	})
	return info, err
}

// Ping echoes payload through the server.
func (c *Client) Ping(ctx context.Context, payload []byte) ([]byte, error) {
	var response *pb.PingResponse
	err := retry(ctx, func() error {
		var e error
		response, e = c.stub.Ping(ctx, &pb.PingRequest{Payload: payload})
		return e
	})
	return response.GetPayload(), err
}

// Health is the grpc.health.v1 status of service ("" for the whole server): "SERVING",
// "NOT_SERVING", ...
func (c *Client) Health(ctx context.Context, service string) (string, error) {
	var response *grpc_health_v1.HealthCheckResponse
	err := retry(ctx, func() error {
		var e error
		response, e = c.health.Check(ctx, &grpc_health_v1.HealthCheckRequest{Service: service})
		return e
	})
	return response.GetStatus().String(), err
}

// A CallResult is the gradients of one backward call, by input name.
type CallResult struct {
	// Names are the inputs in the order the server sent them.
	Names []string
	// Gradients by input name; nil where the input was not connected to the roots and
	// MaterializeGrads was off.
	Gradients map[string]*Tensor
	// Connected says whether the roots reach each input.
	Connected map[string]bool
}

// Floats is the gradient for name as float64s, whatever its float dtype; an error if there
// is none.
func (r CallResult) Floats(name string) ([]float64, error) {
	t := r.Gradients[name]
	if t == nil {
		if _, ok := r.Connected[name]; ok {
			return nil, fmt.Errorf("gradserve: %q is not connected to the roots", name)
		}
		return nil, fmt.Errorf("gradserve: no gradient for %q in this call", name)
	}
	return t.Floats()
}

// A Result is a GradResponse with its tensors decoded.
type Result struct {
	// Calls has one CallResult per backward call, in order.
	Calls []CallResult
	// Values are the requested forward values by name.
	Values map[string]Tensor
	// NumNodes is the number of autograd nodes the forward pass recorded.
	NumNodes int64
	// Response is the message itself (timings, request id).
	Response *pb.GradResponse
}

func newResult(m *pb.GradResponse) (*Result, error) {
	calls, err := newCallResults(m.Calls)
	if err != nil {
		return nil, err
	}
	values, err := newValues(m.Values)
	if err != nil {
		return nil, err
	}
	return &Result{Calls: calls, Values: values, NumNodes: m.NumNodes, Response: m}, nil
}

// newCallResults decodes the gradients of backward calls (a GradResponse's or a
// BackwardResponse's).
func newCallResults(calls []*pb.CallResult) ([]CallResult, error) {
	var results []CallResult
	for _, call := range calls {
		cr := CallResult{Gradients: map[string]*Tensor{}, Connected: map[string]bool{}}
		for _, g := range call.Gradients {
			cr.Names = append(cr.Names, g.Name)
			cr.Connected[g.Name] = g.Connected
			cr.Gradients[g.Name] = nil
			if g.Value != nil {
				t, err := FromProto(g.Value)
				if err != nil {
					return nil, status.Errorf(codes.Internal, "gradient %q in the response: %v", g.Name, err)
				}
				cr.Gradients[g.Name] = &t
			}
		}
		results = append(results, cr)
	}
	return results, nil
}

// newValues decodes forward values (a GradResponse's, ForwardResponse's or ExtendResponse's).
func newValues(values []*pb.NamedTensor) (map[string]Tensor, error) {
	decoded := map[string]Tensor{}
	for _, v := range values {
		t, err := FromProto(v.Value)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "value %q in the response: %v", v.Name, err)
		}
		decoded[v.Name] = t
	}
	return decoded, nil
}
