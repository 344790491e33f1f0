package idemotel

import (
	"errors"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/fieldtext"
)

// recordError records err on span as OpenTelemetry's "exception" event,
// with the text errorText gives: a trace backend is read by more people
// than the service's logs, and keeps what it gets for longer.
func recordError(span trace.Span, err error) {
	span.AddEvent("exception", trace.WithAttributes(
		attribute.String("exception.type", errorType(err)),
		attribute.String("exception.message", errorText(err)),
	))
}

// errorText is what idemotel exports of err: its text with control
// characters escaped (a tenant, a subject or a driver's message may hold
// U+009B, which a terminal acts on), and, for a handler's panic, a fixed
// text: the panic's value may carry the request's body, a card number, a
// token.
func errorText(err error) string {
	var p *idem.PanicError
	if errors.As(err, &p) {
		return "idem: handler panicked (the value is not exported; see the service's own logs)"
	}
	return fieldtext.Escape(err.Error())
}

// errorType is exception.type: the Go type of err, or for a handler's
// panic the type of the value it panicked with ("string",
// "runtime.boundsError"), which tells panics apart without their text.
func errorType(err error) string {
	var p *idem.PanicError
	if errors.As(err, &p) {
		return fmt.Sprintf("panic(%T)", p.Value)
	}
	return fmt.Sprintf("%T", err)
}
