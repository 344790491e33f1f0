//go:build linux

package dbcrash

import (
	"bytes"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/testenv"
)

// Bounds on what a broken server may cost before the test says so. A
// healthy one starts, recovers or stops in about a second.
const (
	startTimeout = 2 * time.Minute
	stopTimeout  = time.Minute
)

// server is a database server process the test started, and restarts.
type server struct {
	name string   // for messages: "postgres", "mariadbd"
	argv []string // the command that starts it
	log  string   // its output, appended across restarts
	cred *syscall.Credential
	// stopSignal asks for a clean shutdown: SIGINT (PostgreSQL's fast
	// shutdown), SIGTERM (mariadbd).
	stopSignal syscall.Signal
	// tree is true when the server forks processes of its own that must
	// die with it (PostgreSQL's backends and auxiliary processes).
	tree bool

	cmd  *exec.Cmd
	done chan struct{} // closed once cmd has been waited for
}

// start starts the server process; the caller waits for it to answer.
func (s *server) start() error {
	if s.cmd != nil {
		return fmt.Errorf("%s: already running", s.name)
	}
	logf, err := os.OpenFile(s.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	fmt.Fprintf(logf, "\n=== dbcrash: start %s\n", time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(s.argv[0], s.argv[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = []string{"LANG=C", "LC_ALL=C", "PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential: s.cred,
		// Its own process group, away from the terminal's signals; and
		// if the test process dies without its cleanups (a panic off
		// the test goroutine), the kernel kills the server with it.
		Setpgid:   true,
		Pdeathsig: syscall.SIGKILL,
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", s.name, err)
	}
	s.cmd = cmd
	s.done = make(chan struct{})
	go func(done chan struct{}) {
		_ = cmd.Wait()
		close(done)
	}(s.done)
	return nil
}

// exited reports whether the process has ended.
func (s *server) exited() bool {
	if s.cmd == nil {
		return true
	}
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// crash kills the server with SIGKILL, every process of it at once, and
// returns once they are all dead. Nothing it held in memory survives;
// what it had written to its files (the kernel's page cache included)
// does, as after any crash of the server alone.
func (s *server) crash() error {
	if s.cmd == nil {
		return fmt.Errorf("%s: not running", s.name)
	}
	pid := s.cmd.Process.Pid
	var kids []int
	if s.tree && !s.exited() {
		// Stopped, the postmaster forks nothing more and cannot react
		// to its children's deaths: each process dies where it stood.
		_ = syscall.Kill(pid, syscall.SIGSTOP)
		kids = descendants(pid)
		for _, k := range kids {
			_ = syscall.Kill(k, syscall.SIGKILL)
		}
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	if err := s.wait(stopTimeout); err != nil {
		return err
	}
	// The children were reparented when the postmaster died; a new
	// postmaster refuses to start while one of them still holds the old
	// shared memory.
	deadline := time.Now().Add(stopTimeout)
	for _, k := range kids {
		for alive(k) {
			if time.Now().After(deadline) {
				return fmt.Errorf("%s: process %d survived SIGKILL", s.name, k)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	return nil
}

// stop shuts the server down cleanly, or kills it if it does not stop.
func (s *server) stop() error {
	if s.cmd == nil {
		return nil
	}
	if !s.exited() {
		_ = syscall.Kill(s.cmd.Process.Pid, s.stopSignal)
	}
	if err := s.wait(stopTimeout); err != nil {
		_ = s.crash()
		return err
	}
	return nil
}

// wait waits for the process to end and forgets it.
func (s *server) wait(limit time.Duration) error {
	select {
	case <-s.done:
		s.cmd = nil
		return nil
	case <-time.After(limit):
		return fmt.Errorf("%s (pid %d) still running after %v", s.name, s.cmd.Process.Pid, limit)
	}
}

// tail returns the end of the server's log, for failure messages.
func (s *server) tail() string {
	b, _ := os.ReadFile(s.log)
	if len(b) > 3000 {
		b = b[len(b)-3000:]
	}
	return string(b)
}

// descendants lists the processes whose parent chain leads to pid, read
// from /proc. PostgreSQL's processes each sit in a session of their own,
// so no process group holds them all.
func descendants(pid int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	parent := map[int]int{}
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if pp, ok := ppid(p); ok {
			parent[p] = pp
		}
	}
	var out []int
	for p := range parent {
		for q := parent[p]; q > 1; q = parent[q] {
			if q == pid {
				out = append(out, p)
				break
			}
		}
	}
	slices.Sort(out)
	return out
}

// ppid reads a process's parent from /proc/<pid>/stat.
func ppid(pid int) (int, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	// pid (comm) state ppid …; comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 {
		return 0, false
	}
	pp, err := strconv.Atoi(f[1])
	return pp, err == nil
}

// alive reports whether pid still runs: present in /proc and not a zombie
// (a zombie holds no memory, and waits for whoever adopted it).
func alive(pid int) bool {
	s := procState(pid)
	return s != 0 && s != 'Z' && s != 'X'
}

// procState returns the state letter of /proc/<pid>/stat (R, S, T, Z, …),
// or 0 when there is no such process.
func procState(pid int) byte {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return 0
	}
	return b[i+2]
}

// freePort returns a TCP port on 127.0.0.1 that nothing listens on now,
// below the kernel's ephemeral range when it can: the server gives the
// port up at each crash, and the port must still be free at the restart,
// while every outgoing connection of the machine (the clients' own
// reconnections included) takes its local port from that range.
func freePort(t testing.TB) int {
	t.Helper()
	low := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				low = n
			}
		}
	}
	const first = 10000
	for range 100 {
		if low <= first {
			break
		}
		port := first + mrand.IntN(low-first)
		if l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
			l.Close()
			return port
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// findBinary returns the first of candidates that exists and is
// executable (a name without a slash is looked up on PATH), or skips the
// test (fails it under CI=true).
func findBinary(t testing.TB, what string, candidates ...string) string {
	t.Helper()
	for _, c := range candidates {
		if !strings.Contains(c, "/") {
			if p, err := exec.LookPath(c); err == nil {
				return p
			}
			continue
		}
		if fi, err := os.Stat(c); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return c
		}
	}
	testenv.Unavailable(t, what, fmt.Errorf("none of %s found", strings.Join(candidates, ", ")))
	return ""
}

// postgresBinDirs lists /usr/lib/postgresql/*/bin, newest major version
// first.
func postgresBinDirs() []string {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	version := func(d string) int {
		n, _ := strconv.Atoi(filepath.Base(filepath.Dir(d)))
		return n
	}
	slices.SortFunc(dirs, func(a, b string) int { return version(b) - version(a) })
	return dirs
}

// unprivileged returns the credential to run PostgreSQL under when the
// test runs as root (PostgreSQL refuses root), or nil.
func unprivileged(t testing.TB) *syscall.Credential {
	t.Helper()
	if os.Geteuid() != 0 {
		return nil
	}
	var errs []error
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}
	}
	testenv.Unavailable(t, "a non-root user to run PostgreSQL as", errors.Join(errs...))
	return nil
}

// privateDir makes a directory the server's user may own: t.TempDir's
// parents are private to the test's user. It is removed when the test
// ends, after the servers are stopped (cleanups run last-in, first-out).
func privateDir(t testing.TB, prefix string, cred *syscall.Credential) string {
	t.Helper()
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// runAs runs a setup command (initdb, mariadb-install-db) to completion.
func runAs(cred *syscall.Credential, argv ...string) error {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = []string{"LANG=C", "LC_ALL=C", "PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL}
	out, err := cmd.CombinedOutput()
	if err != nil {
		if len(out) > 3000 {
			out = out[len(out)-3000:]
		}
		return fmt.Errorf("%s: %v\n%s", filepath.Base(argv[0]), err, out)
	}
	return nil
}

// mutant is IDEM_DBCRASH_MUTANT: a durability setting weakened on
// purpose, which the tests must catch.
func mutant() string { return os.Getenv("IDEM_DBCRASH_MUTANT") }

// workloadDuration is how long the workload runs under kills.
func workloadDuration(t testing.TB) time.Duration {
	t.Helper()
	v := os.Getenv("IDEM_DBCRASH_DURATION")
	if v == "" {
		return 15 * time.Second
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		t.Fatalf("IDEM_DBCRASH_DURATION=%q: want a positive duration such as 2m", v)
	}
	return d
}
