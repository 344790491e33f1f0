package testenv

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// DefaultDynaliteDir is where .ci/run installs the npm package dynalite
// (a DynamoDB-compatible server run by Node), and where DynaliteBinary
// looks when IDEM_TEST_DYNALITE is unset.
const DefaultDynaliteDir = "/tmp/idem-dynalite"

// DynaliteBinary returns the dynalite executable: $IDEM_TEST_DYNALITE,
// or node_modules/.bin/dynalite under DefaultDynaliteDir.
func DynaliteBinary() (string, error) {
	if _, err := exec.LookPath("node"); err != nil {
		return "", errors.New("node is not installed")
	}
	if p := os.Getenv("IDEM_TEST_DYNALITE"); p != "" {
		return p, nil
	}
	p := filepath.Join(DefaultDynaliteDir, "node_modules", ".bin", "dynalite")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("dynalite is not installed (npm install --prefix %s dynalite, or set IDEM_TEST_DYNALITE)", DefaultDynaliteDir)
	}
	return p, nil
}

// StartDynalite starts a dynalite server, in memory, on a free port of
// 127.0.0.1, and returns its URL and the function that stops it.
func StartDynalite() (url string, stop func(), err error) {
	bin, err := DynaliteBinary()
	if err != nil {
		return "", nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	cmd := exec.Command(bin, "--host", "127.0.0.1", "--port", strconv.Itoa(port),
		"--createTableMs", "0", "--deleteTableMs", "0", "--updateTableMs", "0")
	// If the test process dies, so does its server.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var logged syncBuffer
	cmd.Stdout, cmd.Stderr = &logged, &logged
	if err := cmd.Start(); err != nil {
		return "", nil, fmt.Errorf("start %s: %w", bin, err)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return "http://" + addr, stop, nil
		}
	}
	stop()
	return "", nil, fmt.Errorf("dynalite did not listen on %s within 30s: %s", addr, logged.String())
}

// Dynalite starts a dynalite server for t, stopped when t ends, and
// returns its URL. Where Node or dynalite is missing it skips t with a
// one-line reason (fails it under CI=true).
func Dynalite(t testing.TB) string {
	t.Helper()
	url, stop, err := StartDynalite()
	if err != nil {
		Unavailable(t, "dynalite", err)
	}
	t.Cleanup(stop)
	return url
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
