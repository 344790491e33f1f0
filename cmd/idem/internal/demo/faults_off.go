//go:build !idemfaults

package demo

import (
	"context"
	"log/slog"
	"net/http"
	"os"
)

// Faults returns next: this build has no crash injection. When IDEM_FAULT
// is set anyway it says so, so that a crash test run against a release
// build tells why the server never dies.
func Faults(next http.Handler, logger *slog.Logger) http.Handler {
	if os.Getenv(envFault) != "" {
		logger.Warn(envFault + " is set, but this build has no crash injection (build with -tags idemfaults); ignored")
	}
	return next
}

// injectFault does nothing in a release build.
func injectFault(context.Context, faultPoint) {}
