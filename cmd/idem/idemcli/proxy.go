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
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemjanitor"
	"github.com/idem-go/idem/idemprom"
	"github.com/idem-go/idem/idemproxy"
)

// proxyOpts are the settings of `idem proxy`, from its flags.
type proxyOpts struct {
	upstream, addr, db, keys, routes, tenant, tenantSecretFile string
	sqliteSynchronous                                          string
	lease, retention, waitInFlight, upstreamTimeout            time.Duration
	requireKey, releaseOn5xx, bufferOnly                       bool
	maxRequestBody, maxResponseBody                            int64
	readTimeout, writeTimeout, idleTimeout                     time.Duration
	metricsAddr                                                string
	purgeInterval                                              time.Duration
}

// tenantSecretEnv holds the bearer tenants' secret when no file is given.
const tenantSecretEnv = "IDEM_TENANT_SECRET"

const proxyHelp = `Usage: idem proxy --upstream URL --tenant RULE (--db URL | --keys URL) [flags]

Runs a reverse proxy that makes the requests of any HTTP service safe to
retry with an Idempotency-Key: the first request with a key is forwarded,
every retry with the same key and request gets the upstream's first answer
back (Idempotent-Replayed: true) without reaching the upstream, a retry
while the first still runs gets 409 (or waits, --wait-in-flight), the same
key with another request 422. The upstream receives the Idempotency-Key
and X-Forwarded-For, -Host and -Proto.

--tenant says whose key space a request is in (required):
  header:NAME  the header NAME, which the gateway in front sets
  bearer       a keyed hash (HMAC-SHA256) of the Authorization: Bearer
               credential, never stored or logged in clear; the secret,
               at least 16 bytes, from --tenant-secret-file or
               $IDEM_TENANT_SECRET, the same on every proxy of one store
  shared       one key space for every caller

The records live in --db (sqlite:PATH, postgres://…, mysql://…) or in
--keys (redis://…, dynamodb://…). The upstream's own writes and the
stored answer are not one transaction: see docs/PROXY.md for what each
failure does. GET /healthz answers 200 once the store is reached (it shadows the
upstream's path of that name on --addr); the Prometheus metrics are served
only on --metrics-addr, never on --addr, where every caller could read the
counts of the others' traffic.
SIGINT or SIGTERM stops the proxy: requests in flight finish and their
answers are stored.
`

func runProxy(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseProxyFlags(args, stdout)
	if err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(stderr, nil))
	return (&proxyCmd{CommandBase{Stdout: stdout, Logger: logger}}).run(ctx, o)
}

// parseProxyFlags reads the command line of `idem proxy` (--help prints
// to stdout and returns flag.ErrHelp).
func parseProxyFlags(args []string, stdout io.Writer) (*proxyOpts, error) {
	o := &proxyOpts{}
	fs := flag.NewFlagSet("proxy", flag.ContinueOnError)
	fs.StringVar(&o.upstream, "upstream", "", "forward to this `URL` (http://host:port), required")
	fs.StringVar(&o.addr, "addr", "127.0.0.1:3100", "listen on `host:port` (port 0 picks a free one)")
	fs.StringVar(&o.db, "db", "", dbFlagHelp+"\nthat keeps the idempotency records")
	fs.StringVar(&o.sqliteSynchronous, "sqlite-synchronous", "NORMAL", "SQLite's synchronous `setting` for --db sqlite:, NORMAL or FULL. NORMAL commits without waiting for the disk:\na crash of the proxy loses nothing, a power loss can lose the records since the last checkpoint (their keys\nthen reach the upstream again). FULL waits for the disk on every commit, at a cost in throughput")
	fs.StringVar(&o.keys, "keys", "", "keep the idempotency records in Redis (redis://…) or DynamoDB (dynamodb://TABLE?region=…) at this `URL` instead of --db")
	fs.StringVar(&o.routes, "routes", "", "the protected `routes`, comma-separated ServeMux patterns with a method: 'POST /orders,POST /payments/{id}/capture'\n(default POST and PATCH on every path)")
	fs.StringVar(&o.tenant, "tenant", "", "how the tenant is found: header:NAME, bearer or shared (required)")
	fs.StringVar(&o.tenantSecretFile, "tenant-secret-file", "", "read the secret of --tenant bearer from this `file` (default $"+tenantSecretEnv+")")
	durationVar(fs, &o.lease, "lease", idem.DefaultLease, "how long a request holds its key before a retry may take it over (the window after a crash, or an upstream that went silent)")
	durationVar(fs, &o.retention, "retention", idem.DefaultRetention, "how long a key is remembered and its answer replayed (at least --lease)")
	durationVar(fs, &o.waitInFlight, "wait-in-flight", 0, "a retry that arrives while its key's first request runs waits this long for that answer before it gets 409")
	durationVar(fs, &o.upstreamTimeout, "upstream-timeout", idemproxy.DefaultUpstreamTimeout, "wait this long for the upstream's answer once the request was sent; past it the outcome is unknown and the key kept until its lease ends")
	fs.BoolVar(&o.requireKey, "require-key", false, "answer 400 to a protected request without Idempotency-Key")
	fs.BoolVar(&o.releaseOn5xx, "release-on-5xx", false, "release the key after an upstream 5xx, so that a retry runs again (default: the 5xx is stored and replayed)")
	fs.BoolVar(&o.bufferOnly, "buffer-only", false, "refuse an answer larger than --max-response-body (500, key released) instead of passing it through unstored")
	fs.Int64Var(&o.maxRequestBody, "max-request-body", idemhttp.DefaultMaxRequestBody, "refuse a protected request whose body is larger, in `bytes` (413)")
	fs.Int64Var(&o.maxResponseBody, "max-response-body", idemhttp.DefaultMaxResponseBody, "store answers up to this many `bytes`; larger ones are passed through (see --buffer-only)")
	durationVar(fs, &o.purgeInterval, "purge-interval", defaultPurgeInterval, "delete expired records this often; 0 turns the janitor off (Redis and DynamoDB expire them themselves)")
	durationVar(fs, &o.readTimeout, "read-timeout", defaultReadTimeout, "close a connection whose request takes longer to arrive")
	durationVar(fs, &o.writeTimeout, "write-timeout", 0, "close a connection whose answer is not sent this long after its request's headers\n(default --read-timeout + --wait-in-flight + --upstream-timeout + 30s; a stream passed through is not bound by it)")
	durationVar(fs, &o.idleTimeout, "idle-timeout", defaultIdleTimeout, "close a kept-alive connection idle this long")
	fs.StringVar(&o.metricsAddr, "metrics-addr", "", "serve GET /metrics and GET /healthz on this `host:port`, with the API's timeouts; without it no metrics are served (never on --addr)")
	if err := parseFlags(fs, proxyHelp, args, stdout); err != nil {
		return nil, err
	}
	if isSet(fs, "sqlite-synchronous") && !strings.HasPrefix(o.db, "sqlite:") {
		return nil, usagef("--sqlite-synchronous applies to --db sqlite: only")
	}
	if isSet(fs, "write-timeout") && o.writeTimeout == 0 {
		return nil, usagef("--write-timeout must be positive, got 0s")
	}
	return o, nil
}

// proxyCmd runs the proxy until its context ends.
type proxyCmd struct {
	CommandBase
}

func (o *proxyOpts) check() (*url.URL, error) {
	if o.upstream == "" {
		return nil, usagef("--upstream is required")
	}
	u, err := url.Parse(o.upstream)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil {
		return nil, usagef("--upstream must be an http:// or https:// URL with a host and no credentials")
	}
	switch {
	case o.tenant == "":
		return nil, usagef("--tenant is required: header:NAME, bearer or shared (one key space for every caller, chosen explicitly)")
	case o.db == "" && o.keys == "":
		return nil, usagef("--db or --keys is required: where the idempotency records live")
	case o.db != "" && o.keys != "":
		return nil, usagef("--db and --keys both name where the records live; keep one")
	case o.lease < minInterval:
		return nil, usagef("--lease must be at least %s, got %s", minInterval, o.lease)
	case o.retention < o.lease:
		return nil, usagef("--retention %s is shorter than --lease %s", o.retention, o.lease)
	case o.waitInFlight < 0:
		return nil, usagef("--wait-in-flight must not be negative, got %s", o.waitInFlight)
	case o.upstreamTimeout < minInterval:
		return nil, usagef("--upstream-timeout must be at least %s, got %s", minInterval, o.upstreamTimeout)
	case o.maxRequestBody <= 0 || o.maxResponseBody <= 0:
		return nil, usagef("--max-request-body and --max-response-body must be positive")
	case o.purgeInterval < 0 || (o.purgeInterval > 0 && o.purgeInterval < minInterval):
		return nil, usagef("--purge-interval must be 0 (off) or at least %s, got %s", minInterval, o.purgeInterval)
	case o.readTimeout < minInterval || o.idleTimeout < minInterval:
		return nil, usagef("--read-timeout and --idle-timeout must be at least %s", minInterval)
	case o.writeTimeout < 0:
		return nil, usagef("--write-timeout must be positive, got %s", o.writeTimeout)
	}
	switch strings.ToUpper(o.sqliteSynchronous) {
	case "NORMAL", "FULL":
	default:
		return nil, usagef("--sqlite-synchronous must be NORMAL or FULL, got %q", o.sqliteSynchronous)
	}
	if o.keys != "" {
		if err := checkKeysURL(o.keys); err != nil {
			return nil, err
		}
	}
	return u, nil
}

// tenantRule turns --tenant into the middleware's tenant rule.
func (o *proxyOpts) tenantRule(cfg *idemhttp.Config) error {
	switch {
	case o.tenant == "shared":
		cfg.SharedKeySpace = true
	case o.tenant == "bearer":
		secret, err := o.bearerSecret()
		if err != nil {
			return err
		}
		if cfg.TenantFunc, err = idemproxy.BearerTenant(secret); err != nil {
			return usagef("%s", strings.TrimPrefix(err.Error(), "idemproxy: "))
		}
	case strings.HasPrefix(o.tenant, "header:"):
		name := strings.TrimPrefix(o.tenant, "header:")
		if name == "" || strings.ContainsAny(name, " \t:") {
			return usagef("--tenant header:NAME needs a header name")
		}
		cfg.TenantFunc = idemproxy.HeaderTenant(name)
	default:
		return usagef("--tenant must be header:NAME, bearer or shared")
	}
	return nil
}

func (o *proxyOpts) bearerSecret() ([]byte, error) {
	if o.tenantSecretFile != "" {
		b, err := os.ReadFile(o.tenantSecretFile)
		if err != nil {
			return nil, fmt.Errorf("--tenant-secret-file: %w", err)
		}
		return []byte(strings.TrimRight(string(b), "\r\n")), nil
	}
	if s := os.Getenv(tenantSecretEnv); s != "" {
		return []byte(s), nil
	}
	return nil, usagef("--tenant bearer needs a secret: --tenant-secret-file or $%s", tenantSecretEnv)
}

// timeouts returns the http.Server timeouts of o.
func (o *proxyOpts) timeouts() (readHeader, read, write, idle time.Duration) {
	write = o.writeTimeout
	if write == 0 {
		write = o.readTimeout + o.waitInFlight + o.upstreamTimeout + handlerBudget
	}
	return min(maxReadHeaderTimeout, o.readTimeout), o.readTimeout, write, o.idleTimeout
}

// openStore opens where the records live.
func (o *proxyOpts) openStore(ctx context.Context, logger *slog.Logger) (*conn, idem.Store, error) {
	if o.keys != "" {
		c := &conn{}
		st, err := c.useKeys(ctx, o.keys, logger, true)
		if err != nil {
			c.Close() //nolint:errcheck // the open error is the one to report
			return nil, nil, err
		}
		return c, st, nil
	}
	// The proxy's records are not in the upstream's transaction: a
	// commit that waits for the disk protects them from a power loss
	// only, which loses the upstream's answer in flight anyway (see
	// docs/PROXY.md). NORMAL unless --sqlite-synchronous says FULL.
	c, err := openDB(ctx, o.db, openOptions{sqliteSynchronous: o.sqliteSynchronous})
	if err != nil {
		return nil, nil, err
	}
	if err := c.migrateKeys(ctx); err != nil {
		c.Close() //nolint:errcheck // the migration error is the one to report
		return nil, nil, fmt.Errorf("migrate the idempotency records table: %w", err)
	}
	st, err := c.keyStore()
	if err != nil {
		c.Close() //nolint:errcheck // as above
		return nil, nil, err
	}
	return c, st, nil
}

// run serves until ctx ends, then stops accepting connections, lets the
// requests in flight finish (their answers stored), and closes the engine.
func (c *proxyCmd) run(ctx context.Context, o *proxyOpts) error {
	logger := c.logger()
	upstream, err := o.check()
	if err != nil {
		return err
	}
	mcfg := idemhttp.Config{
		RequireKey:      o.requireKey,
		WaitInFlight:    o.waitInFlight,
		MaxRequestBody:  o.maxRequestBody,
		MaxResponseBody: o.maxResponseBody,
		ReleaseOn5xx:    o.releaseOn5xx,
		Logger:          logger,
	}
	if err := o.tenantRule(&mcfg); err != nil {
		return err
	}
	var routes []string
	for _, r := range strings.Split(o.routes, ",") {
		if r = strings.TrimSpace(r); r != "" {
			routes = append(routes, r)
		}
	}
	hardStop, stopHard := context.WithCancel(context.WithoutCancel(ctx))
	defer stopHard()
	mcfg.ShutdownContext = hardStop

	db, store, err := o.openStore(ctx, logger)
	if err != nil {
		return err
	}
	defer db.Close() //nolint:errcheck // at exit
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics, err := idemprom.NewCollector(&idemprom.Config{Registerer: reg})
	if err != nil {
		return err
	}
	engine, err := idem.NewEngine(store, &idem.Config{Lease: o.lease, Retention: o.retention, Logger: logger, Tracer: metrics})
	if err != nil {
		return err
	}
	p, err := idemproxy.New(engine, &idemproxy.Config{
		Upstream: upstream, Middleware: mcfg, Routes: routes,
		UpstreamTimeout: o.upstreamTimeout, BufferOnly: o.bufferOnly,
	})
	if err != nil {
		return usagef("%s", strings.TrimPrefix(err.Error(), "idemproxy: "))
	}
	gather := promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelWarn)})
	healthz := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, "ok\n") //nolint:errcheck // the client is gone
	})
	readHeader, read, write, idle := o.timeouts()
	errorLog := slog.NewLogLogger(logger.Handler(), slog.LevelWarn)
	mux := http.NewServeMux()
	mux.Handle("GET /healthz", healthz)
	mux.Handle("/", p)
	if o.metricsAddr != "" {
		mln, err := net.Listen("tcp", o.metricsAddr)
		if err != nil {
			return err
		}
		mmux := http.NewServeMux()
		mmux.Handle("GET /metrics", gather)
		mmux.Handle("GET /healthz", healthz)
		msrv := &http.Server{Handler: mmux, ReadHeaderTimeout: readHeader, ReadTimeout: read, WriteTimeout: write,
			IdleTimeout: idle, MaxHeaderBytes: maxHeaderBytes, ErrorLog: errorLog}
		logger.Info("metrics listening", slog.String("addr", mln.Addr().String()))
		go msrv.Serve(mln) //nolint:errcheck // ErrServerClosed at shutdown
		defer msrv.Close() //nolint:errcheck // at exit
	}
	ln, err := net.Listen("tcp", o.addr)
	if err != nil {
		return err
	}
	var running sync.WaitGroup
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			running.Add(1)
			defer running.Done()
			mux.ServeHTTP(w, r)
		}),
		BaseContext:       func(net.Listener) context.Context { return hardStop },
		ReadHeaderTimeout: readHeader,
		ReadTimeout:       read,
		WriteTimeout:      write,
		IdleTimeout:       idle,
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          errorLog,
	}
	jctx, stopJanitor := context.WithCancel(ctx)
	defer stopJanitor()
	janitorDone := make(chan struct{})
	if o.purgeInterval > 0 && o.keys == "" {
		j, err := idemjanitor.NewJanitor(store, &idemjanitor.Config{Interval: o.purgeInterval, Logger: logger, Tracer: metrics})
		if err != nil {
			return err
		}
		go func() {
			defer close(janitorDone)
			j.Run(jctx) //nolint:errcheck // nil when its context ends
		}()
	} else {
		close(janitorDone)
	}
	logger.Info("proxy listening", slog.String("addr", ln.Addr().String()), slog.String("upstream", upstream.Redacted()),
		slog.String("keys", store.Info().Name), slog.String("tenant", o.tenant),
		slog.Duration("lease", o.lease), slog.Duration("retention", o.retention),
		slog.Duration("upstream_timeout", o.upstreamTimeout), slog.Duration("write_timeout", write))

	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		stopJanitor()
		<-janitorDone
		engine.Close(context.WithoutCancel(ctx)) //nolint:errcheck // the listener's error is the one to report
		return err
	case <-ctx.Done():
	}
	logger.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownGrace+o.upstreamTimeout)
	defer cancel()
	err = srv.Shutdown(sctx)
	if errors.Is(err, context.DeadlineExceeded) {
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
	cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), forcedStopWait)
	defer ccancel()
	if cerr := engine.Close(cctx); cerr != nil {
		err = errors.Join(err, cerr)
	}
	if err == nil {
		logger.Info("stopped")
	}
	return err
}
