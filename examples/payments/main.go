// Command payments is a payments API that charges cards through a card
// network, safe to retry: a client that gives up on a slow answer and
// sends the payment again with the same Idempotency-Key gets the first
// answer, and the card is charged once, even when the server is killed
// in the middle of the charge. See README.md for the commands.
//
// It runs in three ways:
//
//	payments -db URL -card-url URL     the API (POST /payments, POST /payments/{id}/refunds)
//	payments -cardnet 127.0.0.1:8081   the card network the API calls
//	payments -demo -db URL             both, and 40 payments from clients that give up after 100ms
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/idem-go/idem/examples/payments/cardnet"
)

type options struct {
	listen             string
	db                 string
	cardURL            string
	lease              time.Duration
	cancelOnDisconnect bool
	cardnet            string
	latencyMin         time.Duration
	latencyMax         time.Duration
	demo               bool
	payments           int
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "payments:", err)
		}
		os.Exit(2)
	}
}

func defaultDB() string {
	if u := os.Getenv("DATABASE_URL"); u != "" {
		return u
	}
	return "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
}

// run parses args and runs the command they name until ctx ends.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var o options
	fs := flag.NewFlagSet("payments", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.listen, "listen", "127.0.0.1:8080", "address the API listens on")
	fs.StringVar(&o.db, "db", defaultDB(), "PostgreSQL URL (defaults to $DATABASE_URL)")
	fs.StringVar(&o.cardURL, "card-url", "http://127.0.0.1:8081", "base URL of the card network")
	fs.DurationVar(&o.lease, "lease", 0, "idem's lease: how long a killed server's payments stay locked before a retry takes them over (0: idem's default, 90s)")
	fs.BoolVar(&o.cancelOnDisconnect, "cancel-on-disconnect", false, "opt out of idemhttp's default: cancel a payment whose client went away (do not: see README.md)")
	fs.StringVar(&o.cardnet, "cardnet", "", "run the card network on this address instead of the API")
	fs.DurationVar(&o.latencyMin, "card-latency-min", cardnet.DefaultMinLatency, "with -cardnet or -demo: shortest card call")
	fs.DurationVar(&o.latencyMax, "card-latency-max", cardnet.DefaultMaxLatency, "with -cardnet or -demo: longest card call")
	fs.BoolVar(&o.demo, "demo", false, "run the card network and the API here, send payments and refunds from clients that give up after 100ms, print what moved")
	fs.IntVar(&o.payments, "payments", 40, "with -demo: how many payments (one fewer refunds)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q (flags only; see -help)", fs.Arg(0))
	}
	logger := slog.New(slog.NewTextHandler(stderr, nil))
	switch {
	case o.cardnet != "":
		return serveCardnet(ctx, o, logger)
	case o.demo:
		return demo(ctx, o, stdout, logger)
	default:
		return serveAPI(ctx, o, logger)
	}
}

func serveAPI(ctx context.Context, o options, logger *slog.Logger) error {
	s, err := newServer(ctx, serverConfig{
		db: o.db, cardURL: o.cardURL, lease: o.lease,
		cancelOnDisconnect: o.cancelOnDisconnect, logger: logger,
	})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		_ = s.shutdown()
		return err
	}
	logger.Info("payments API listening", slog.String("addr", ln.Addr().String()),
		slog.String("card_network", o.cardURL), slog.Bool("cancel_on_disconnect", o.cancelOnDisconnect))
	return serveUntil(ctx, s, ln)
}

// serveUntil serves the API on ln until ctx ends, then shuts it down.
func serveUntil(ctx context.Context, s *server, ln net.Listener) error {
	janitorCtx, stopJanitor := context.WithCancel(context.Background())
	defer stopJanitor()
	go func() { _ = s.janitor.Run(janitorCtx) }()
	served := make(chan error, 1)
	go func() { served <- s.http.Serve(ln) }()
	select {
	case err := <-served:
		_ = s.shutdown()
		return err
	case <-ctx.Done():
		return s.shutdown()
	}
}

func serveCardnet(ctx context.Context, o options, logger *slog.Logger) error {
	ln, err := net.Listen("tcp", o.cardnet)
	if err != nil {
		return err
	}
	srv := &http.Server{
		Handler:           cardnet.New(&cardnet.Config{MinLatency: o.latencyMin, MaxLatency: o.latencyMax}),
		ReadHeaderTimeout: 5 * time.Second,
	}
	logger.Info("card network listening", slog.String("addr", ln.Addr().String()),
		slog.Duration("latency_min", o.latencyMin), slog.Duration("latency_max", o.latencyMax))
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return srv.Shutdown(sctx)
	}
}
