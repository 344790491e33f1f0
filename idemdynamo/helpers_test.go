package idemdynamo_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/truora/minidyn/server"

	"github.com/idem-go/idem/idemdynamo"
	"github.com/idem-go/idem/internal/testenv"
)

func TestMain(m *testing.M) {
	code := m.Run()
	stopDynalite()
	os.Exit(code)
}

// The dynalite server of this test process, started once by
// dynaliteEndpoint and stopped by TestMain.
var (
	dynaliteOnce sync.Once
	dynaliteCmd  *exec.Cmd
	dynaliteURL  string
	dynaliteErr  error
)

// dynaliteBin finds the dynalite executable: $IDEM_DYNALITE (the path
// .ci/run exports), or the .bin of an npm install in the usual places.
func dynaliteBin() (string, error) {
	if p := os.Getenv("IDEM_DYNALITE"); p != "" {
		return p, nil
	}
	for _, dir := range []string{os.Getenv("IDEM_DYNALITE_DIR"), "/tmp/idem-dynalite", "/tmp/dynalite-dyn"} {
		if dir == "" {
			continue
		}
		p := filepath.Join(dir, "node_modules", ".bin", "dynalite")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", errors.New("dynalite not installed: npm install dynalite into /tmp/idem-dynalite, or set IDEM_DYNALITE to its executable")
}

// dynaliteEndpoint returns the URL of a dynalite server (an npm package
// run by Node: a real server process, in memory), started on a free port
// the first time. It skips the test where Node or dynalite is missing,
// and fails it under CI=true.
func dynaliteEndpoint(t testing.TB) string {
	t.Helper()
	dynaliteOnce.Do(func() { dynaliteURL, dynaliteErr = startDynalite() })
	if dynaliteErr != nil {
		testenv.Unavailable(t, "dynalite", dynaliteErr)
	}
	return dynaliteURL
}

func startDynalite() (string, error) {
	if _, err := exec.LookPath("node"); err != nil {
		return "", errors.New("node is not installed")
	}
	bin, err := dynaliteBin()
	if err != nil {
		return "", err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	cmd := exec.Command(bin, "--host", "127.0.0.1", "--port", strconv.Itoa(port),
		"--createTableMs", "0", "--deleteTableMs", "0", "--updateTableMs", "0")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		return "", fmt.Errorf("start %s: %w", bin, err)
	}
	var logged strings.Builder
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			logged.WriteString(sc.Text() + "\n")
		}
	}()
	addr := "127.0.0.1:" + strconv.Itoa(port)
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			dynaliteCmd = cmd
			return "http://" + addr, nil
		}
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	return "", fmt.Errorf("dynalite did not listen on %s within 30s: %s", addr, logged.String())
}

func stopDynalite() {
	if dynaliteCmd != nil {
		_ = dynaliteCmd.Process.Kill()
		_ = dynaliteCmd.Wait()
	}
}

// minidynEndpoint starts minidyn's HTTP server in this process, for what
// dynalite lacks (TransactWriteItems), and returns its URL.
func minidynEndpoint(t testing.TB) string {
	t.Helper()
	srv := httptest.NewServer(server.NewServer())
	t.Cleanup(srv.Close)
	return srv.URL
}

// newClient returns a DynamoDB client on endpoint, with dummy credentials
// (neither server checks them). Each call has a connection pool of its
// own, as a second process would.
func newClient(endpoint string) *dynamodb.Client {
	return dynamodb.New(dynamodb.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(endpoint),
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "idem", SecretAccessKey: "idem", Source: "test"}, nil
		}),
	})
}

// newTable creates a fresh table on endpoint and returns its name.
func newTable(t testing.TB, endpoint string) string {
	t.Helper()
	name := testenv.Name()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := idemdynamo.CreateTable(ctx, newClient(endpoint), name); err != nil && !errors.Is(err, idemdynamo.ErrNoTTL) {
		t.Fatalf("CreateTable: %v", err)
	}
	t.Cleanup(func() {
		_, _ = newClient(endpoint).DeleteTable(context.Background(), &dynamodb.DeleteTableInput{TableName: aws.String(name)})
	})
	return name
}

// newStore returns a store on table through a client of its own.
func newStore(t testing.TB, endpoint, table string, cfg idemdynamo.Config) *idemdynamo.Store {
	t.Helper()
	cfg.Table = table
	st, err := idemdynamo.NewStore(newClient(endpoint), &cfg)
	if err != nil {
		t.Fatal(err)
	}
	return st
}
