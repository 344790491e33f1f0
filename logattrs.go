package idem

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/idem-go/idem/internal/fieldtext"
)

// tenantAttr is a tenant as the engine logs it, its control characters
// escaped: a tenant comes from the integrator's authentication and may
// hold anything, and slog's JSON handler writes the C1 controls raw
// (U+009B starts a terminal control sequence, as ESC [ does).
func tenantAttr(tenant string) slog.Attr {
	return slog.String("tenant", fieldtext.Escape(tenant))
}

// errorAttr is an error as the engine logs it: escaped as tenantAttr is
// (a store's or a driver's text may quote what the caller sent), and a
// handler's panic named by the type of its value alone, since the value
// may carry the request's body or a secret.
func errorAttr(err error) slog.Attr {
	if err == nil {
		return slog.Any("error", nil)
	}
	return slog.String("error", safeErrorText(err))
}

// safeErrorText is the text of err fit for logs:
// its control characters escaped, and, when err is or wraps a
// *PanicError, a fixed text naming the type of the panic's value instead
// of the value (a panic value may carry the request's body).
func safeErrorText(err error) string {
	var p *PanicError
	if errors.As(err, &p) {
		return fmt.Sprintf("idem: handler panicked (a value of type %T; the value is not reported)", p.Value)
	}
	return fieldtext.Escape(err.Error())
}
