// Package idemecho is idem's middleware for Echo (v4): it makes the POST
// and PATCH requests of an echo.Echo that carry an Idempotency-Key safe
// to retry, with the contract of idemhttp (it runs idemhttp's
// middleware): one execution per key, replays byte for byte marked
// Idempotent-Replayed: true, problem+json answers for a key in flight, a
// key reused for another request, a store down, and the handler's
// database transaction committed with its answer.
//
//	e := echo.New()
//	e.POST("/orders", createOrder, authenticate, idemecho.IdempotencyWithConfig(idemecho.IdempotencyConfig{
//		Engine:     engine,
//		TenantFunc: func(c echo.Context) (string, error) { return c.Get("user").(string), nil },
//	}))
//
// # Errors a handler returns
//
// Echo renders the error a handler returns (echo.NewHTTPError, any
// error) only once the whole chain has returned, in its HTTPErrorHandler.
// Wrapped around the handler with echo.WrapMiddleware, a net/http
// middleware would therefore see nothing written and store an empty 200
// for a handler that failed, and replay it. This middleware renders the
// returned error itself, inside the execution (c.Error, with the Echo's
// HTTPErrorHandler), so that the stored and replayed answer is the
// rendered error: a 400 stays a 400, and a 500's business writes are
// rolled back. The error is not returned up the chain: it has been
// answered.
//
// # Transactions
//
// The handler's context is c.Request().Context(): it carries the store's
// transaction (idemsql.TxFromContext(c.Request().Context()),
// idempg.TxFromContext(c.Request().Context())).
package idemecho

import (
	"context"
	"errors"
	"net/http"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
)

// IdempotencyConfig configures the middleware, in Echo's manner. The
// zero value of every field but Engine means its documented default.
type IdempotencyConfig struct {
	// Skipper defines a function to skip the middleware: a skipped
	// request runs unprotected. Defaults to middleware.DefaultSkipper
	// (none).
	Skipper middleware.Skipper

	// Engine is the idempotency engine. Required.
	Engine *idem.Engine

	// HTTP is the configuration of the net/http middleware run underneath
	// (idemhttp.Config): methods, key rules, limits, replayed headers,
	// wait mode, storage mode, …, with idemhttp's defaults. Its RouteFunc
	// defaults here to the Echo route's pattern (echo.Context.Path), so
	// that the engine's tracer names "/orders/:id", never a raw path.
	HTTP idemhttp.Config

	// TenantFunc names the owner of the request's key space from what
	// Echo knows of the caller (what the authentication in front left in
	// the echo.Context), as idemhttp.Config.TenantFunc does from the
	// request. Set one of the two (or HTTP.SharedKeySpace), not both.
	TenantFunc func(c echo.Context) (string, error)
}

// IdempotencyWithConfig returns the middleware; it panics on a
// configuration ToMiddleware refuses, as Echo's own middlewares do.
func IdempotencyWithConfig(config IdempotencyConfig) echo.MiddlewareFunc {
	mw, err := config.ToMiddleware()
	if err != nil {
		panic(err)
	}
	return mw
}

// ToMiddleware returns the middleware, or why the configuration cannot
// make one: no engine, two tenant rules, or what idemhttp.NewMiddleware
// refuses.
func (config IdempotencyConfig) ToMiddleware() (echo.MiddlewareFunc, error) {
	if config.Engine == nil {
		return nil, errors.New("idemecho: IdempotencyConfig.Engine is nil")
	}
	skip := config.Skipper
	if skip == nil {
		skip = middleware.DefaultSkipper
	}
	h := config.HTTP
	if config.TenantFunc != nil {
		if h.TenantFunc != nil {
			return nil, errors.New("idemecho: IdempotencyConfig.TenantFunc and IdempotencyConfig.HTTP.TenantFunc are both set: set one")
		}
		h.TenantFunc = func(r *http.Request) (string, error) { return config.TenantFunc(echoContext(r.Context())) }
	}
	if h.RouteFunc == nil {
		h.RouteFunc = func(r *http.Request) string {
			if c := echoContext(r.Context()); c != nil {
				return c.Path()
			}
			return ""
		}
	}
	m, err := idemhttp.NewMiddleware(config.Engine, &h)
	if err != nil {
		return nil, errors.New("idemecho: " + err.Error())
	}
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			if skip(c) {
				return next(c)
			}
			outer, request := c.Response(), c.Request()
			run := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				// The handlers behind see a Response over the recorder,
				// and the request the engine runs them with.
				c.SetResponse(echo.NewResponse(w, c.Echo()))
				c.SetRequest(r)
				defer func() {
					c.SetResponse(outer)
					c.SetRequest(request)
				}()
				if err := next(c); err != nil {
					// Rendered now, into the recorder: what is stored is
					// the error as the client sees it.
					c.Error(err)
				}
			})
			// The echo.Context travels in the request's context for the
			// tenant and route rules; the handlers see their own request.
			r := request.WithContext(context.WithValue(request.Context(), ctxKey{}, c))
			m.Handler(run).ServeHTTP(outer, r)
			return nil
		}
	}, nil
}

type ctxKey struct{}

func echoContext(ctx context.Context) echo.Context {
	c, _ := ctx.Value(ctxKey{}).(echo.Context)
	return c
}
