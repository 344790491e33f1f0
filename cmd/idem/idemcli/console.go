package idemcli

import (
	"context"
	"errors"
	"flag"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/console"
	"github.com/idem-go/idem/idemkeys"
	"github.com/idem-go/idem/idemredis"
)

const consoleHelp = `Usage: idem console --token TOKEN [flags]

Serves the operator console on --addr: an overview of the records (by
state and tenant, the oldest in flight, claims and completions per hour,
the purge backlog), the keys with filters, one key in full, the abandoned
operations, and the release or forgetting of a key, each with a reason,
logged. The JSON API for scripts is under /api (docs/CONSOLE.md).

Every page and API call needs the token (--token, or IDEM_CONSOLE_TOKEN):
the pages through a login form (a session ends after --session-lifetime),
the API as "Authorization: Bearer TOKEN".
It listens on the loopback interface unless --addr says otherwise.
`

// defaultConsoleAddr is where the console listens by default: loopback only.
const defaultConsoleAddr = "127.0.0.1:3001"

func runConsole(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("console", flag.ContinueOnError)
	db := fs.String("db", DefaultDB, dbFlagHelp)
	keys := fs.String("keys", "", "read the records from Redis at this redis:// `URL` instead of --db")
	addr := fs.String("addr", defaultConsoleAddr, "the `host:port` to listen on")
	token := fs.String("token", "", "the `secret` every page and API call needs (default $IDEM_CONSOLE_TOKEN)")
	var lease time.Duration
	durationVar(fs, &lease, "lease", idem.DefaultLease, "the lease the services give: a longer one shows as extended by a heartbeat")
	var sessionLifetime time.Duration
	durationVar(fs, &sessionLifetime, "session-lifetime", 12*time.Hour, "how long a login lasts: the console refuses an older session, whatever the browser sends")
	if err := parseFlags(fs, consoleHelp, args, stdout); err != nil {
		return err
	}
	if *token == "" {
		*token = os.Getenv("IDEM_CONSOLE_TOKEN")
	}
	if sessionLifetime <= 0 {
		return usagef("--session-lifetime %s: want a positive duration", sessionLifetime)
	}
	if len(*token) < 16 {
		return usagef("--token (or IDEM_CONSOLE_TOKEN) is required, at least 16 characters")
	}
	logger := slog.New(slog.NewTextHandler(stderr, nil))
	store, closeStore, err := openListStore(ctx, *db, *keys, logger)
	if err != nil {
		return err
	}
	defer closeStore()
	h, err := console.New(console.Config{Store: store, Token: *token, Lease: lease, Logger: logger, SessionLifetime: sessionLifetime})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	if host, _, _ := net.SplitHostPort(ln.Addr().String()); !net.ParseIP(host).IsLoopback() {
		logger.Warn("the console listens beyond this machine: put TLS in front of it", slog.String("addr", ln.Addr().String()))
	}
	// The timeouts of idem serve's defaults.
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: min(maxReadHeaderTimeout, defaultReadTimeout),
		ReadTimeout:       defaultReadTimeout,
		WriteTimeout:      defaultReadTimeout + handlerBudget,
		IdleTimeout:       defaultIdleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	logger.Info("console listening", slog.String("addr", ln.Addr().String()), slog.String("store", store.Info().Name))
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// openListStore opens the store of --db, or of --keys when given, and
// checks that it can list its records.
func openListStore(ctx context.Context, db, keys string, logger *slog.Logger) (idem.Store, func(), error) {
	var store idem.Store
	var cn *conn
	if keys != "" {
		cn = &conn{}
		rs, err := cn.useRedis(ctx, keys, &idemredis.Config{Logger: logger})
		if err != nil {
			cn.Close() //nolint:errcheck // the first error is the one to report
			return nil, nil, err
		}
		store = rs
	} else {
		var err error
		if cn, err = openDB(ctx, db, openOptions{mustExist: true}); err != nil {
			return nil, nil, err
		}
		if store, err = cn.keyStore(); err != nil {
			cn.Close() //nolint:errcheck // the first error is the one to report
			return nil, nil, err
		}
	}
	if _, ok := store.(idemkeys.Lister); !ok {
		cn.Close() //nolint:errcheck // the first error is the one to report
		return nil, nil, errors.New("this store cannot list its records")
	}
	return store, func() { cn.Close() }, nil //nolint:errcheck // nothing left to do at exit
}
