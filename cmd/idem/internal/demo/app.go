package demo

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
)

// Dialect names the database/sql database that holds the orders.
type Dialect int

// The database/sql dialects of Config.DB.
const (
	SQLite Dialect = iota + 1
	MySQL          // MySQL or MariaDB, through go-sql-driver/mysql with parseTime=true
)

// Config configures the demo.
type Config struct {
	// DB holds the orders on SQLite or MySQL/MariaDB, as Dialect says.
	// Exactly one of DB and Pool is set.
	DB      *sql.DB
	Dialect Dialect
	// Pool holds the orders on PostgreSQL.
	Pool *pgxpool.Pool

	// Engine runs POST /orders under its Idempotency-Key. When its store
	// keeps the records in DB or Pool, the order commits with the stored
	// answer; in Redis, the two commit separately. Required.
	Engine *idem.Engine
	// RequireKey answers 400 to a POST /orders without Idempotency-Key.
	RequireKey bool
	// HandlerDelay is slept by POST /orders once its key is claimed,
	// before its first statement, to make the in-flight window visible.
	HandlerDelay time.Duration
	// WaitInFlight is how long a POST /orders whose key is in flight waits
	// for the first request's answer before it gets 409
	// (idemhttp.Config.WaitInFlight). Defaults to 0: 409 at once.
	WaitInFlight time.Duration
	// ShutdownContext, when it ends, ends the requests still running
	// after their clients went away (idemhttp lets them run on, so that
	// the retry gets their stored answer): their writes roll back and
	// their keys are released. The server cancels it when it must stop at
	// once. Defaults to none.
	ShutdownContext context.Context
	// Logger receives one line per request and the errors. Defaults to
	// discarding.
	Logger *slog.Logger
}

// App is the orders API. Create it with New.
type App struct {
	repo   orderRepo
	mw     *idemhttp.Middleware
	delay  time.Duration
	logger *slog.Logger
	now    func() time.Time
	cfg    Config // for the gRPC and Connect front ends (grpc.go)
}

// New builds the API on cfg. It opens nothing: cfg's handles are used as
// they are. Call Migrate before serving.
func New(cfg Config) (*App, error) {
	if cfg.Engine == nil {
		return nil, errors.New("demo: Config.Engine is required")
	}
	if cfg.HandlerDelay < 0 {
		return nil, fmt.Errorf("demo: negative HandlerDelay %s", cfg.HandlerDelay)
	}
	if cfg.WaitInFlight < 0 {
		return nil, fmt.Errorf("demo: negative WaitInFlight %s", cfg.WaitInFlight)
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	var repo orderRepo
	switch {
	case cfg.Pool != nil && cfg.DB == nil:
		repo = &pgOrders{pool: cfg.Pool}
	case cfg.DB != nil && cfg.Pool == nil && (cfg.Dialect == SQLite || cfg.Dialect == MySQL):
		repo = &sqlOrders{db: cfg.DB, dialect: cfg.Dialect}
	default:
		return nil, errors.New("demo: set Config.DB with its Dialect (SQLite or MySQL), or Config.Pool")
	}
	mw, err := idemhttp.NewMiddleware(cfg.Engine, &idemhttp.Config{
		RequireKey: cfg.RequireKey,
		// withTenant, in front, has already refused malformed credentials.
		TenantFunc:      func(r *http.Request) (string, error) { return TenantFrom(r.Context()), nil },
		ShutdownContext: cfg.ShutdownContext,
		WaitInFlight:    cfg.WaitInFlight,
		Logger:          logger,
	})
	if err != nil {
		return nil, err
	}
	return &App{repo: repo, mw: mw, delay: cfg.HandlerDelay, logger: logger, now: time.Now, cfg: cfg}, nil
}

// Migrate creates the orders table, Table, if it is not there. Several
// processes may run it at once on one database.
func (a *App) Migrate(ctx context.Context) error { return a.repo.migrate(ctx) }

// Handler returns the whole API: a log line per request, then
// authentication (the tenant), then the routes, POST /orders behind the
// idempotency middleware. Authentication sits in front of idempotency so
// that a 401 is never stored under a key.
func (a *App) Handler() http.Handler {
	return logRequests(a.logger, a.withConnect(withTenant(a.routes())))
}

// routes returns the API. The idempotency middleware wraps the one route
// that needs it, after the router has matched: a 404, a 405 or the
// router's redirect of an unclean path (POST //orders answers 307 to
// /orders) is an answer of the router, not an execution, and must not be
// stored under the key, or the redirected retry would find the key taken
// by another path (422). Every error, routing ones included, is
// application/problem+json.
func (a *App) routes() *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("POST /orders", a.mw.Handler(http.HandlerFunc(a.create)))
	mux.HandleFunc("GET /orders", a.list)
	mux.HandleFunc("GET /orders/{id}", a.get)
	// Patterns without a method catch the other methods: the mux's own 405
	// is text/plain.
	mux.HandleFunc("/orders", methodNotAllowed("GET, HEAD, POST"))
	mux.HandleFunc("/orders/{id}", methodNotAllowed("GET, HEAD"))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeProblem(w, http.StatusNotFound, "not-found", "Not found",
			fmt.Sprintf("There is nothing at %s. The demo serves POST /orders, GET /orders?cart_id=… and GET /orders/{id}.", quote(r.URL.Path)))
	})
	return mux
}

func methodNotAllowed(allow string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", allow)
		writeProblem(w, http.StatusMethodNotAllowed, "method-not-allowed", "Method not allowed",
			fmt.Sprintf("%s is not served on %s; use %s.", quote(r.Method), quote(r.URL.Path), allow))
	}
}
