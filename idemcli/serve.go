package idemcli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemredis"
)

// Defaults of ServeOpts.
const (
	DefaultAddr          = "127.0.0.1:3000"
	DefaultPurgeInterval = time.Minute
)

// shutdownGrace bounds how long a shutdown waits for requests in progress
// (plus --handler-delay); past it their contexts are cancelled, so their
// transactions roll back and their keys are released. A variable for the
// test of that path.
var shutdownGrace = 10 * time.Second

// ServeOpts are the options of Serve.
type ServeOpts struct {
	// Addr is the TCP address to listen on. Port 0 picks a free port; the
	// "listening" log line tells which.
	Addr string
	// DB holds the orders and, unless Keys is set, the idempotency
	// records: sqlite:PATH, postgres://… or mysql://….
	DB string
	// Keys, when set to a redis:// URL, keeps the idempotency records in
	// Redis instead of DB. The order and the record then commit
	// separately.
	Keys string
	// Lease is how long a claim holds a key before a retry may take it
	// over (idem.Config.Lease).
	Lease time.Duration
	// Retention is how long a key is remembered (idem.Config.Retention).
	Retention time.Duration
	// RequireKey answers 400 to a POST without Idempotency-Key.
	RequireKey bool
	// HandlerDelay is slept by POST /orders inside its transaction, before
	// the order is written, to make the in-flight window visible.
	HandlerDelay time.Duration
	// PurgeInterval is the pause between two passes of the janitor that
	// deletes expired records. Zero turns it off.
	PurgeInterval time.Duration
}

// Serve runs the seed's orders API behind the idempotency middleware until
// its context ends.
type Serve struct {
	CommandBase
}

const serveHelp = `Usage: idem serve [flags]

Runs the orders API of the idempotency article behind the idem middleware:

  POST /orders        {"cart_id":"c_42","total_cents":1900} -> 201 and the order
  GET  /orders?cart_id=c_42   that tenant's orders for the cart (JSON array)
  GET  /orders/{id}           one order, or 404

A POST with an Idempotency-Key header runs once: the order and the stored
answer commit in one transaction; a retry gets the same answer back with
Idempotent-Replayed: true, a retry during the first run gets 409, and the
same key with another body gets 422.

The tenant is the <name> of "Authorization: Bearer <name>", or "default"
without the header; keys and orders are per tenant. The orders table
(idem_demo_orders) and the idempotency records table are created at start.
Logs go to stderr; SIGINT or SIGTERM stops the server cleanly.
`

func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	opts := ServeOpts{}
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.StringVar(&opts.Addr, "addr", DefaultAddr, "listen on `host:port` (port 0 picks a free one)")
	fs.StringVar(&opts.DB, "db", DefaultDB, dbFlagHelp)
	fs.StringVar(&opts.Keys, "keys", "", "keep the idempotency records in Redis at this redis:// `URL` instead of --db;\nweaker: the order and its record no longer commit in one transaction")
	durationVar(fs, &opts.Lease, "lease", idem.DefaultLease, "how long a running request holds its key before a retry may take it over")
	durationVar(fs, &opts.Retention, "retention", idem.DefaultRetention, "how long a key is remembered and its answer replayed (never less than --lease)")
	fs.BoolVar(&opts.RequireKey, "require-key", false, "answer 400 to a POST without Idempotency-Key")
	durationVar(fs, &opts.HandlerDelay, "handler-delay", 0, "sleep this long inside the transaction of POST /orders, to make the in-flight window visible")
	durationVar(fs, &opts.PurgeInterval, "purge-interval", DefaultPurgeInterval, "delete expired records this often; 0 turns the janitor off (Redis, with --keys, expires them itself)")
	if err := parseFlags(fs, serveHelp, args, stdout); err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(stderr, nil))
	return (&Serve{CommandBase{Stdout: stdout, Logger: logger}}).Run(ctx, &opts)
}

// minInterval is the shortest --lease and --purge-interval: shorter ones
// turn the heartbeat or the janitor into a loop against the database.
const minInterval = 10 * time.Millisecond

func (o *ServeOpts) check() error {
	switch {
	case o.Lease <= 0:
		return usagef("--lease must be positive, got %s", o.Lease)
	case o.Lease < minInterval:
		// The heartbeat extends a running request's lease every third of
		// it: a round trip to the database per millisecond or so.
		return usagef("--lease must be at least %s, got %s", minInterval, o.Lease)
	case o.Retention <= 0:
		return usagef("--retention must be positive, got %s", o.Retention)
	case o.HandlerDelay < 0:
		return usagef("--handler-delay must not be negative, got %s", o.HandlerDelay)
	case o.PurgeInterval < 0:
		return usagef("--purge-interval must not be negative, got %s", o.PurgeInterval)
	case o.PurgeInterval > 0 && o.PurgeInterval < minInterval:
		return usagef("--purge-interval must be 0 (off) or at least %s, got %s", minInterval, o.PurgeInterval)
	}
	if o.Keys != "" {
		if _, err := parseRedisURL(o.Keys); err != nil {
			return err
		}
	}
	return nil
}

// server is a running demo before it listens: what Run and the tests
// build on.
type server struct {
	conn    *conn
	store   idem.Store
	app     *ordersApp
	handler http.Handler
}

// newServer opens the databases, creates the tables and builds the handler
// stack: request log, then authentication (the tenant), then idempotency,
// then the orders API. Authentication sits in front of idempotency so that
// a 401 is never stored.
func newServer(ctx context.Context, opts *ServeOpts, logger *slog.Logger) (*server, error) {
	if err := opts.check(); err != nil {
		return nil, err
	}
	c, err := openDB(ctx, opts.DB, openOptions{})
	if err != nil {
		return nil, err
	}
	s, err := buildServer(ctx, c, opts, logger)
	if err != nil {
		c.Close() //nolint:errcheck // the build error is the one to report
		return nil, err
	}
	return s, nil
}

func buildServer(ctx context.Context, c *conn, opts *ServeOpts, logger *slog.Logger) (*server, error) {
	orders := c.orderRepo()
	if err := orders.migrate(ctx); err != nil {
		return nil, err
	}
	var store idem.Store
	if opts.Keys != "" {
		rs, err := c.useRedis(ctx, opts.Keys, &idemredis.Config{Logger: logger})
		if err != nil {
			return nil, err
		}
		store = rs
		logger.Warn("idempotency records in Redis, orders in --db: they no longer commit in one transaction; a crash between the two may let a retry create a second order once the lease ends")
	} else {
		if err := c.migrateKeys(ctx); err != nil {
			return nil, fmt.Errorf("migrate the idempotency records table: %w", err)
		}
		store = c.keyStore()
	}
	engine, err := idem.NewEngine(store, &idem.Config{
		Lease:     opts.Lease,
		Retention: opts.Retention,
		Logger:    logger,
	})
	if err != nil {
		return nil, err
	}
	mw, err := idemhttp.New(idemhttp.Config{
		Engine:     engine,
		RequireKey: opts.RequireKey,
		// withTenant, in front, has already refused malformed credentials.
		TenantFunc: func(r *http.Request) (string, error) { return tenantFrom(r.Context()), nil },
		Logger:     logger,
	})
	if err != nil {
		return nil, err
	}
	app := &ordersApp{repo: orders, delay: opts.HandlerDelay, logger: logger, now: time.Now}
	return &server{
		conn:    c,
		store:   store,
		app:     app,
		handler: logRequests(logger, withTenant(mw.Handler(app.routes()))),
	}, nil
}

// forcedStopWait bounds the wait for cancelled handlers to roll back and
// release their keys (the engine's own release timeout is 5s).
const forcedStopWait = 10 * time.Second

// errForcedStop is Run's error when requests outlived the grace period and
// were cancelled: their clients got no answer (their retries run them
// again), so the stop was not clean.
var errForcedStop = errors.New("requests still running after the grace period were cancelled (their keys released for retries)")

// Run serves until ctx ends, then stops accepting connections and waits
// for the requests in progress. It returns nil after a clean shutdown, and
// an error when requests had to be cancelled.
func (c *Serve) Run(ctx context.Context, opts *ServeOpts) error {
	logger := c.logger()
	s, err := newServer(ctx, opts, logger)
	if err != nil {
		return err
	}
	defer s.conn.Close() //nolint:errcheck // nothing left to do with a close error at exit

	s.handler = withFaults(s.handler, logger) // test-only crash injection (faults.go): returns s.handler itself unless IDEM_FAULT is set
	ln, err := net.Listen("tcp", opts.Addr)
	if err != nil {
		return err
	}
	// Counts the handlers running, so that a forced stop can wait for
	// them to roll back and release their keys before the connections to
	// the database close under them.
	var running sync.WaitGroup
	handler := s.handler
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			running.Add(1)
			defer running.Done()
			handler.ServeHTTP(w, r)
		}),
		ReadHeaderTimeout: 10 * time.Second, // a client that never finishes its headers holds nothing
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}

	janitorDone := make(chan struct{})
	jctx, stopJanitor := context.WithCancel(ctx)
	defer stopJanitor()
	// Redis expires its records by TTL: no janitor there.
	if opts.PurgeInterval > 0 && opts.Keys == "" {
		j := idem.NewJanitor(s.store, &idem.JanitorConfig{Interval: opts.PurgeInterval, Logger: logger})
		go func() {
			defer close(janitorDone)
			j.Run(jctx) //nolint:errcheck // Run returns nil when its context ends
		}()
	} else {
		close(janitorDone)
	}

	keys := s.conn.target.describe()
	if opts.Keys != "" {
		keys = "redis"
	}
	logger.Info("listening", slog.String("addr", ln.Addr().String()), slog.String("db", s.conn.target.describe()),
		slog.String("keys", keys), slog.Duration("lease", opts.Lease), slog.Duration("retention", opts.Retention),
		slog.Bool("require_key", opts.RequireKey), slog.Duration("handler_delay", opts.HandlerDelay))

	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		// Serve only returns early on a listener failure.
		stopJanitor()
		<-janitorDone
		return err
	case <-ctx.Done():
	}

	logger.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownGrace+opts.HandlerDelay)
	defer cancel()
	err = srv.Shutdown(sctx)
	if errors.Is(err, context.DeadlineExceeded) {
		// Cancel what still runs: the engine rolls it back and releases
		// its keys, so retries run it again elsewhere. Close does not wait
		// for the handlers; they must finish before the database handle
		// closes, or the releases fail and the keys stay locked for a
		// whole lease.
		logger.Warn("requests still running after the grace period; cancelling them")
		err = errors.Join(errForcedStop, srv.Close())
		finished := make(chan struct{})
		go func() { running.Wait(); close(finished) }()
		select {
		case <-finished:
		case <-time.After(forcedStopWait):
			logger.Error("handlers still running after their cancellation; their keys stay locked until their leases end")
		}
	}
	if serr := <-served; serr != nil && !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	stopJanitor()
	<-janitorDone
	if err == nil {
		logger.Info("stopped")
	}
	return err
}

// logRequests logs one line per request: what a demo's reader wants to
// see (status, replayed or not, the key).
func logRequests(logger *slog.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		next.ServeHTTP(sw, r)
		attrs := []slog.Attr{
			slog.String("method", r.Method),
			slog.String("path", r.URL.RequestURI()),
			slog.Int("status", sw.code()),
			slog.Duration("took", time.Since(start)),
		}
		if key := r.Header.Get(idemhttp.HeaderKey); key != "" {
			attrs = append(attrs, slog.String("key", key))
		}
		if w.Header().Get(idemhttp.HeaderReplayed) == "true" {
			attrs = append(attrs, slog.Bool("replayed", true))
		}
		logger.LogAttrs(r.Context(), slog.LevelInfo, "request", attrs...)
	})
}

// statusWriter remembers the status sent through it.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(p)
}

func (w *statusWriter) code() int {
	if w.status == 0 {
		return http.StatusOK
	}
	return w.status
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
