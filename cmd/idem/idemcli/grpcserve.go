package idemcli

import (
	"context"
	"flag"
	"log/slog"
	"net"
	"net/http"
	"sync"

	"github.com/idem-go/idem/cmd/idem/internal/demo"
)

// grpcFlag registers --grpc-addr: where the demo's orders are served over
// gRPC (idem.demo.v1.OrderService, with server reflection). The same
// service is served over Connect on --addr whatever this flag says.
func grpcFlag(fs *flag.FlagSet, opts *serveOpts) {
	fs.StringVar(&opts.grpcAddr, "grpc-addr", "", "also serve the orders over gRPC (idem.demo.v1.OrderService, server reflection on) on this `host:port`;\nthe same service answers Connect, gRPC-Web and (h2c) gRPC on --addr")
}

// enableH2C lets the HTTP port answer gRPC clients of the Connect handler
// (HTTP/2 without TLS) besides HTTP/1.1.
func enableH2C(srv *http.Server) {
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	srv.Protocols = &p
}

// startGRPC serves the demo's orders over gRPC on opts.grpcAddr, when
// set. stop stops the server: gracefully until ctx ends, then at once;
// it may be called more than once.
func startGRPC(opts *serveOpts, app *demo.App, logger *slog.Logger) (stop func(ctx context.Context), err error) {
	if opts.grpcAddr == "" {
		return func(context.Context) {}, nil
	}
	srv, err := app.GRPCServer()
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", opts.grpcAddr)
	if err != nil {
		return nil, err
	}
	logger.Info("grpc listening", slog.String("addr", ln.Addr().String()))
	served := make(chan struct{})
	go func() {
		defer close(served)
		if err := srv.Serve(ln); err != nil {
			logger.Error("grpc server", slog.Any("error", err))
		}
	}()
	var once sync.Once
	return func(ctx context.Context) {
		once.Do(func() {
			done := make(chan struct{})
			go func() { srv.GracefulStop(); close(done) }()
			select {
			case <-done:
			case <-ctx.Done():
				srv.Stop()
			}
			<-served
		})
	}, nil
}
