package inboxtest

import (
	"bytes"
	"context"
	"net"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/idem-go/idem/internal/testenv"
)

// Server is a private server process of one test (redis-server,
// nats-server), on a port of its own, which the test may kill and start
// again on the same port and data directory, as an outage would. It is
// killed when the test ends.
type Server struct {
	t     testing.TB
	name  string
	bin   string
	args  []string
	addr  string
	ready func(addr string) error

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	out    *lockedBuffer
}

// Addr returns the server's host:port.
func (s *Server) Addr() string { return s.addr }

// StartRedis starts a private redis-server that keeps its data across
// kills (an append-only file written on every command), so that a kill
// and a start make an outage, not a loss of the records.
func StartRedis(t testing.TB) *Server {
	t.Helper()
	dir := t.TempDir()
	return startServer(t, "redis-server", "redis-server", func(port string) []string {
		return []string{"--port", port, "--bind", "127.0.0.1", "--dir", dir, "--save", "",
			"--appendonly", "yes", "--appendfsync", "always"}
	}, func(addr string) error {
		c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		return c.Ping(ctx).Err()
	})
}

// StartNATS starts a private nats-server with JetStream, its store in a
// directory of the test's.
func StartNATS(t testing.TB) *Server {
	t.Helper()
	dir := t.TempDir()
	bin := "/usr/sbin/nats-server"
	if p, err := exec.LookPath("nats-server"); err == nil {
		bin = p
	}
	return startServer(t, "nats-server", bin, func(port string) []string {
		return []string{"-a", "127.0.0.1", "-p", port, "-js", "-sd", dir}
	}, func(addr string) error {
		nc, err := nats.Connect("nats://"+addr, nats.Timeout(time.Second))
		if err != nil {
			return err
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err = js.AccountInfo(ctx)
		return err
	})
}

// URL returns the nats:// URL of a nats-server.
func (s *Server) URL() string { return "nats://" + s.addr }

func startServer(t testing.TB, name, bin string, args func(port string) []string, ready func(addr string) error) *Server {
	t.Helper()
	path, err := exec.LookPath(bin)
	if err != nil {
		testenv.Unavailable(t, name+" binary", err)
	}
	for try := 0; ; try++ {
		port := freePort(t)
		s := &Server{t: t, name: name, bin: path, args: args(port), addr: "127.0.0.1:" + port, ready: ready}
		t.Cleanup(s.Kill)
		if s.start() {
			return s
		}
		s.Kill()
		if try == 4 {
			t.Fatalf("%s on %s never answered:\n%s", name, s.addr, s.out)
		}
	}
}

// Kill stops the server with SIGKILL and waits for it to exit.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.exited
	s.cmd = nil
}

// Start starts the server again, on the same port and data, after Kill,
// and waits until it answers.
func (s *Server) Start() {
	s.t.Helper()
	for range 50 {
		if s.start() {
			return
		}
		// The port may still be held by the killed process's sockets.
		s.Kill()
		time.Sleep(100 * time.Millisecond)
	}
	s.t.Fatalf("%s on %s did not start again:\n%s", s.name, s.addr, s.out)
}

// start runs the process and reports whether it answered within 10s.
func (s *Server) start() bool {
	s.mu.Lock()
	s.out = &lockedBuffer{}
	s.cmd = exec.Command(s.bin, s.args...)
	s.cmd.Stdout, s.cmd.Stderr = s.out, s.out
	if err := s.cmd.Start(); err != nil {
		s.mu.Unlock()
		s.t.Fatalf("start %s: %v", s.name, err)
	}
	exited := make(chan struct{})
	s.exited = exited
	cmd := s.cmd
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	s.mu.Unlock()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		select {
		case <-exited:
			return false
		default:
		}
		if s.ready(s.addr) == nil {
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return false
}

func freePort(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	defer ln.Close()
	return strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	if b == nil {
		return ""
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
