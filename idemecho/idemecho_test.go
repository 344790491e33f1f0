package idemecho_test

import (
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemecho"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/internal/httpcheck"
	"github.com/labstack/echo/v4"
)

var quiet = slog.New(slog.DiscardHandler)

// authenticate stands for the authentication in front: it leaves the
// caller in the echo.Context, where TenantFunc reads it.
func authenticate(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		user, ok := strings.CutPrefix(c.Request().Header.Get("Authorization"), "Bearer ")
		if !ok || user == "" {
			return echo.ErrUnauthorized
		}
		c.Set("user", user)
		return next(c)
	}
}

func tenant(c echo.Context) (string, error) {
	if u, _ := c.Get("user").(string); u != "" {
		return u, nil
	}
	return "", errors.New("no user")
}

func newEngine(t *testing.T) *idem.Engine {
	t.Helper()
	engine, err := idem.NewEngine(idemmem.NewStore(nil), &idem.Config{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = engine.Close(t.Context()) })
	return engine
}

// server serves POST /orders/:cart with h behind authenticate and the
// middleware.
func server(t *testing.T, cfg idemecho.IdempotencyConfig, h echo.HandlerFunc) *httptest.Server {
	t.Helper()
	if cfg.Engine == nil {
		cfg.Engine = newEngine(t)
	}
	if cfg.TenantFunc == nil && cfg.HTTP.TenantFunc == nil {
		cfg.TenantFunc = tenant
	}
	cfg.HTTP.Logger = quiet
	e := echo.New()
	e.POST("/orders/:cart", h, authenticate, idemecho.IdempotencyWithConfig(cfg))
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	return srv
}

// answer and post: a caller's call and what it got back (see httpcheck).
type answer = httpcheck.Answer

var post = httpcheck.Post

// A handler that returns an error is answered with that error rendered
// by Echo's HTTPErrorHandler, and the rendered error is what is stored
// and replayed: never the empty 200 that Echo's rendering after the
// chain would leave behind a net/http middleware.
func TestEchoReturnedErrorIsStoredRendered(t *testing.T) {
	var runs atomic.Int64
	srv := server(t, idemecho.IdempotencyConfig{}, func(c echo.Context) error {
		runs.Add(1)
		return echo.NewHTTPError(http.StatusConflict, "cart "+c.Param("cart")+" is closed")
	})
	first := post(t, srv, "/orders/c1", "alice", "k1", "tea")
	again := post(t, srv, "/orders/c1", "alice", "k1", "tea")
	want := `{"message":"cart c1 is closed"}`
	for i, a := range []answer{first, again} {
		if a.Status != http.StatusConflict || strings.TrimSpace(a.Body) != want || !strings.HasPrefix(a.Header.Get("Content-Type"), "application/json") {
			t.Fatalf("answer %d: %d %q (%s); want 409 %s", i, a.Status, a.Body, a.Header.Get("Content-Type"), want)
		}
	}
	if first.Header.Get(idemhttp.HeaderReplayed) != "" || again.Header.Get(idemhttp.HeaderReplayed) != "true" {
		t.Fatalf("replay markers %q then %q; want none then true", first.Header.Get(idemhttp.HeaderReplayed), again.Header.Get(idemhttp.HeaderReplayed))
	}
	if runs.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1", runs.Load())
	}
}

// An error that is not an *echo.HTTPError is rendered as Echo renders
// it (500 Internal Server Error) and stored so.
func TestEchoPlainErrorIsStoredAs500(t *testing.T) {
	var runs atomic.Int64
	srv := server(t, idemecho.IdempotencyConfig{}, func(c echo.Context) error {
		runs.Add(1)
		return errors.New("the provider is down")
	})
	first := post(t, srv, "/orders/c1", "alice", "k1", "tea")
	again := post(t, srv, "/orders/c1", "alice", "k1", "tea")
	if first.Status != http.StatusInternalServerError || again.Status != first.Status || again.Body != first.Body ||
		again.Header.Get(idemhttp.HeaderReplayed) != "true" || runs.Load() != 1 {
		t.Fatalf("got %d %q then %d %q (replayed %q) after %d runs; want Echo's 500 replayed, one run",
			first.Status, first.Body, again.Status, again.Body, again.Header.Get(idemhttp.HeaderReplayed), runs.Load())
	}
}

// Echo's renderers are stored as sent; the route pattern, the params and
// the body reach the handler; tenants are kept apart.
func TestEchoJSONIsStoredAndReplayed(t *testing.T) {
	var runs atomic.Int64
	srv := server(t, idemecho.IdempotencyConfig{}, func(c echo.Context) error {
		runs.Add(1)
		body, _ := io.ReadAll(c.Request().Body)
		c.Response().Header().Set("Location", "/orders/"+c.Param("cart"))
		return c.JSON(http.StatusCreated, map[string]string{"cart": c.Param("cart"), "body": string(body), "route": c.Path()})
	})
	first := post(t, srv, "/orders/c1", "alice", "k1", "tea")
	again := post(t, srv, "/orders/c1", "alice", "k1", "tea")
	want := `{"body":"tea","cart":"c1","route":"/orders/:cart"}`
	for i, a := range []answer{first, again} {
		if a.Status != http.StatusCreated || strings.TrimSpace(a.Body) != want || a.Header.Get("Location") != "/orders/c1" {
			t.Fatalf("answer %d: %d %v %q; want 201 %s", i, a.Status, a.Header, a.Body, want)
		}
	}
	if again.Header.Get(idemhttp.HeaderReplayed) != "true" || runs.Load() != 1 {
		t.Fatalf("replayed %q after %d runs", again.Header.Get(idemhttp.HeaderReplayed), runs.Load())
	}
	if other := post(t, srv, "/orders/c1", "bob", "k1", "tea"); other.Header.Get(idemhttp.HeaderReplayed) != "" || runs.Load() != 2 {
		t.Fatalf("bob's request under alice's key: replayed %q, %d runs; want a run of its own", other.Header.Get(idemhttp.HeaderReplayed), runs.Load())
	}
}

// The Skipper's requests run unprotected: a duplicate runs again.
func TestEchoSkipper(t *testing.T) {
	var runs atomic.Int64
	srv := server(t, idemecho.IdempotencyConfig{Skipper: func(c echo.Context) bool { return c.Param("cart") == "free" }},
		func(c echo.Context) error { runs.Add(1); return c.String(http.StatusCreated, "ok") })
	post(t, srv, "/orders/free", "alice", "k1", "tea")
	if a := post(t, srv, "/orders/free", "alice", "k1", "tea"); a.Header.Get(idemhttp.HeaderReplayed) != "" || runs.Load() != 2 {
		t.Fatalf("skipped route: replayed %q after %d runs; want two runs", a.Header.Get(idemhttp.HeaderReplayed), runs.Load())
	}
	post(t, srv, "/orders/c1", "alice", "k1", "tea")
	if a := post(t, srv, "/orders/c1", "alice", "k1", "tea"); a.Header.Get(idemhttp.HeaderReplayed) != "true" || runs.Load() != 3 {
		t.Fatalf("covered route: replayed %q after %d runs; want a replay", a.Header.Get(idemhttp.HeaderReplayed), runs.Load())
	}
}

// ToMiddleware refuses no engine, two tenant rules and none;
// IdempotencyWithConfig panics on them.
func TestEchoConfig(t *testing.T) {
	engine := newEngine(t)
	for name, cfg := range map[string]idemecho.IdempotencyConfig{
		"no engine":      {TenantFunc: tenant},
		"no tenant rule": {Engine: engine},
		"two rules":      {Engine: engine, TenantFunc: tenant, HTTP: idemhttp.Config{TenantFunc: func(*http.Request) (string, error) { return "", nil }}},
	} {
		if _, err := cfg.ToMiddleware(); err == nil {
			t.Errorf("%s: ToMiddleware accepted it", name)
		}
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: IdempotencyWithConfig did not panic", name)
				}
			}()
			idemecho.IdempotencyWithConfig(cfg)
		}()
	}
}
