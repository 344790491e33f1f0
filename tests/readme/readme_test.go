// Package readme checks the README as a new user meets it: every Go block
// compiles in a workspace laid out as the README's "Using idem from a
// clone" says, the complete SQLite program answers what the README's
// transcript shows, and every excerpt of an example is still in it.
package readme

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"
)

// repoRoot is the checkout, two directories up from this test.
func repoRoot(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// block is one fenced Go block of the README.
type block struct {
	line    int    // where its fence opens, 1-based
	excerpt string // the file it quotes, from a preceding <!-- excerpt: PATH --> line
	code    string
}

// workUse finds the directories of go.work's use block.
var workUse = regexp.MustCompile(`(?m)^\s+(\.[^\s]*)\s*$`)

var excerptMark = regexp.MustCompile(`^<!-- excerpt: (\S+) -->$`)

func goBlocks(t *testing.T) []block {
	t.Helper()
	f, err := os.Open(filepath.Join(repoRoot(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var (
		blocks  []block
		cur     *block
		excerpt string
		n       int
	)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		n++
		line := sc.Text()
		switch {
		case cur != nil && line == "```":
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			cur.code += line + "\n"
		case line == "```go":
			cur = &block{line: n, excerpt: excerpt}
			excerpt = ""
		default:
			if m := excerptMark.FindStringSubmatch(line); m != nil {
				excerpt = m[1]
			} else if strings.TrimSpace(line) != "" {
				excerpt = ""
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(blocks) == 0 {
		t.Fatal("README.md has no Go block")
	}
	return blocks
}

// fragments turn the README's partial snippets into programs: each names
// the snippet by its first line and surrounds it with the declarations
// the README's prose gives it. A snippet without an entry here fails the
// test, so that no block of the README goes unchecked.
var fragments = map[string]struct{ imports, before, after string }{
	`pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/test")`: {
		imports: `"context"; "log"; "net/http"; "github.com/idem-go/idem"; "github.com/idem-go/idem/idempg"; "github.com/jackc/pgx/v5/pgxpool"`,
		before:  "func main() {\nctx := context.Background()\nvar r *http.Request\nvar who string\n",
		after:   "_, _, _ = engine, r, who\n}\n",
	},
	`janitor, err := idemjanitor.NewJanitor(store, &idemjanitor.Config{Interval: time.Minute})`: {
		imports: `"context"; "log"; "time"; "github.com/idem-go/idem/idemjanitor"; "github.com/idem-go/idem/idemmem"`,
		before:  "func main() {\nctx := context.Background()\nstore := idemmem.NewStore(nil)\n",
		after:   "}\n",
	},
	`metrics, err := idemprom.NewCollector(nil) // registers with prometheus.DefaultRegisterer`: {
		imports: `"log"; "github.com/idem-go/idem"; "github.com/idem-go/idem/idemmem"; "github.com/idem-go/idem/idemprom"`,
		before:  "func main() {\nstore := idemmem.NewStore(nil)\n",
		after:   "_ = engine\n}\n",
	},
	`inbox, err := ideminbox.NewInbox(engine, &ideminbox.Config{Consumer: "order-projector"})`: {
		imports: `"context"; "log"; "github.com/idem-go/idem"; "github.com/idem-go/idem/idemmem"; "github.com/idem-go/idem/ideminbox"`,
		before:  "func main() {\nctx := context.Background()\nengine, err := idem.NewEngine(idemmem.NewStore(nil), nil)\nif err != nil {\nlog.Fatal(err)\n}\nmsgID, attempt := \"m-1\", 1\nhandle := func(ctx context.Context) error { return nil }\n",
		after:   "_, _ = decision, err\n}\n",
	},
	`client := idemclient.NewClient(&idemclient.Transport{MaxAttempts: 3, AttemptTimeout: 5 * time.Second})`: {
		imports: `"context"; "net/http"; "strings"; "time"; "github.com/idem-go/idem/idemclient"`,
		before:  "func main() {\nctx := context.Background()\n",
		after:   "_, _ = resp, err\n}\n",
	},
}

// workspace lays out a new user's directory: a module beside a clone of
// this checkout, tied to it by go.work exactly as the README says.
func workspace(t *testing.T, src string) string {
	t.Helper()
	root := repoRoot(t)
	dir := t.TempDir()
	app := filepath.Join(dir, "myservice")
	if err := os.MkdirAll(app, 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(app, "go.mod"), "module example.com/myservice\n\ngo 1.26.0\n")
	write(t, filepath.Join(app, "main.go"), src)
	// Every module of the checkout, as `go work use` would add them one
	// by one: the README's programs import from several.
	uses := []string{"./myservice"}
	work, err := os.ReadFile(filepath.Join(root, "go.work"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range workUse.FindAllStringSubmatch(string(work), -1) {
		uses = append(uses, filepath.Join(root, m[1]))
	}
	write(t, filepath.Join(dir, "go.work"), "go 1.26.8\n\nuse (\n\t"+strings.Join(uses, "\n\t")+"\n)\n")
	// The checkout's go.work.sum holds the checksums the workspace needs
	// beyond the modules' own go.sum files.
	if sum, err := os.ReadFile(filepath.Join(root, "go.work.sum")); err == nil {
		write(t, filepath.Join(dir, "go.work.sum"), string(sum))
	}
	return app
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func build(t *testing.T, app string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "prog")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Dir = app
	cmd.Env = append(os.Environ(), "GOWORK="+filepath.Join(filepath.Dir(app), "go.work"), "GOFLAGS=")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

func program(t *testing.T, b block) (string, bool) {
	t.Helper()
	if isProgram(b.code) {
		return b.code, true
	}
	first, _, _ := strings.Cut(b.code, "\n")
	f, ok := fragments[strings.TrimSpace(first)]
	if !ok {
		return "", false
	}
	var imports strings.Builder
	for _, imp := range strings.Split(f.imports, ";") {
		imports.WriteString("\t" + strings.TrimSpace(imp) + "\n")
	}
	return "package main\n\nimport (\n" + imports.String() + ")\n\n" + f.before + b.code + f.after, true
}

// isProgram reports whether code is a whole file of package main (its
// doc comment may come first).
func isProgram(code string) bool {
	return strings.HasPrefix(code, "package main\n") || strings.Contains(code, "\npackage main\n")
}

// TestBlocksCompile builds every Go block of the README in a new user's
// workspace: the complete programs as they are, the fragments inside the
// declarations the prose gives them.
func TestBlocksCompile(t *testing.T) {
	if testing.Short() {
		t.Skip("builds every README program: not in -short")
	}
	for _, b := range goBlocks(t) {
		if b.excerpt != "" {
			continue // TestExcerpts
		}
		t.Run(fmt.Sprintf("line%d", b.line), func(t *testing.T) {
			src, ok := program(t, b)
			if !ok {
				t.Fatalf("README.md:%d: a Go block that is neither a complete program, an excerpt nor a known fragment; add it to fragments:\n%s", b.line, b.code)
			}
			build(t, workspace(t, src))
		})
	}
}

// TestExcerpts checks that each block marked as an excerpt of a file still
// is one: its lines, but for the "…" elisions, appear in the file in order.
func TestExcerpts(t *testing.T) {
	for _, b := range goBlocks(t) {
		if b.excerpt == "" {
			continue
		}
		t.Run(fmt.Sprintf("line%d", b.line), func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join(repoRoot(t), b.excerpt))
			if err != nil {
				t.Fatalf("README.md:%d quotes %s: %v", b.line, b.excerpt, err)
			}
			var file []string
			for _, l := range strings.Split(string(data), "\n") {
				file = append(file, strings.TrimSpace(l))
			}
			at := 0
			for _, l := range strings.Split(b.code, "\n") {
				l = strings.TrimSpace(l)
				if l == "" || strings.Contains(l, "…") {
					continue
				}
				found := false
				for ; at < len(file); at++ {
					if file[at] == l {
						found, at = true, at+1
						break
					}
				}
				if !found {
					t.Fatalf("README.md:%d: %q is not in %s (after the lines before it)", b.line, l, b.excerpt)
				}
			}
		})
	}
}

// TestSQLiteProgram runs the README's complete SQLite program and replays
// its transcript: alice's order, her retry replayed, her key reused for
// another cart refused, bob's request with her key an order of his own,
// and a POST without a key refused with 400.
func TestSQLiteProgram(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the README program: not in -short")
	}
	var src string
	for _, b := range goBlocks(t) {
		if strings.Contains(b.code, "idemsqlite.Open(") && isProgram(b.code) {
			src = b.code
		}
	}
	if src == "" {
		t.Fatal("README.md has no complete SQLite program")
	}
	const readmeAddr = "127.0.0.1:8080"
	if !strings.Contains(src, readmeAddr) {
		t.Fatalf("the SQLite program no longer listens on %s", readmeAddr)
	}
	// The one change to the program as written: a free port, since 8080
	// may be taken on the machine that runs the test.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	app := workspace(t, strings.Replace(src, readmeAddr, addr, 1))
	bin := build(t, app)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin)
	cmd.Dir = t.TempDir() // shop.db lands there
	var logs strings.Builder
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	base := "http://" + addr
	for i := 0; ; i++ {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			break
		}
		if i > 600 {
			t.Fatalf("the program never listened on %s: %s", addr, logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}

	post := func(query, who, key string) (int, string, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/orders?"+query, nil)
		req.Header.Set("Authorization", "Bearer "+who)
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), string(body)
	}
	expect := func(what string, gotStatus int, gotReplayed, gotBody string, status int, replayed, body string) {
		t.Helper()
		if gotStatus != status || gotReplayed != replayed || (body != "" && !strings.Contains(gotBody, body)) {
			t.Fatalf("%s: got %d replayed=%q %s, the README shows %d replayed=%q %s", what, gotStatus, gotReplayed, gotBody, status, replayed, body)
		}
	}
	s, r, b := post("cart_id=c_42", "alice", "order-c_42-1")
	expect("alice's order", s, r, b, 201, "", `{"id":1}`)
	s, r, b = post("cart_id=c_42", "alice", "order-c_42-1")
	expect("alice's retry", s, r, b, 201, "true", `{"id":1}`)
	s, r, b = post("cart_id=c_43", "alice", "order-c_42-1")
	expect("alice's key for another cart", s, r, b, 422, "", "fingerprint-mismatch")
	s, r, b = post("cart_id=c_42", "bob", "order-c_42-1")
	expect("bob with alice's key", s, r, b, 201, "", `{"id":2}`)
	s, r, b = post("cart_id=c_42", "bob", "")
	expect("a POST without a key", s, r, b, 400, "", "")
	if strings.Contains(logs.String(), "panic") {
		t.Fatalf("the program panicked:\n%s", logs.String())
	}
}
