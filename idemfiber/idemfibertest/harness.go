// Package idemfibertest runs the front-end conformance suite
// (idemfronttest) against idemfiber, over a real fiber.App served on a
// loopback listener:
//
//	func TestConformance(t *testing.T) {
//		idemfronttest.Exercise(t, idemfibertest.Harness{}, idemfibertest.Features, nil)
//	}
package idemfibertest

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/gofiber/fiber/v3"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemfiber"
	"github.com/idem-go/idem/idemfronttest"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemhttp/idemhttptest"
)

// Features are what idemfiber cannot do: fasthttp tells a handler
// nothing of its client going away, so the Disconnect cases, which wait
// for the server to see the caller go, cannot run (the handler always
// runs on, which is what they check of a front end that can cancel).
var Features = idemfronttest.Features{NoDisconnect: true}

// Harness is idemfronttest.Harness for idemfiber.
type Harness struct {
	// Config is the middleware's base configuration. Serve sets
	// TenantFunc (the tenant the suite's call names), WaitInFlight and
	// the limits from the suite's Options, and Logger to one that
	// discards when it is nil.
	Config idemfiber.Config
}

// headerTenant carries the suite's tenant, percent-encoded so that any
// byte reaches the tenant rule.
const headerTenant = "X-Idemfronttest-Tenant"

// The statuses the protected handler answers with, those
// idemhttptest.Decode reads back: 201 an answer, 400 a refusal, 429 a
// transient failure (never stored).
const (
	statusAnswer    = http.StatusCreated
	statusRejected  = http.StatusBadRequest
	statusTransient = http.StatusTooManyRequests
)

// Serve implements idemfronttest.Harness.
func (h Harness) Serve(t *testing.T, engine *idem.Engine, opts idemfronttest.Options, handler idemfronttest.Handler) idemfronttest.Client {
	t.Helper()
	cfg := h.Config
	cfg.TenantFunc = func(c fiber.Ctx) (string, error) {
		v := c.Get(headerTenant)
		if v == "" {
			return "", errors.New("idemfibertest: no tenant")
		}
		return url.PathUnescape(v)
	}
	cfg.SharedKeySpace = false
	cfg.WaitInFlight = opts.WaitInFlight
	if opts.MaxRequestBody > 0 {
		cfg.MaxRequestBody = opts.MaxRequestBody
	}
	if opts.MaxResponseBody > 0 {
		cfg.MaxResponseBody = opts.MaxResponseBody
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	mw, err := idemfiber.New(engine, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	app := fiber.New()
	app.Post("/orders", mw, func(c fiber.Ctx) error {
		// Copied: fasthttp reuses the request's buffer once the handler
		// returns, and the suite's handler may keep what it is given.
		resp := handler(c.Context(), bytes.Clone(c.Body()))
		status := statusAnswer
		switch {
		case resp.Transient:
			status = statusTransient
		case resp.Rejected:
			status = statusRejected
		}
		c.Set(fiber.HeaderContentType, "application/octet-stream")
		return c.Status(status).Send(resp.Body)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- app.Listener(ln, fiber.ListenConfig{DisableStartupMessage: true}) }()
	t.Cleanup(func() {
		// Bounded: fasthttp's Shutdown waits for every open connection,
		// and a kept-alive one of the test's client may stay idle past
		// the end of the case; the listener is closed either way.
		if err := app.ShutdownWithTimeout(5 * time.Second); err != nil && !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("fiber Shutdown: %v", err)
		}
		// Closed too: a Shutdown that came before the server started
		// serving (a case skipped at once) does not stop it.
		_ = ln.Close()
		<-done
	})
	return &client{url: "http://" + ln.Addr().String() + "/orders", http: &http.Client{Transport: &http.Transport{}}}
}

type client struct {
	url  string
	http *http.Client
}

// Send implements idemfronttest.Client.
func (c *client) Send(ctx context.Context, call idemfronttest.Call) (idemfronttest.Reply, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url, bytes.NewReader(call.Body))
	if err != nil {
		return idemfronttest.Reply{}, err
	}
	req.Header.Set(headerTenant, url.PathEscape(call.Tenant))
	if call.Key != "" {
		req.Header.Set(idemhttp.HeaderKey, call.Key)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return idemfronttest.Reply{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return idemfronttest.Reply{}, err
	}
	return idemhttptest.Decode(resp, body), nil
}
