package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/examples/payments/cardnet"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemjanitor"
	"github.com/idem-go/idem/idempg"
)

// serverConfig is what newServer needs.
type serverConfig struct {
	db      string        // PostgreSQL URL
	cardURL string        // the card network's base URL
	lease   time.Duration // idem's lease; 0 means idem's default (90s)
	// cancelOnDisconnect opts out of idemhttp's default: a handler whose
	// client goes away is cancelled.
	cancelOnDisconnect bool
	logger             *slog.Logger
}

// server is the payments API with what it holds open.
type server struct {
	http    *http.Server
	pool    *pgxpool.Pool
	engine  *idem.Engine
	janitor *idemjanitor.Janitor
	// stop ends the handlers that run on after their client went away
	// (idemhttp's ShutdownContext), once Shutdown's grace period is over.
	stop context.CancelFunc
}

// newServer connects to the database, applies the schemas and builds the
// API. Serve it with s.http.Serve, stop it with s.shutdown.
func newServer(ctx context.Context, c serverConfig) (*server, error) {
	pool, err := pgxpool.New(ctx, c.db)
	if err != nil {
		return nil, fmt.Errorf("database: %w", err)
	}
	s := &server{pool: pool}
	if err := s.open(ctx, c); err != nil {
		pool.Close()
		return nil, err
	}
	return s, nil
}

func (s *server) open(ctx context.Context, c serverConfig) error {
	if err := idempg.Migrate(ctx, s.pool); err != nil {
		return fmt.Errorf("idem's schema: %w", err)
	}
	if _, err := s.pool.Exec(ctx, schema); err != nil {
		return fmt.Errorf("the payments schema: %w", err)
	}
	store, err := idempg.NewStore(s.pool, nil)
	if err != nil {
		return err
	}
	s.engine, err = idem.NewEngine(store, &idem.Config{Lease: c.lease, Logger: c.logger})
	if err != nil {
		return err
	}
	s.janitor, err = idemjanitor.NewJanitor(store, &idemjanitor.Config{Logger: c.logger})
	if err != nil {
		return err
	}

	life, stop := context.WithCancel(context.Background())
	s.stop = stop
	// idemhttp's defaults, but for the tenant rule, which has none, and
	// ReleaseOn5xx: a handler whose client goes away runs to its end and
	// its answer is stored for the client's retry; a 5xx on these routes
	// means "the card network did not say" (or the rows failed after a
	// recorded step), so the key is released, its steps kept, for the
	// retry to ask again under the same downstream key. ReleaseOn5xx
	// belongs to the middleware, so it is limited to the routes this one
	// wraps: a route whose 5xx should be stored and replayed gets a
	// middleware of its own over the same engine, without it.
	mw, err := idemhttp.NewMiddleware(s.engine, &idemhttp.Config{
		TenantFunc:         tenant,
		ReleaseOn5xx:       true,
		ShutdownContext:    life,
		CancelOnDisconnect: c.cancelOnDisconnect,
		Logger:             c.logger,
	})
	if err != nil {
		return err
	}

	a := &api{
		pool: s.pool,
		cards: &cardnet.Client{URL: c.cardURL, HTTP: &http.Client{Transport: &http.Transport{
			Proxy:               http.ProxyFromEnvironment,
			DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConnsPerHost: 64,
			IdleConnTimeout:     90 * time.Second,
		}}},
		logger: c.logger,
	}
	mux := http.NewServeMux()
	mux.Handle("POST /payments", authenticate(mw.Handler(http.HandlerFunc(a.createPayment))))
	mux.Handle("POST /payments/{id}/refunds", authenticate(mw.Handler(http.HandlerFunc(a.createRefund))))
	mux.Handle("GET /payments", authenticate(http.HandlerFunc(a.listPayments)))
	mux.Handle("GET /payments/{id}", authenticate(http.HandlerFunc(a.getPayment)))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		if err := s.pool.Ping(r.Context()); err != nil {
			writeProblem(w, http.StatusServiceUnavailable, "database unavailable", "")
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})

	s.http = &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       15 * time.Second,
		// Longer than a payment takes (a card call is bounded by
		// cardTimeout); a handler whose client is gone runs on past it.
		WriteTimeout:   30 * time.Second,
		IdleTimeout:    2 * time.Minute,
		MaxHeaderBytes: 64 << 10,
		ErrorLog:       slog.NewLogLogger(c.logger.Handler(), slog.LevelWarn),
	}
	return nil
}

// shutdownGrace is how long shutdown waits for requests in progress.
const shutdownGrace = 20 * time.Second

// shutdown stops accepting requests, waits for those in progress (those
// whose client went away too) up to shutdownGrace, then ends them, and
// closes the engine and the pool.
func (s *server) shutdown() error {
	ctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	err := s.http.Shutdown(ctx)
	s.stop()
	if errors.Is(err, context.DeadlineExceeded) {
		err = s.http.Close()
	}
	closeCtx, cancelClose := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancelClose()
	err = errors.Join(err, s.engine.Close(closeCtx))
	s.pool.Close()
	return err
}
