// Package deps checks what a program that imports idem downloads and
// links: the packaging promise that a user imports only what he uses.
package deps

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// repoRoot is the checkout, two directories up from this test.
func repoRoot(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// program writes a module that imports pkgs, with replace directives to
// this checkout's modules, and returns its directory.
func program(t *testing.T, pkgs []string, modules []string) string {
	t.Helper()
	root := repoRoot(t)
	dir := t.TempDir()
	var gomod strings.Builder
	gomod.WriteString("module example.com/user\n\ngo 1.24\n\n")
	for _, m := range modules {
		path := "github.com/idem-go/idem"
		if m != "." {
			path += "/" + m
		}
		gomod.WriteString("require " + path + " v0.0.0-00010101000000-000000000000\n")
		gomod.WriteString("replace " + path + " => " + filepath.Join(root, m) + "\n")
	}
	var src strings.Builder
	src.WriteString("package main\n\nimport (\n")
	for _, p := range pkgs {
		src.WriteString("\t_ \"" + p + "\"\n")
	}
	src.WriteString(")\n\nfunc main() {}\n")
	for name, content := range map[string]string{"go.mod": gomod.String(), "main.go": src.String()} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// gocmd runs the go command in dir, outside any workspace.
func gocmd(t *testing.T, dir string, env []string, args ...string) string {
	t.Helper()
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), append([]string{"GOWORK=off", "GOFLAGS=-mod=mod"}, env...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// A program that imports idemhttp and idemmem needs no module but idem:
// tidy succeeds with the module proxy turned off and an empty module
// cache, and its go.sum stays empty.
func TestHTTPAndMemoryDownloadNothing(t *testing.T) {
	dir := program(t, []string{"github.com/idem-go/idem/idemhttp", "github.com/idem-go/idem/idemmem"}, []string{"."})
	env := []string{"GOPROXY=off", "GOMODCACHE=" + t.TempDir()}
	gocmd(t, dir, env, "mod", "tidy")
	if sum, err := os.ReadFile(filepath.Join(dir, "go.sum")); err == nil && len(strings.TrimSpace(string(sum))) > 0 {
		t.Fatalf("go.sum lists modules:\n%s", sum)
	}
	modules := gocmd(t, dir, env, "list", "-m", "all")
	if lines := strings.Fields(modules); len(lines) != 3 { // example.com/user, github.com/idem-go/idem, and its version+replacement
		t.Logf("go list -m all:\n%s", modules)
	}
	for _, line := range strings.Split(strings.TrimSpace(modules), "\n") {
		if !strings.HasPrefix(line, "example.com/user") && !strings.HasPrefix(line, "github.com/idem-go/idem ") {
			t.Errorf("a module besides idem: %s", line)
		}
	}
	bin := filepath.Join(t.TempDir(), "user")
	gocmd(t, dir, env, "build", "-o", bin, ".")
	linked := gocmd(t, dir, nil, "version", "-m", bin)
	for _, line := range strings.Split(linked, "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "dep" && !strings.HasPrefix(f[1], "github.com/idem-go/idem") {
			t.Errorf("the binary links %s", f[1])
		}
	}
	t.Logf("modules:\n%s", modules)
}

// A program that imports idempg gets pgx and what pgx needs, and nothing
// of the other backends or of the test-only clients.
func TestPostgreSQLGetsPgxOnly(t *testing.T) {
	dir := program(t, []string{"github.com/idem-go/idem/idempg"}, []string{".", "idempg"})
	gocmd(t, dir, nil, "mod", "tidy")
	sum, err := os.ReadFile(filepath.Join(dir, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	modules := gocmd(t, dir, nil, "list", "-m", "all")
	bin := filepath.Join(t.TempDir(), "user")
	gocmd(t, dir, nil, "build", "-o", bin, ".")
	linked := gocmd(t, dir, nil, "version", "-m", bin)
	for _, forbidden := range []string{"modernc.org", "go-sql-driver", "go-redis", "nats-io", "amqp091", "stripe", "retryablehttp", "prometheus", "opentelemetry", "google/uuid"} {
		for what, text := range map[string]string{"go.sum": string(sum), "go list -m all": modules, "the binary": linked} {
			if strings.Contains(text, forbidden) {
				t.Errorf("%s mentions %s", what, forbidden)
			}
		}
	}
	if !strings.Contains(linked, "github.com/jackc/pgx/v5") {
		t.Errorf("the binary does not link pgx:\n%s", linked)
	}
	t.Logf("modules:\n%s\nlinked:\n%s", modules, linked)
}

// A program that imports idemconnect links Connect and protobuf, never
// grpc-go: the RPC core it shares with idemgrpc (idemgrpc/idemrpc)
// imports protobuf and the google.rpc types only.
func TestConnectLinksNoGRPC(t *testing.T) {
	dir := program(t, []string{"github.com/idem-go/idem/idemconnect"}, []string{".", "idemconnect", "idemgrpc"})
	gocmd(t, dir, nil, "mod", "tidy")
	bin := filepath.Join(t.TempDir(), "user")
	gocmd(t, dir, nil, "build", "-o", bin, ".")
	linked := gocmd(t, dir, nil, "version", "-m", bin)
	if strings.Contains(linked, "google.golang.org/grpc") {
		t.Errorf("the binary links grpc-go:\n%s", linked)
	}
	if !strings.Contains(linked, "connectrpc.com/connect") {
		t.Errorf("the binary does not link Connect:\n%s", linked)
	}
	t.Logf("linked:\n%s", linked)
}
