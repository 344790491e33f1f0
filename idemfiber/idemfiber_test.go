package idemfiber_test

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gofiber/fiber/v3"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemfiber"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmem"
)

var quiet = slog.New(slog.DiscardHandler)

// authenticate stands for the authentication in front: it leaves the
// caller in the request's locals, where TenantFunc reads it.
func authenticate(c fiber.Ctx) error {
	user, ok := strings.CutPrefix(c.Get("Authorization"), "Bearer ")
	if !ok || user == "" {
		return fiber.ErrUnauthorized
	}
	fiber.Locals(c, "user", user)
	return c.Next()
}

func tenant(c fiber.Ctx) (string, error) {
	if u := fiber.Locals[string](c, "user"); u != "" {
		return u, nil
	}
	return "", errors.New("no user")
}

// serve serves POST /orders/:cart with h behind authenticate and the
// middleware, on loopback; it returns the base URL.
func serve(t *testing.T, cfg idemfiber.Config, h fiber.Handler) string {
	t.Helper()
	engine, err := idem.NewEngine(idemmem.NewStore(nil), &idem.Config{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = engine.Close(t.Context()) })
	cfg.TenantFunc, cfg.Logger = tenant, quiet
	mw, err := idemfiber.New(engine, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	app := fiber.New()
	app.Post("/orders/:cart", authenticate, mw, h)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- app.Listener(ln, fiber.ListenConfig{DisableStartupMessage: true}) }()
	t.Cleanup(func() { _ = app.ShutdownWithTimeout(5 * time.Second); _ = ln.Close(); <-done }) // bounded: Shutdown waits for idle kept-alive connections
	return "http://" + ln.Addr().String()
}

type answer struct {
	status int
	header http.Header
	body   string
}

func post(t *testing.T, base, path, user, key, body string) answer {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, base+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "text/plain")
	if user != "" {
		req.Header.Set("Authorization", "Bearer "+user)
	}
	if key != "" {
		req.Header.Set(idemhttp.HeaderKey, key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, resp.Header, string(b)}
}

// Fiber's renderers are stored as sent, headers of the allowlist
// included and Set-Cookie left out of the replay; the params, the body
// and the route reach the handler; tenants are kept apart.
func TestFiberJSONIsStoredAndReplayed(t *testing.T) {
	var runs atomic.Int64
	base := serve(t, idemfiber.Config{}, func(c fiber.Ctx) error {
		runs.Add(1)
		c.Set("Location", "/orders/"+c.Params("cart"))
		c.Cookie(&fiber.Cookie{Name: "session", Value: "s1"})
		return c.Status(http.StatusCreated).JSON(fiber.Map{"cart": c.Params("cart"), "body": string(c.Body()), "route": c.FullPath()})
	})
	first := post(t, base, "/orders/c1", "alice", "k1", "tea")
	again := post(t, base, "/orders/c1", "alice", "k1", "tea")
	want := `{"body":"tea","cart":"c1","route":"/orders/:cart"}`
	for i, a := range []answer{first, again} {
		if a.status != http.StatusCreated || a.body != want || a.header.Get("Location") != "/orders/c1" ||
			!strings.HasPrefix(a.header.Get("Content-Type"), "application/json") || a.header.Get(idemhttp.HeaderKey) != "k1" {
			t.Fatalf("answer %d: %d %v %q; want 201 %s with its Location, JSON type and the key echoed", i, a.status, a.header, a.body, want)
		}
	}
	if first.header.Get(idemhttp.HeaderReplayed) != "" || again.header.Get(idemhttp.HeaderReplayed) != "true" {
		t.Fatalf("replay markers %q then %q; want none then true", first.header.Get(idemhttp.HeaderReplayed), again.header.Get(idemhttp.HeaderReplayed))
	}
	if first.header.Get("Set-Cookie") == "" || again.header.Get("Set-Cookie") != "" {
		t.Fatalf("Set-Cookie %q then %q; want it on the first answer only", first.header.Get("Set-Cookie"), again.header.Get("Set-Cookie"))
	}
	if runs.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1", runs.Load())
	}
	if other := post(t, base, "/orders/c1", "bob", "k1", "tea"); other.header.Get(idemhttp.HeaderReplayed) != "" || runs.Load() != 2 {
		t.Fatalf("bob's request under alice's key: replayed %q, %d runs; want a run of its own", other.header.Get(idemhttp.HeaderReplayed), runs.Load())
	}
	if mismatch := post(t, base, "/orders/c1", "alice", "k1", "coffee"); mismatch.status != http.StatusUnprocessableEntity ||
		mismatch.header.Get("Content-Type") != idemhttp.ContentTypeProblem || !strings.Contains(mismatch.body, "fingerprint-mismatch") || runs.Load() != 2 {
		t.Fatalf("key reused for another body: %d %q after %d runs; want the 422 problem, nothing run", mismatch.status, mismatch.body, runs.Load())
	}
}

// A handler's returned error is rendered by the app's ErrorHandler
// inside the execution, and the rendered error is what is stored and
// replayed: never the empty 200 Fiber's rendering after the chain would
// leave.
func TestFiberReturnedErrorIsStoredRendered(t *testing.T) {
	var runs atomic.Int64
	base := serve(t, idemfiber.Config{}, func(c fiber.Ctx) error {
		runs.Add(1)
		return fiber.NewError(http.StatusConflict, "cart "+c.Params("cart")+" is closed")
	})
	first := post(t, base, "/orders/c1", "alice", "k1", "tea")
	again := post(t, base, "/orders/c1", "alice", "k1", "tea")
	for i, a := range []answer{first, again} {
		if a.status != http.StatusConflict || a.body != "cart c1 is closed" {
			t.Fatalf("answer %d: %d %q; want 409 cart c1 is closed", i, a.status, a.body)
		}
	}
	if again.header.Get(idemhttp.HeaderReplayed) != "true" || runs.Load() != 1 {
		t.Fatalf("replayed %q after %d runs; want a replay of one run", again.header.Get(idemhttp.HeaderReplayed), runs.Load())
	}
}

// Malformed keys, a missing tenant and a required key get idemhttp's
// problems, and nothing runs.
func TestFiberRefusals(t *testing.T) {
	var runs atomic.Int64
	base := serve(t, idemfiber.Config{RequireKey: true}, func(c fiber.Ctx) error { runs.Add(1); return c.SendString("ok") })
	for _, tc := range []struct {
		key    string
		status int
		slug   string
	}{
		{"", http.StatusBadRequest, "key-required"},
		{"two,keys", http.StatusBadRequest, "invalid-key"},
		{strings.Repeat("k", 256), http.StatusBadRequest, "invalid-key"},
	} {
		a := post(t, base, "/orders/c1", "alice", tc.key, "tea")
		if a.status != tc.status || !strings.Contains(a.body, idemhttp.ProblemTypeBase+tc.slug) || a.header.Get("Content-Type") != idemhttp.ContentTypeProblem {
			t.Errorf("key %q: %d %q; want %d %s", tc.key, a.status, a.body, tc.status, tc.slug)
		}
	}
	if runs.Load() != 0 {
		t.Fatalf("handler ran %d times for refused requests", runs.Load())
	}
}

// New refuses no tenant rule and two.
func TestFiberConfig(t *testing.T) {
	engine, _ := idem.NewEngine(idemmem.NewStore(nil), nil)
	defer engine.Close(t.Context())
	if _, err := idemfiber.New(engine, nil); err == nil {
		t.Error("New accepted no tenant rule")
	}
	if _, err := idemfiber.New(engine, &idemfiber.Config{TenantFunc: tenant, SharedKeySpace: true}); err == nil {
		t.Error("New accepted two tenant rules")
	}
	if _, err := idemfiber.New(engine, &idemfiber.Config{SharedKeySpace: true, ReplayHeaders: []string{"Set-Cookie"}}); err == nil {
		t.Error("New accepted Set-Cookie as a replayed header")
	}
}
