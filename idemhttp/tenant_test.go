package idemhttp_test

import (
	"bytes"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
)

// Without a tenant rule New refuses the configuration, and says why and
// what to do.
func TestNewRequiresATenantRule(t *testing.T) {
	e := newEnv(t, nil)
	_, err := idemhttp.NewMiddleware(e.engine, &idemhttp.Config{})
	if err == nil || !strings.Contains(err.Error(), "TenantFunc") || !strings.Contains(err.Error(), "SharedKeySpace") {
		t.Fatalf("New without TenantFunc: %v, want an error naming TenantFunc and SharedKeySpace", err)
	}
	// Chosen explicitly, one key space is shared by every caller: bob
	// sending alice's key and body gets alice's answer.
	h := e.handler(t, idemhttp.Config{SharedKeySpace: true}, &counting{})
	alice := serve(h, as("alice", request(http.MethodPost, "/orders", "k1", "a")))
	bob := serve(h, as("bob", request(http.MethodPost, "/orders", "k1", "a")))
	if bob.Header().Get(idemhttp.HeaderReplayed) != "true" || bob.Body.String() != alice.Body.String() {
		t.Fatalf("shared key space: bob got %q (replayed %q), want alice's answer", bob.Body, bob.Header().Get(idemhttp.HeaderReplayed))
	}
	e.wantState(t, "", "k1", idem.StateComplete)
}

// lockedBuffer is a log destination safe for concurrent writes.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// A tenant holding a control character (idem keeps those for its own key
// spaces: the inbox's tenants start with 0x1f) is a server bug: refused
// with 500 and logged, never used.
func TestTenantWithControlCharacterRefused(t *testing.T) {
	for _, tenant := range []string{"\x1finbox:orders", "acme\n", "a\x00b", "del\x7f"} {
		e := newEnv(t, nil)
		var logs lockedBuffer
		c := &counting{}
		h := e.handler(t, idemhttp.Config{
			TenantFunc: func(*http.Request) (string, error) { return tenant, nil },
			Logger:     slog.New(slog.NewTextHandler(&logs, nil)),
		}, c)
		w := serve(h, request(http.MethodPost, "/orders", "k1", "a"))
		wantProblem(t, w, http.StatusInternalServerError, "internal-error")
		wantEcho(t, w, "k1")
		if c.n.Load() != 0 || e.store.Len() != 0 {
			t.Fatalf("tenant %q: ran %d times with %d records, want 0 and 0", tenant, c.n.Load(), e.store.Len())
		}
		if !strings.Contains(logs.String(), "level=ERROR") || !strings.Contains(logs.String(), "control character") {
			t.Fatalf("tenant %q: logs %q, want an error", tenant, logs.String())
		}
	}
	// Other bytes are fine, UTF-8 included.
	e := newEnv(t, nil)
	h := e.handler(t, idemhttp.Config{TenantFunc: func(*http.Request) (string, error) { return "société\t", nil }}, &counting{})
	if w := serve(h, request(http.MethodPost, "/orders", "k1", "a")); w.Code == http.StatusCreated {
		t.Fatalf("a tab is a control character: %d", w.Code)
	}
	h = e.handler(t, idemhttp.Config{TenantFunc: func(*http.Request) (string, error) { return "société", nil }}, &counting{})
	if w := serve(h, request(http.MethodPost, "/orders", "k1", "a")); w.Code != http.StatusCreated {
		t.Fatalf("UTF-8 tenant: %d", w.Code)
	}
}
