package gradserve_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// serverProcess is a real gradserve-server on 127.0.0.1, port 0 (the kernel picks a free one,
// which the server logs). The binary comes from GRADSERVE_SERVER, else the release build.
type serverProcess struct {
	cmd     *exec.Cmd
	address string
	mu      sync.Mutex
	log     []string
	done    chan struct{}
}

var listening = regexp.MustCompile(`listening on 127\.0\.0\.1:(\d+)`)

func serverBinary(t testing.TB) string {
	path := os.Getenv("GRADSERVE_SERVER")
	if path == "" {
		path, _ = filepath.Abs("../../build/release/server/gradserve-server")
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("gradserve-server not found at %s; build it and set GRADSERVE_SERVER", path)
	}
	return path
}

func startServer(t testing.TB, flags ...string) *serverProcess {
	t.Helper()
	args := append([]string{"--listen=127.0.0.1:0", "--grace_period=1s"}, flags...)
	s := &serverProcess{cmd: exec.Command(serverBinary(t), args...), done: make(chan struct{})}
	stderr, err := s.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	port := make(chan string, 1)
	go func() {
		defer close(s.done)
		scanner := bufio.NewScanner(stderr)
		for scanner.Scan() {
			line := scanner.Text()
			s.mu.Lock()
			s.log = append(s.log, line)
			s.mu.Unlock()
			if m := listening.FindStringSubmatch(line); m != nil {
				select {
				case port <- m[1]:
				default:
				}
			}
		}
	}()
	select {
	case p := <-port:
		s.address = "127.0.0.1:" + p
	case <-s.done:
		s.cmd.Wait()
		t.Fatalf("gradserve-server exited at start:\n%s", s.Log())
	case <-time.After(30 * time.Second):
		s.Stop()
		t.Fatalf("gradserve-server did not report its port in 30 s:\n%s", s.Log())
	}
	t.Cleanup(s.Stop)
	return s
}

// Log is everything the server wrote to stderr so far.
func (s *serverProcess) Log() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.log, "\n")
}

// Stop sends SIGTERM, then SIGKILL after 10 s.
func (s *serverProcess) Stop() {
	if s.cmd.ProcessState != nil {
		return
	}
	s.cmd.Process.Signal(os.Interrupt)
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		s.cmd.Process.Kill()
	}
	s.cmd.Wait()
}

func kill(s *serverProcess) {
	s.cmd.Process.Kill()
	<-s.done
	s.cmd.Wait()
}

func timeout(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

var _ = fmt.Sprintf
