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
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/demo"
	"github.com/idem-go/idem/idemjanitor"
	"github.com/idem-go/idem/idemprom"
)

// Defaults of serve.
const (
	defaultAddr          = "127.0.0.1:3000"
	defaultPurgeInterval = time.Minute
	defaultReadTimeout   = 30 * time.Second
	defaultIdleTimeout   = 2 * time.Minute
	// handlerBudget is what the default --write-timeout gives a request
	// beyond --read-timeout and --handler-delay: the claim, the order's
	// insert and the commit, with room to spare.
	handlerBudget = 30 * time.Second
	// maxReadHeaderTimeout bounds the wait for a request's headers: a
	// client that never finishes them holds a connection and its buffers
	// for nothing.
	maxReadHeaderTimeout = 10 * time.Second
	// maxHeaderBytes bounds a request's line and headers. The demo reads
	// a key of at most 255 bytes and a Bearer name of at most 128; net/http's
	// default, 1 MB, would let each connection hold a megabyte.
	maxHeaderBytes = 32 << 10
	// minInterval is the shortest --lease, --purge-interval and timeout:
	// shorter ones turn the heartbeat or the janitor into a loop against
	// the database, or close connections before a request can arrive.
	minInterval = 10 * time.Millisecond
)

// shutdownGrace bounds how long a shutdown waits for requests in progress
// (plus --handler-delay); past it their contexts are cancelled, so their
// transactions roll back and their keys are released. A variable for the
// test of that path.
var shutdownGrace = 10 * time.Second

// serveOpts are the settings of `idem serve`, from its flags.
type serveOpts struct {
	// addr is the TCP address to listen on; port 0 picks a free port.
	addr string
	// db holds the orders and, unless keys is set, the records.
	db string
	// keys, a redis:// URL, keeps the records in Redis instead of db.
	keys string
	// lease and retention configure the engine (idem.Config).
	lease, retention time.Duration
	// requireKey answers 400 to a POST without Idempotency-Key.
	requireKey bool
	// handlerDelay is demo.Config.HandlerDelay.
	handlerDelay time.Duration
	// waitInFlight is demo.Config.WaitInFlight.
	waitInFlight time.Duration
	// purgeInterval is the janitor's pause; zero turns it off.
	purgeInterval time.Duration
	// readTimeout bounds the reading of a whole request, body included;
	// writeTimeout the time from the end of its headers to the end of its
	// answer (zero: readTimeout + handlerDelay + waitInFlight +
	// handlerBudget);
	// idleTimeout a kept-alive connection between requests.
	readTimeout, writeTimeout, idleTimeout time.Duration
	// metricsAddr is where GET /metrics listens; "" serves no metrics:
	// never on addr, where every tenant would read the counts of the
	// others' traffic.
	metricsAddr string
	// singleTransaction claims inside the order's transaction
	// (idempg.Config.SingleTransaction).
	singleTransaction bool
	// grpcAddr is where the orders are served over gRPC; "" serves
	// them over Connect on addr only (grpcserve.go).
	grpcAddr string
}

const serveHelp = `Usage: idem serve [flags]

Runs a demo orders API behind the idem middleware:

  POST /orders        {"cart_id":"c_42","total_cents":1900} -> 201 and the order
  GET  /orders?cart_id=c_42   that tenant's orders for the cart (JSON array)
  GET  /orders/{id}           one order, or 404

A POST with an Idempotency-Key header runs once: the order and the stored
answer commit in one transaction; a retry gets the same answer back with
Idempotent-Replayed: true, a retry during the first run gets 409 (or, with
--wait-in-flight, waits for the first run's answer and gets it replayed),
and the same key with another body gets 422. A request refused before it
ran (400, 413, 415) is not stored: the corrected retry with the same key
runs.

The tenant is the <name> of "Authorization: Bearer <name>", or "default"
without the header; keys and orders are per tenant. The orders table
(idem_demo_orders) and the idempotency records table are created at start.
Logs go to stderr; SIGINT or SIGTERM stops the server cleanly.

With --metrics-addr, GET /metrics answers there the Prometheus metrics of
idem (idem_requests_total, idem_store_operation_duration_seconds, …; see
docs/OBSERVABILITY.md) and of the Go runtime. They are never served on
--addr: any client of the API could read every tenant's traffic there.
Keep --metrics-addr on an address only the monitoring can reach.
`

func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	opts := serveOpts{}
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.StringVar(&opts.addr, "addr", defaultAddr, "listen on `host:port` (port 0 picks a free one)")
	fs.StringVar(&opts.db, "db", DefaultDB, dbFlagHelp)
	fs.StringVar(&opts.keys, "keys", "", "keep the idempotency records in Redis at this redis:// `URL` (or in DynamoDB: dynamodb://TABLE?region=…&endpoint=…) instead of --db;\nweaker: the order and its record no longer commit in one transaction")
	durationVar(fs, &opts.lease, "lease", idem.DefaultLease, "how long a running request holds its key before a retry may take it over")
	durationVar(fs, &opts.retention, "retention", idem.DefaultRetention, "how long a key is remembered and its answer replayed (at least --lease)")
	fs.BoolVar(&opts.requireKey, "require-key", false, "answer 400 to a POST without Idempotency-Key")
	durationVar(fs, &opts.handlerDelay, "handler-delay", 0, "sleep this long in POST /orders once its key is claimed, to make the in-flight window visible")
	durationVar(fs, &opts.waitInFlight, "wait-in-flight", 0, "a retry that arrives while its key's first request runs waits this long for that answer,\nreplayed to it, before it gets 409; 0 answers 409 at once")
	durationVar(fs, &opts.purgeInterval, "purge-interval", defaultPurgeInterval, "delete expired records this often; 0 turns the janitor off (Redis, with --keys, expires them itself)")
	durationVar(fs, &opts.readTimeout, "read-timeout", defaultReadTimeout, "close a connection whose request (headers and body) takes longer to arrive")
	durationVar(fs, &opts.writeTimeout, "write-timeout", 0, "close a connection whose answer is not sent this long after its request's headers\n(default --read-timeout + --handler-delay + --wait-in-flight + 30s)")
	durationVar(fs, &opts.idleTimeout, "idle-timeout", defaultIdleTimeout, "close a kept-alive connection idle this long")
	fs.BoolVar(&opts.singleTransaction, "single-transaction", false, singleTransactionHelp)
	fs.StringVar(&opts.metricsAddr, "metrics-addr", "", "serve GET /metrics on this `host:port` (port 0 picks a free one), with the API's timeouts;\nwithout it no metrics are served (never on --addr)")
	grpcFlag(fs, &opts)
	if err := parseFlags(fs, serveHelp, args, stdout); err != nil {
		return err
	}
	if isSet(fs, "write-timeout") && opts.writeTimeout == 0 {
		return usagef("--write-timeout must be positive, got 0s")
	}
	logger := slog.New(slog.NewTextHandler(stderr, nil))
	return (&serveCmd{CommandBase{Stdout: stdout, Logger: logger}}).run(ctx, &opts)
}

// serveCmd runs the demo until its context ends.
type serveCmd struct {
	CommandBase
}

func (o *serveOpts) check() error {
	switch {
	case o.lease <= 0:
		return usagef("--lease must be positive, got %s", o.lease)
	case o.lease < minInterval:
		// The heartbeat extends a running request's lease every third of
		// it: a round trip to the database per millisecond or so.
		return usagef("--lease must be at least %s, got %s", minInterval, o.lease)
	case o.retention <= 0:
		return usagef("--retention must be positive, got %s", o.retention)
	case o.retention < o.lease:
		// The engine would keep each record for the lease anyway; say so
		// rather than run with another retention than the one asked for.
		return usagef("--retention %s is shorter than --lease %s: a key is remembered at least as long as a request may hold it; raise --retention or lower --lease", o.retention, o.lease)
	case o.handlerDelay < 0:
		return usagef("--handler-delay must not be negative, got %s", o.handlerDelay)
	case o.waitInFlight < 0:
		return usagef("--wait-in-flight must not be negative, got %s", o.waitInFlight)
	case o.purgeInterval < 0:
		return usagef("--purge-interval must not be negative, got %s", o.purgeInterval)
	case o.purgeInterval > 0 && o.purgeInterval < minInterval:
		return usagef("--purge-interval must be 0 (off) or at least %s, got %s", minInterval, o.purgeInterval)
	case o.readTimeout < minInterval:
		return usagef("--read-timeout must be at least %s, got %s", minInterval, o.readTimeout)
	case o.idleTimeout < minInterval:
		return usagef("--idle-timeout must be at least %s, got %s", minInterval, o.idleTimeout)
	case o.writeTimeout < 0:
		return usagef("--write-timeout must be positive, got %s", o.writeTimeout)
	case o.writeTimeout > 0 && o.writeTimeout <= o.readTimeout+o.handlerDelay+o.waitInFlight:
		// The write deadline runs from the end of the headers: it covers
		// the body's arrival, the wait for a request in flight, the delay,
		// and the work.
		if o.waitInFlight > 0 {
			return usagef("--write-timeout %s leaves no time to answer after --read-timeout %s, --handler-delay %s and --wait-in-flight %s; make it longer than their sum",
				o.writeTimeout, o.readTimeout, o.handlerDelay, o.waitInFlight)
		}
		return usagef("--write-timeout %s leaves no time to answer after --read-timeout %s and --handler-delay %s; make it longer than their sum",
			o.writeTimeout, o.readTimeout, o.handlerDelay)
	}
	if err := checkAddr("--addr", o.addr); err != nil {
		return err
	}
	if o.metricsAddr != "" {
		if err := checkAddr("--metrics-addr", o.metricsAddr); err != nil {
			return err
		}
		if sameAddr(o.addr, o.metricsAddr) {
			return usagef("--metrics-addr %s is --addr's address: give the metrics an address of their own (port 0 picks a free one)", quoteArg(o.metricsAddr))
		}
	}
	if _, err := parseDB(o.db); err != nil {
		return err
	}
	if o.singleTransaction && o.keys != "" {
		return usagef("--single-transaction claims in the order's own transaction: it cannot keep the records in Redis (--keys)")
	}
	if o.keys != "" {
		if err := checkKeysURL(o.keys); err != nil {
			return err
		}
	}
	return nil
}

// checkAddr refuses a listen address net.Listen would refuse for its form
// alone (no port, a port out of range, a service name), so that a typo is
// a usage error found before anything is opened or created.
func checkAddr(flagName, addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return usagef("%s %s: want host:port, as in 127.0.0.1:3000 (port 0 picks a free one)", flagName, quoteArg(addr))
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 0 || n > 65535 {
		return usagef("%s %s: the port must be a number from 0 to 65535", flagName, quoteArg(addr))
	}
	return nil
}

// sameAddr reports two listen addresses that are one (port 0 picks two
// different ports, so never).
func sameAddr(a, b string) bool {
	ha, pa, _ := net.SplitHostPort(a)
	hb, pb, _ := net.SplitHostPort(b)
	if pa != pb || pa == "0" {
		return false
	}
	wild := func(h string) bool { return h == "" || h == "0.0.0.0" || h == "::" }
	return ha == hb || wild(ha) || wild(hb)
}

// listeners binds --addr and --metrics-addr (nil without it), each error
// naming its flag; nothing is left open on failure.
func (o *serveOpts) listeners() (api, metrics net.Listener, err error) {
	api, err = net.Listen("tcp", o.addr)
	if err != nil {
		return nil, nil, fmt.Errorf("--addr %s: %w", o.addr, unwrapOpError(err))
	}
	if o.metricsAddr != "" {
		metrics, err = net.Listen("tcp", o.metricsAddr)
		if err != nil {
			api.Close() //nolint:errcheck // the listen error is the one to report
			return nil, nil, fmt.Errorf("--metrics-addr %s: %w", o.metricsAddr, unwrapOpError(err))
		}
	}
	return api, metrics, nil
}

// unwrapOpError drops net.OpError's "listen tcp ADDR:" prefix, which the
// message already says with the flag's name.
func unwrapOpError(err error) error {
	var op *net.OpError
	if errors.As(err, &op) && op.Err != nil {
		return op.Err
	}
	return err
}

// timeouts returns the http.Server timeouts of o.
func (o *serveOpts) timeouts() (readHeader, read, write, idle time.Duration) {
	write = o.writeTimeout
	if write == 0 {
		write = o.readTimeout + o.handlerDelay + o.waitInFlight + handlerBudget
	}
	return min(maxReadHeaderTimeout, o.readTimeout), o.readTimeout, write, o.idleTimeout
}

// server is a running demo before it listens: what run and the tests
// build on.
type server struct {
	conn    *conn
	store   idem.Store
	engine  *idem.Engine
	handler http.Handler
	// metrics observes the engine, the janitor and the requests; gather
	// answers GET /metrics.
	metrics *idemprom.Collector
	gather  http.Handler
	app     *demo.App
}

// newServer opens the databases, creates the tables and builds the demo.
// When hardStop ends, the requests still running after their clients went
// away end too (demo.Config.ShutdownContext).
func newServer(ctx, hardStop context.Context, opts *serveOpts, logger *slog.Logger) (*server, error) {
	if err := opts.check(); err != nil {
		return nil, err
	}
	// Redis first: openDB creates a SQLite file, which an unreachable
	// --keys must not leave behind.
	var rdb *redis.Client
	if opts.keys != "" && !isDynamoURL(opts.keys) { // a DynamoDB table is opened by buildServer
		ro, err := parseRedisURL(opts.keys)
		if err != nil {
			return nil, err
		}
		if rdb, err = dialRedis(ctx, ro, opts.keys); err != nil {
			return nil, err
		}
	}
	c, err := openDB(ctx, opts.db, openOptions{})
	if err != nil {
		if rdb != nil {
			rdb.Close() //nolint:errcheck // the open error is the one to report
		}
		return nil, err
	}
	c.rdb = rdb
	s, err := buildServer(ctx, hardStop, c, opts, logger)
	if err != nil {
		c.Close() //nolint:errcheck // the build error is the one to report
		return nil, err
	}
	return s, nil
}

func buildServer(ctx, hardStop context.Context, c *conn, opts *serveOpts, logger *slog.Logger) (*server, error) {
	var store idem.Store
	if opts.keys != "" {
		rs, err := c.useKeys(ctx, opts.keys, logger, true)
		if err != nil {
			return nil, err
		}
		store = rs
		logger.Warn("idempotency records in " + rs.Info().Name + ", orders in --db: they no longer commit in one transaction; a crash between the two may let a retry create a second order once the lease ends")
	} else {
		if err := c.migrateKeys(ctx); err != nil {
			return nil, fmt.Errorf("migrate the idempotency records table: %w", err)
		}
		ks, err := c.keyStore()
		if opts.singleTransaction {
			ks, err = c.singleTransactionStore()
		}
		if err != nil {
			return nil, err
		}
		store = ks
	}
	// A registry of its own, not the global one: the tests build several
	// servers in one process.
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics, err := idemprom.NewCollector(&idemprom.Config{Registerer: reg})
	if err != nil {
		return nil, err
	}
	engine, err := idem.NewEngine(store, &idem.Config{
		Lease:     opts.lease,
		Retention: opts.retention,
		Logger:    logger,
		Tracer:    metrics,
	})
	if err != nil {
		return nil, err
	}
	cfg := c.demoConfig()
	cfg.Engine = engine
	cfg.RequireKey = opts.requireKey
	cfg.HandlerDelay = opts.handlerDelay
	cfg.WaitInFlight = opts.waitInFlight
	cfg.ShutdownContext = hardStop
	cfg.Logger = logger
	app, err := demo.New(cfg)
	if err != nil {
		return nil, err
	}
	if err := app.Migrate(ctx); err != nil {
		return nil, err
	}
	gather := promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelWarn)})
	return &server{conn: c, store: store, engine: engine, handler: app.Handler(), metrics: metrics, gather: gather, app: app}, nil
}

// forcedStopWait bounds the wait for cancelled handlers to roll back and
// release their keys (the engine's own cleanup timeout is 5s).
const forcedStopWait = 10 * time.Second

// errForcedStop is run's error when requests outlived the grace period and
// were cancelled: their clients got no answer (their retries run them
// again), so the stop was not clean.
var errForcedStop = errors.New("requests still running after the grace period were cancelled (their keys released for retries)")

// run serves until ctx ends, then stops accepting connections and waits
// for the requests in progress. It returns nil after a clean shutdown, and
// an error when requests had to be cancelled.
func (c *serveCmd) run(ctx context.Context, opts *serveOpts) error {
	logger := c.logger()
	// hardStop is the base of every request's context, and ends the
	// requests idemhttp lets run on after their clients went away: it is
	// cancelled when the grace period of a shutdown is over.
	hardStop, stopHard := context.WithCancel(context.WithoutCancel(ctx))
	defer stopHard()
	// Everything the command line can get wrong is found before anything
	// is opened, created or migrated: the flags, then the listeners.
	if err := opts.check(); err != nil {
		return err
	}
	ln, mln, err := opts.listeners()
	if err != nil {
		return err
	}
	defer ln.Close() //nolint:errcheck // Serve closes it; this covers the early returns
	if mln != nil {
		defer mln.Close() //nolint:errcheck // as ln
	}
	s, err := newServer(ctx, hardStop, opts, logger)
	if err != nil {
		return err
	}
	defer s.conn.Close() //nolint:errcheck // nothing left to do with a close error at exit

	// Crash injection for the crash tests: returns the handler itself
	// unless the binary was built with -tags idemfaults and IDEM_FAULT is
	// set (internal/demo/faults.go).
	handler := demo.Faults(s.handler, logger)
	readHeader, read, write, idle := opts.timeouts()
	if mln != nil {
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", s.gather)
		// The API's timeouts: a scraper, or anyone who can reach the
		// address, that stalls or idles loses its connection as an API
		// client does.
		metricsSrv := &http.Server{Handler: mux,
			ReadHeaderTimeout: readHeader, ReadTimeout: read, WriteTimeout: write, IdleTimeout: idle,
			MaxHeaderBytes: maxHeaderBytes, ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelWarn)}
		logger.Info("metrics listening", slog.String("addr", mln.Addr().String()))
		go metricsSrv.Serve(mln) //nolint:errcheck // ErrServerClosed at shutdown
		defer metricsSrv.Close() //nolint:errcheck // at exit
	}
	// Counts the handlers running, so that a forced stop can wait for
	// them to roll back and release their keys before the connections to
	// the database close under them.
	var running sync.WaitGroup
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			running.Add(1)
			defer running.Done()
			handler.ServeHTTP(w, r)
		}),
		// A connection that stalls, while sending its request or between
		// requests, is closed: without these, each stalled connection
		// holds its buffers (and, once idemhttp reads a body, that body)
		// for as long as the client likes. A handler that outlives the
		// write timeout still completes and stores its answer; only its
		// connection is lost, and the client's retry gets the replay.
		BaseContext:       func(net.Listener) context.Context { return hardStop },
		ReadHeaderTimeout: readHeader,
		ReadTimeout:       read,
		WriteTimeout:      write,
		IdleTimeout:       idle,
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}

	enableH2C(srv)
	stopGRPC, err := startGRPC(opts, s.app, logger)
	if err != nil {
		return err
	}
	defer stopGRPC(context.WithoutCancel(ctx))

	janitorDone := make(chan struct{})
	jctx, stopJanitor := context.WithCancel(ctx)
	defer stopJanitor()
	// Redis expires its records by TTL: no janitor there.
	if opts.purgeInterval > 0 && opts.keys == "" {
		j, err := idemjanitor.NewJanitor(s.store, &idemjanitor.Config{Interval: opts.purgeInterval, Logger: logger, Tracer: s.metrics})
		if err != nil {
			return err
		}
		go func() {
			defer close(janitorDone)
			j.Run(jctx) //nolint:errcheck // Run returns nil when its context ends
		}()
	} else {
		close(janitorDone)
	}

	keys := s.conn.target.describe()
	if opts.keys != "" {
		keys = s.store.Info().Name
	}
	logger.Info("listening", slog.String("addr", ln.Addr().String()), slog.String("db", s.conn.target.describe()),
		slog.String("keys", keys), slog.Duration("lease", opts.lease), slog.Duration("retention", opts.retention),
		slog.Bool("require_key", opts.requireKey), slog.Duration("handler_delay", opts.handlerDelay),
		slog.Duration("read_timeout", read), slog.Duration("write_timeout", write), slog.Duration("idle_timeout", idle))

	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		// Serve only returns early on a listener failure.
		stopJanitor()
		<-janitorDone
		s.engine.Close(context.WithoutCancel(ctx)) //nolint:errcheck // the listener's error is the one to report
		return err
	case <-ctx.Done():
	}

	logger.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownGrace+opts.handlerDelay)
	defer cancel()
	stopGRPC(sctx)
	err = srv.Shutdown(sctx)
	if errors.Is(err, context.DeadlineExceeded) {
		// Cancel what still runs, requests whose clients went away
		// included: the engine rolls it back and releases its keys, so
		// retries run it again elsewhere. Close does not wait for the
		// handlers; they must finish before the database handle closes,
		// or the releases fail and the keys stay locked for a whole
		// lease.
		logger.Warn("requests still running after the grace period; cancelling them")
		stopHard()
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
	// The engine's late releases and heartbeats finish before the
	// database handle closes.
	cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), forcedStopWait)
	defer ccancel()
	if cerr := s.engine.Close(cctx); cerr != nil {
		err = errors.Join(err, cerr)
	}
	if err == nil {
		logger.Info("stopped")
	}
	return err
}
