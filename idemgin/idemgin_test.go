package idemgin_test

import (
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemgin"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/internal/httpcheck"
)

var quiet = slog.New(slog.DiscardHandler)

// authenticate stands for the authentication in front: it leaves the
// caller in the gin.Context, where TenantFunc reads it.
func authenticate(c *gin.Context) {
	user, ok := strings.CutPrefix(c.GetHeader("Authorization"), "Bearer ")
	if !ok || user == "" {
		c.AbortWithStatus(http.StatusUnauthorized)
		return
	}
	c.Set("user", user)
}

func tenant(c *gin.Context) (string, error) {
	if u := c.GetString("user"); u != "" {
		return u, nil
	}
	return "", errors.New("no user")
}

// server serves POST /orders behind authenticate and the middleware,
// then handlers.
func server(t *testing.T, cfg idemgin.Config, handlers ...gin.HandlerFunc) *httptest.Server {
	t.Helper()
	engine, err := idem.NewEngine(idemmem.NewStore(nil), &idem.Config{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = engine.Close(t.Context()) })
	if cfg.TenantFunc == nil && cfg.HTTP.TenantFunc == nil {
		cfg.TenantFunc = tenant
	}
	cfg.HTTP.Logger = quiet
	mw, err := idemgin.New(engine, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := gin.New()
	r.POST("/orders/:cart", append([]gin.HandlerFunc{authenticate, mw}, handlers...)...)
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	return srv
}

// answer and post: a caller's call and what it got back (see httpcheck).
type answer = httpcheck.Answer

var post = httpcheck.Post

// A Gin handler answering through c.Status, c.Header and c.JSON (which
// sets its Content-Type after the status, as Gin's renderers do) is
// stored as it was sent and replayed with the marker; the handlers
// after the middleware do not run for the replay.
func TestGinRenderersAreStoredAndReplayed(t *testing.T) {
	var runs, after atomic.Int64
	srv := server(t, idemgin.Config{},
		func(c *gin.Context) {
			runs.Add(1)
			c.Header("Location", "/orders/"+c.Param("cart"))
			body, _ := io.ReadAll(c.Request.Body)
			c.JSON(http.StatusCreated, gin.H{"cart": c.Param("cart"), "body": string(body), "route": c.FullPath()})
		},
		func(c *gin.Context) { after.Add(1) })
	first := post(t, srv, "/orders/c1", "alice", "k1", "tea")
	again := post(t, srv, "/orders/c1", "alice", "k1", "tea")
	want := `{"body":"tea","cart":"c1","route":"/orders/:cart"}`
	for i, a := range []answer{first, again} {
		if a.Status != http.StatusCreated || a.Body != want || a.Header.Get("Location") != "/orders/c1" ||
			!strings.HasPrefix(a.Header.Get("Content-Type"), "application/json") {
			t.Fatalf("answer %d: %d %v %q; want 201 %s with its Location and JSON type", i, a.Status, a.Header, a.Body, want)
		}
	}
	if first.Header.Get(idemhttp.HeaderReplayed) != "" || again.Header.Get(idemhttp.HeaderReplayed) != "true" {
		t.Fatalf("replay markers %q then %q; want none then true", first.Header.Get(idemhttp.HeaderReplayed), again.Header.Get(idemhttp.HeaderReplayed))
	}
	if runs.Load() != 1 || after.Load() != 1 {
		t.Fatalf("handler ran %d times, the next one %d; want 1 and 1 (nothing after a replay)", runs.Load(), after.Load())
	}
	// Another tenant's key space: the same key runs again.
	if other := post(t, srv, "/orders/c1", "bob", "k1", "tea"); other.Header.Get(idemhttp.HeaderReplayed) != "" || runs.Load() != 2 {
		t.Fatalf("bob's request under alice's key: replayed %q, %d runs; want a run of its own", other.Header.Get(idemhttp.HeaderReplayed), runs.Load())
	}
}

// A status set with c.Status and no body is the answer: stored and
// replayed as such, not as 200.
func TestGinStatusWithoutBody(t *testing.T) {
	srv := server(t, idemgin.Config{}, func(c *gin.Context) { c.Status(http.StatusAccepted) })
	for i := range 2 {
		if a := post(t, srv, "/orders/c1", "alice", "k1", ""); a.Status != http.StatusAccepted || a.Body != "" {
			t.Fatalf("answer %d: %d %q; want 202 without a body", i, a.Status, a.Body)
		}
	}
}

// The middleware's own answers come through Gin: the caller's retry of
// a request in flight gets 409 in-flight, a key reused for another body
// 422, and the handler runs once.
func TestGinMismatch(t *testing.T) {
	var runs atomic.Int64
	srv := server(t, idemgin.Config{}, func(c *gin.Context) { runs.Add(1); c.String(http.StatusCreated, "ok") })
	post(t, srv, "/orders/c1", "alice", "k1", "tea")
	a := post(t, srv, "/orders/c1", "alice", "k1", "coffee")
	if a.Status != http.StatusUnprocessableEntity || a.Header.Get("Content-Type") != idemhttp.ContentTypeProblem ||
		!strings.Contains(a.Body, "fingerprint-mismatch") || runs.Load() != 1 {
		t.Fatalf("reused key: %d %q after %d runs; want the 422 problem fingerprint-mismatch and one run", a.Status, a.Body, runs.Load())
	}
}

// New refuses two tenant rules, and none.
func TestGinConfig(t *testing.T) {
	engine, _ := idem.NewEngine(idemmem.NewStore(nil), nil)
	defer engine.Close(t.Context())
	if _, err := idemgin.New(engine, &idemgin.Config{TenantFunc: tenant, HTTP: idemhttp.Config{TenantFunc: func(*http.Request) (string, error) { return "", nil }}}); err == nil {
		t.Fatal("New accepted two tenant rules")
	}
	if _, err := idemgin.New(engine, nil); err == nil {
		t.Fatal("New accepted no tenant rule")
	}
}
