package gradserve

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync/atomic"

	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
)

// ServiceConfig is the gRPC service config of every channel: calls dealt to the target's
// addresses in turn (round_robin). It is the loadBalancingConfig of the other clients' config
// (docs/deploy.md); their retryPolicy is applied by this package itself (client.go, retry),
// since grpc-go before 1.40 retries only with GRPC_GO_RETRY=on.
const ServiceConfig = `{"loadBalancingConfig": [{"round_robin": {}}]}`

// SessionServiceConfig is the service config of the sessions' channel (docs/sessions.md): one
// connection, to the first address that answers (pick_first), so that a session's Backward,
// Extend and Release calls reach the replica that holds its graph; those calls are not retried.
const SessionServiceConfig = `{"loadBalancingConfig": [{"pick_first": {}}]}`

// isIPPort: "A.B.C.D:PORT" or "[V6]:PORT".
func isIPPort(entry string) bool {
	host, port, err := net.SplitHostPort(entry)
	if err != nil || port == "" || len(port) > 5 {
		return false
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return false
	}
	return net.ParseIP(host) != nil
}

var listSchemes int64

// resolveTarget is the gRPC target for target, and a resolver for it if it is a list: a
// comma-separated list of IP:PORT or [IPV6]:PORT becomes a manual resolver with those
// addresses (grpc-go has no "ipv4:" lists); a single address or a gRPC target URI
// ("dns:///host:port") stays as it is. The error names the entry that is not an IP address.
func resolveTarget(target string) (string, resolver.Builder, error) {
	target = strings.TrimSpace(target)
	if target == "" {
		return "", nil, fmt.Errorf("gradserve: the target is empty")
	}
	if !strings.Contains(target, ",") || strings.Contains(target, "://") {
		return target, nil, nil
	}
	var addresses []resolver.Address
	for _, entry := range strings.Split(target, ",") {
		entry = strings.TrimSpace(entry)
		if !isIPPort(entry) {
			return "", nil, fmt.Errorf("gradserve: target list entry %q is not IP:PORT or [IPV6]:PORT; "+
				"a list holds IP addresses (for a name whose addresses are the servers, use dns:///NAME:PORT)", entry)
		}
		addresses = append(addresses, resolver.Address{Addr: entry})
	}
	scheme := fmt.Sprintf("gradserve-list-%d", atomic.AddInt64(&listSchemes, 1))
	r := manual.NewBuilderWithScheme(scheme)
	r.InitialState(resolver.State{Addresses: addresses})
	return scheme + ":///list", r, nil
}
