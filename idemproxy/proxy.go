package idemproxy

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
)

// DefaultUpstreamTimeout is Config.UpstreamTimeout's default.
const DefaultUpstreamTimeout = 30 * time.Second

// Config configures a Proxy. Upstream and a tenant rule
// (Middleware.TenantFunc or Middleware.SharedKeySpace) are required.
type Config struct {
	// Upstream is the service the proxy forwards to, such as
	// http://127.0.0.1:8080. Its path, when it has one, prefixes the
	// request's (httputil.ProxyRequest.SetURL).
	Upstream *url.URL

	// Middleware configures the idempotency middleware the protected
	// requests go through (tenant rule, RequireKey, WaitInFlight, body
	// limits, ReleaseOn5xx, …), as for idemhttp.NewMiddleware. Its
	// Methods are set from Routes when Routes is not empty.
	Middleware idemhttp.Config

	// Routes are the protected requests, as http.ServeMux patterns with a
	// method: "POST /orders", "POST /payments/{id}/capture". Every other
	// request is forwarded unprotected. Defaults to Middleware.Methods
	// (POST and PATCH) on every path.
	Routes []string

	// UpstreamTimeout bounds the wait for the upstream's answer (its
	// status and headers) once the request was sent; past it the outcome
	// is unknown (see the package documentation). Defaults to 30s. Keep
	// it under the engine's lease plus what the heartbeat extends it by:
	// the key is held while the upstream works.
	UpstreamTimeout time.Duration

	// Transport sends the requests upstream. Defaults to a clone of
	// http.DefaultTransport keeping up to 1024 idle connections to the
	// upstream, with UpstreamTimeout as its ResponseHeaderTimeout.
	Transport http.RoundTripper

	// BufferOnly refuses an answer that cannot be stored whole (larger
	// than Middleware.MaxResponseBody), as idemhttp does: the client gets
	// 500 response-too-large and the key is released. Defaults to false:
	// such an answer, and every text/event-stream answer, is passed
	// through unstored and the key kept (see the package documentation).
	BufferOnly bool
}

// Proxy is an http.Handler that forwards requests to an upstream, running
// the protected ones through the idempotency middleware. Build it with
// New; it is safe for concurrent use.
type Proxy struct {
	mux        *http.ServeMux
	rp         *httputil.ReverseProxy // the protected requests'
	plain      *httputil.ReverseProxy // the others'
	limit      int64
	bufferOnly bool
	logger     *slog.Logger
	retryAfter string // for upstream-unreachable
	leaseAfter string // for upstream-outcome-unknown: the lease, in seconds
}

// New returns a proxy in front of config.Upstream over engine, or an
// error when the configuration is unusable (no upstream, no tenant rule, a
// route that is no method-and-path pattern).
func New(engine *idem.Engine, config *Config) (*Proxy, error) {
	if config == nil || config.Upstream == nil {
		return nil, errors.New("idemproxy: Config.Upstream is required")
	}
	cfg := *config
	u := cfg.Upstream
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("idemproxy: Config.Upstream must be an http:// or https:// URL with a host, got %q", u.Redacted())
	}
	mcfg := cfg.Middleware
	if mcfg.Logger == nil {
		mcfg.Logger = slog.Default()
	}
	if mcfg.MaxResponseBody <= 0 {
		mcfg.MaxResponseBody = idemhttp.DefaultMaxResponseBody
	}
	routes := make([]string, 0, len(cfg.Routes))
	var methods []string
	for _, r := range cfg.Routes {
		r = strings.TrimSpace(r)
		method, path, ok := strings.Cut(r, " ")
		path = strings.TrimSpace(path)
		if !ok || method == "" || !strings.HasPrefix(path, "/") || method != strings.ToUpper(method) {
			return nil, fmt.Errorf("idemproxy: route %q is not \"METHOD /path\"", r)
		}
		if !slices.Contains(methods, method) {
			methods = append(methods, method)
		}
		routes = append(routes, method+" "+path)
	}
	if len(routes) > 0 {
		mcfg.Methods = methods
	}
	mw, err := idemhttp.NewMiddleware(engine, &mcfg)
	if err != nil {
		return nil, err
	}
	timeout := cfg.UpstreamTimeout
	if timeout <= 0 {
		timeout = DefaultUpstreamTimeout
	}
	transport := cfg.Transport
	if transport == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		// A proxy sends every request to one host: net/http's default of
		// 2 idle connections per host would open a connection per
		// request under load, and leave it in TIME_WAIT.
		t.MaxIdleConns, t.MaxIdleConnsPerHost = 1024, 1024
		t.ResponseHeaderTimeout = timeout
		transport = t
	}
	p := &Proxy{
		limit:      mcfg.MaxResponseBody,
		bufferOnly: cfg.BufferOnly,
		logger:     mcfg.Logger,
		retryAfter: strconv.Itoa(seconds(mcfg.RetryAfter, idemhttp.DefaultRetryAfter)),
		leaseAfter: strconv.Itoa(seconds(engine.Config().Lease, idem.DefaultLease)),
	}
	keyHeader := http.CanonicalHeaderKey(cmp.Or(mcfg.KeyHeader, idemhttp.HeaderKey))
	errorLog := slog.NewLogLogger(mcfg.Logger.Handler(), slog.LevelWarn)
	rewrite := func(pr *httputil.ProxyRequest) {
		pr.SetURL(u)
		pr.SetXForwarded()
		// SetURL sets the upstream's host; keep the one the client
		// asked for, as a reverse proxy in front of a virtual host does
		// (X-Forwarded-Host says it too).
		pr.Out.Host = pr.In.Host
		// ReverseProxy drops the headers a client names in Connection,
		// as hop-by-hop. The key is not this hop's alone: the proxy
		// acted on it, and the upstream may deduplicate with it too.
		if vs := pr.In.Header.Values(keyHeader); len(vs) > 0 && len(pr.Out.Header.Values(keyHeader)) == 0 {
			pr.Out.Header[keyHeader] = slices.Clone(vs)
		}
	}
	p.plain = &httputil.ReverseProxy{Rewrite: rewrite, Transport: transport, ErrorLog: errorLog, BufferPool: copyBuffers{}}
	p.rp = &httputil.ReverseProxy{
		Rewrite:        rewrite,
		Transport:      transport,
		ErrorLog:       errorLog,
		BufferPool:     copyBuffers{},
		ModifyResponse: p.modifyResponse,
		ErrorHandler:   p.errorHandler,
	}
	protected := p.protect(mw.Handler(http.HandlerFunc(p.serveProtected)))
	p.mux = http.NewServeMux()
	if len(routes) == 0 {
		p.mux.Handle("/", protected)
		return p, nil
	}
	if err := p.handleRoutes(routes, protected); err != nil {
		return nil, err
	}
	return p, nil
}

// handleRoutes registers the protected routes, and every other request
// as unprotected; ServeMux panics on a pattern it refuses.
func (p *Proxy) handleRoutes(routes []string, protected http.Handler) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("idemproxy: Config.Routes: %v", v)
		}
	}()
	for _, r := range routes {
		p.mux.Handle(r, protected)
	}
	p.mux.Handle("/", p.plain)
	return nil
}

// seconds rounds d (def when not positive) up to whole seconds, at least 1.
func seconds(d, def time.Duration) int {
	if d <= 0 {
		d = def
	}
	return max(int((d+time.Second-1)/time.Second), 1)
}

// ServeHTTP implements http.Handler.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.mux.ServeHTTP(w, r)
}

// state is what the parts of one protected request tell each other: the
// writer in front of the middleware, and the handler behind it.
type state struct {
	outer *outerWriter
	// sent: the request's headers were written to the upstream, so it
	// may have run.
	sent atomic.Bool
	// bodyErr: reading the upstream's answer failed midway.
	bodyErr atomic.Bool
	// passed: the answer went to the client unbuffered; what the
	// middleware sends after it is dropped.
	passed atomic.Bool
	// override, when set, replaces the problem the middleware answers
	// (the engine's error after OutcomeUnknown) by the proxy's own.
	override atomic.Pointer[problem]
	// pw is the protected request's writer, for modifyResponse.
	pw atomic.Pointer[passWriter]
}

type stateKey struct{}

// protect puts a state in the request's context and a writer in front of
// the middleware that obeys it.
func (p *Proxy) protect(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		st := &state{}
		st.outer = &outerWriter{w: w, st: st, leaseAfter: p.leaseAfter}
		next.ServeHTTP(st.outer, r.WithContext(context.WithValue(r.Context(), stateKey{}, st)))
	})
}

// serveProtected is the handler behind the middleware: it forwards the
// request, and decides what becomes of its key when the upstream does not
// answer whole.
func (p *Proxy) serveProtected(w http.ResponseWriter, r *http.Request) {
	st, _ := r.Context().Value(stateKey{}).(*state)
	if _, ok := idem.ExecutionFromContext(r.Context()); !ok || st == nil {
		// No key (and none required): forwarded as any request.
		p.plain.ServeHTTP(w, r)
		return
	}
	pw := &passWriter{rec: w, st: st, limit: p.limit, passMode: !p.bufferOnly}
	st.pw.Store(pw)
	ctx := httptrace.WithClientTrace(r.Context(), &httptrace.ClientTrace{
		WroteHeaders: func() { st.sent.Store(true) },
	})
	func() {
		defer func() {
			v := recover()
			if v == nil {
				return
			}
			if v != http.ErrAbortHandler {
				panic(v)
			}
			// ReverseProxy aborts when copying the answer failed.
			switch {
			case st.bodyErr.Load():
				// The upstream's answer broke off: it may have run.
				idem.OutcomeUnknown(r.Context(), errors.New("idemproxy: the upstream's answer broke off"))
				if st.passed.Load() {
					panic(v) // the client has part of it: break its answer too
				}
				st.override.Store(problemUnknownLost)
			case pw.recErr != nil:
				// The middleware refused the answer (too large to store,
				// in BufferOnly): it answers that itself.
			case st.passed.Load():
				// The client went away during an answer passed through:
				// the operation ran, the marker is stored below.
			default:
				panic(v)
			}
		}()
		p.rp.ServeHTTP(pw, r.WithContext(ctx))
	}()
	pw.finish()
}

// modifyResponse decides, once the upstream's headers are in, whether the
// answer is passed through at once, and watches its body for a break.
func (p *Proxy) modifyResponse(resp *http.Response) error {
	st, _ := resp.Request.Context().Value(stateKey{}).(*state)
	if st == nil {
		return nil
	}
	resp.Body = &watchedBody{ReadCloser: resp.Body, st: st}
	if pw := st.pw.Load(); pw != nil && pw.passMode {
		mediaType, _, _ := strings.Cut(resp.Header.Get("Content-Type"), ";")
		if resp.ContentLength > p.limit || strings.EqualFold(strings.TrimSpace(mediaType), "text/event-stream") {
			pw.passNow = true
		}
	}
	return nil
}

// errorHandler answers a request the upstream did not answer: released
// when it was never sent, kept in flight when it may have run.
func (p *Proxy) errorHandler(w http.ResponseWriter, r *http.Request, err error) {
	st, _ := r.Context().Value(stateKey{}).(*state)
	if st == nil {
		w.WriteHeader(http.StatusBadGateway)
		return
	}
	if !st.sent.Load() {
		// Nothing reached the upstream: nothing ran.
		p.logger.WarnContext(r.Context(), "idemproxy: upstream unreachable; key released", slog.Any("error", err))
		idem.NotExecuted(r.Context())
		writeProblem(w, problemUnreachable, p.retryAfter)
		return
	}
	p.logger.WarnContext(r.Context(), "idemproxy: the upstream did not answer a request it was sent; its outcome is unknown, the key stays in flight until its lease ends",
		slog.Any("error", err))
	idem.OutcomeUnknown(r.Context(), err)
	pr := problemUnknownLost
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, context.DeadlineExceeded) {
		pr = problemUnknownTimeout
	}
	st.override.Store(pr)
}

// copyBuffers is the ReverseProxies' httputil.BufferPool. Without one,
// ReverseProxy allocates a 32 KiB buffer to copy each answer: most of
// what a proxied request allocates, for answers mostly far smaller.
type copyBuffers struct{}

var copyBufferPool = sync.Pool{New: func() any { return new([32 << 10]byte) }}

func (copyBuffers) Get() []byte { return copyBufferPool.Get().(*[32 << 10]byte)[:] }

func (copyBuffers) Put(b []byte) {
	if len(b) == 32<<10 {
		copyBufferPool.Put((*[32 << 10]byte)(b))
	}
}

// watchedBody notes a failed read of the upstream's answer.
type watchedBody struct {
	io.ReadCloser
	st *state
}

func (b *watchedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && !errors.Is(err, io.EOF) {
		b.st.bodyErr.Store(true)
	}
	return n, err
}
