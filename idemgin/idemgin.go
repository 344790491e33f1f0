// Package idemgin is idem's middleware for Gin: it makes the POST and
// PATCH requests of a gin.Engine that carry an Idempotency-Key safe to
// retry, with the contract of idemhttp (it runs idemhttp's middleware):
// one execution per key, replays byte for byte marked
// Idempotent-Replayed: true, problem+json answers for a key in flight, a
// key reused for another request, a store down, and the handler's
// database transaction committed with its answer.
//
//	r := gin.New()
//	mw, err := idemgin.New(engine, &idemgin.Config{
//		TenantFunc: func(c *gin.Context) (string, error) { return c.GetString("user"), nil },
//	})
//	r.POST("/orders", authenticate, mw, createOrder)
//
// # How it sits in Gin's chain
//
// Gin has no way to wrap a net/http middleware around the rest of a
// chain, so the middleware runs the rest of the chain itself
// (gin.Context.Next) inside the engine's execution, with c.Writer
// replaced by a gin.ResponseWriter over the recorder that stores the
// answer, and c.Request by the request the engine runs it with. The
// handlers after it therefore answer through Gin as they always do
// (c.JSON, c.String, c.Status), and what they answer is what is stored.
// The handlers before it (authentication, rate limits) are not covered:
// what they refuse is never stored.
//
// # Transactions
//
// The handler's context is c.Request.Context(): it carries the store's
// transaction (idemsql.TxFromContext(c.Request.Context()),
// idempg.TxFromContext(c.Request.Context())). A gin.Context used as a
// context.Context reaches it too when the engine has
// gin.Engine.ContextWithFallback set; without it, use c.Request.Context().
package idemgin

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"

	"github.com/gin-gonic/gin"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
)

// Config configures the middleware. The zero value of every field means
// its documented default.
type Config struct {
	// HTTP is the configuration of the net/http middleware run underneath
	// (idemhttp.Config): methods, key rules, limits, replayed headers,
	// wait mode, storage mode, …, with idemhttp's defaults. Its RouteFunc
	// defaults here to the Gin route's pattern (gin.Context.FullPath), so
	// that the engine's tracer names "/orders/:id", never a raw path.
	HTTP idemhttp.Config

	// TenantFunc names the owner of the request's key space from what
	// Gin knows of the caller (what the authentication in front left in
	// the gin.Context), as idemhttp.Config.TenantFunc does from the
	// request. Set one of the two (or HTTP.SharedKeySpace), not both.
	TenantFunc func(c *gin.Context) (string, error)
}

// New returns the middleware over engine. It refuses a configuration
// idemhttp.NewMiddleware refuses, and one naming two tenant rules.
func New(engine *idem.Engine, config *Config) (gin.HandlerFunc, error) {
	var cfg Config
	if config != nil {
		cfg = *config
	}
	h := cfg.HTTP
	if cfg.TenantFunc != nil {
		if h.TenantFunc != nil {
			return nil, errors.New("idemgin: Config.TenantFunc and Config.HTTP.TenantFunc are both set: set one")
		}
		h.TenantFunc = func(r *http.Request) (string, error) { return cfg.TenantFunc(ginContext(r.Context())) }
	}
	if h.RouteFunc == nil {
		h.RouteFunc = func(r *http.Request) string {
			if c := ginContext(r.Context()); c != nil {
				return c.FullPath()
			}
			return ""
		}
	}
	m, err := idemhttp.NewMiddleware(engine, &h)
	if err != nil {
		return nil, errors.New("idemgin: " + err.Error())
	}
	return func(c *gin.Context) {
		outer, request := c.Writer, c.Request
		ran := false
		next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ran = true
			gw := &writer{w: w, status: http.StatusOK, size: noWritten}
			c.Writer, c.Request = gw, r
			defer func() { c.Writer, c.Request = outer, request }()
			c.Next()
			// As gin.Engine does once its chain returns: a status set
			// with c.Status and no body is the answer too.
			gw.WriteHeaderNow()
		})
		// The gin.Context travels in the request's context for the
		// tenant and route rules; the handlers see their own request.
		r := request.WithContext(context.WithValue(request.Context(), ctxKey{}, c))
		m.Handler(next).ServeHTTP(outer, r)
		if !ran {
			// Answered by the middleware (a replay, a problem): the rest
			// of the chain must not run after it.
			c.Abort()
		}
	}, nil
}

type ctxKey struct{}

func ginContext(ctx context.Context) *gin.Context {
	c, _ := ctx.Value(ctxKey{}).(*gin.Context)
	return c
}

// noWritten is the size of a response whose header is not written yet.
const noWritten = -1

// writer is the gin.ResponseWriter of the handlers behind the middleware,
// over the recorder (w). It keeps the status until the first write, as
// Gin's own does, so that c.Status followed by headers set by a renderer
// sends those headers.
type writer struct {
	w      http.ResponseWriter
	status int
	size   int
}

var _ gin.ResponseWriter = (*writer)(nil)

// Header implements http.ResponseWriter.
func (w *writer) Header() http.Header { return w.w.Header() }

// WriteHeader keeps code for the first write; once the header is
// written, it is ignored, as Gin's writer does.
func (w *writer) WriteHeader(code int) {
	if code > 0 && !w.Written() {
		w.status = code
	}
}

// WriteHeaderNow implements gin.ResponseWriter.
func (w *writer) WriteHeaderNow() {
	if !w.Written() {
		w.size = 0
		w.w.WriteHeader(w.status)
	}
}

// Write implements http.ResponseWriter; it returns the recorder's errors
// (idemhttp.ErrResponseTooLarge past the limit).
func (w *writer) Write(b []byte) (int, error) {
	w.WriteHeaderNow()
	n, err := w.w.Write(b)
	w.size += n
	return n, err
}

// WriteString implements gin.ResponseWriter.
func (w *writer) WriteString(s string) (int, error) {
	w.WriteHeaderNow()
	n, err := io.WriteString(w.w, s)
	w.size += n
	return n, err
}

// Status implements gin.ResponseWriter.
func (w *writer) Status() int { return w.status }

// Size implements gin.ResponseWriter.
func (w *writer) Size() int { return w.size }

// Written implements gin.ResponseWriter.
func (w *writer) Written() bool { return w.size != noWritten }

// Flush writes the header; the body is buffered until the answer is
// stored, so nothing reaches the client before.
func (w *writer) Flush() { w.WriteHeaderNow() }

// Hijack returns idemhttp.ErrHijack: a hijacked connection bypasses the
// answer, and nothing could be stored for the retries.
func (w *writer) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return nil, nil, idemhttp.ErrHijack
}

// CloseNotify returns a channel that is never closed: the handler runs
// on when its client goes away (idemhttp.Config.CancelOnDisconnect says
// otherwise, through the request's context). gin.ResponseWriter
// requires it.
func (w *writer) CloseNotify() <-chan bool { return make(chan bool) }

// Pusher returns nil: a pushed resource would not be replayed.
func (w *writer) Pusher() http.Pusher { return nil }

// Unwrap returns the recorder, for http.ResponseController.
func (w *writer) Unwrap() http.ResponseWriter { return w.w }
