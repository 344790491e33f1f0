// Command idem runs the idem demo server and its maintenance commands. Run
// "idem --help" for the list; the commands live in package idemcli.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/idem-go/idem/cmd/idem/idemcli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() { <-ctx.Done(); stop() }() // after the first signal, a second one kills at once
	code := idemcli.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
