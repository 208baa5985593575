package gradserve_test

import (
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	gradserve "gradserve.dev/client/go"
)

func requestsTotal(t *testing.T, address string) int64 {
	t.Helper()
	c := dial(t, address)
	info, err := c.Info(timeout(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	return info.Counters.RequestsTotal
}

// TestReplicas: a list of three servers; round_robin deals the calls to all of them, and calls
// keep succeeding while one is killed.
func TestReplicas(t *testing.T) {
	servers := []*serverProcess{startServer(t), startServer(t), startServer(t)}
	var addresses []string
	for _, s := range servers {
		addresses = append(addresses, s.address)
	}
	client := dial(t, strings.Join(addresses, ","))
	req, err := tanhGraph().Request("")
	if err != nil {
		t.Fatal(err)
	}
	// Wait until the channel has a connection to each server, so the calls spread evenly.
	if _, err := client.Grad(timeout(t, 30*time.Second), req); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	const calls = 90
	for i := 0; i < calls; i++ {
		if _, err := client.Grad(timeout(t, 30*time.Second), req); err != nil {
			t.Fatal(err)
		}
	}
	for i, a := range addresses {
		if n := requestsTotal(t, a); n < calls/6 {
			t.Errorf("server %d got %d of %d calls", i, n, calls+1)
		}
	}

	// Kill one while 4 goroutines call: no call fails.
	var failed, done int64
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := client.Grad(timeout(t, 30*time.Second), req); err != nil {
					if atomic.AddInt64(&failed, 1) == 1 {
						t.Errorf("a call failed while a server was killed: %v", err)
					}
				}
				atomic.AddInt64(&done, 1)
			}
		}()
	}
	time.Sleep(300 * time.Millisecond)
	kill(servers[1])
	time.Sleep(700 * time.Millisecond)
	close(stop)
	wg.Wait()
	if done < 20 || failed > 0 {
		t.Fatalf("%d calls, %d failed", done, failed)
	}
}

// TestSessionStaysOnItsReplica: with two servers listed, a session's calls all reach the
// server that answered its Forward (the other would answer NOT_FOUND), which alone holds it.
func TestSessionStaysOnItsReplica(t *testing.T) {
	servers := []*serverProcess{startServer(t), startServer(t)}
	client := dial(t, servers[0].address+","+servers[1].address)
	ctx := timeout(t, 60*time.Second)
	held := func() (counts []int64) {
		for _, server := range servers {
			info, err := dial(t, server.address).Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			counts = append(counts, info.Counters.Sessions)
		}
		return counts
	}
	s, err := client.Forward(ctx, tanhGraph())
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 10; i++ {
		if _, err := s.Backward(ctx, []string{"loss"}, gradserve.Inputs("x", "W"), gradserve.RetainGraph()); err != nil {
			t.Fatalf("backward %d: %v", i, err)
		}
	}
	if counts := held(); counts[0]+counts[1] != 1 {
		t.Fatalf("sessions held per server: %v, want one in all", counts)
	}
	if err := s.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if counts := held(); counts[0]+counts[1] != 0 {
		t.Fatalf("sessions held per server after Release: %v, want none", counts)
	}
}
