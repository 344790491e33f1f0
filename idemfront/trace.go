package idemfront

import (
	"context"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/tracers"
)

// RequestTracer observes the calls a front end answers. A front end finds
// it on its engine's tracer with [RequestTracerOf]; idemprom and idemotel
// implement it. Only the calls the front end covers (idemhttp: the
// methods it protects) are traced. Like every idem tracer it must be safe
// for concurrent use, and fast.
type RequestTracer interface {
	// TraceRequestStart is called as a covered call arrives. The context
	// it returns is the one the engine and the handler run under (a call
	// that passes through without a key runs its handler under its own
	// context).
	TraceRequestStart(ctx context.Context, data TraceRequestStartData) context.Context
	// TraceRequestEnd is called once the answer was sent, with that
	// context.
	TraceRequestEnd(ctx context.Context, data TraceRequestEndData)
}

// TraceRequestStartData describes a call that arrives.
type TraceRequestStartData struct {
	// Protocol names the front end's protocol: "grpc", "connect"; empty
	// for HTTP (idemhttp and the routers built on it).
	Protocol string
	// Method is the HTTP method (an RPC front end says "POST").
	Method string
	// Route is the route's pattern ("/orders/{id}") or the full RPC
	// method ("/pkg.Service/Method"), never the raw path; "unmatched"
	// when the router named none.
	Route string
}

// TraceRequestEndData describes a call that was answered.
type TraceRequestEndData struct {
	// Protocol, Method and Route are TraceRequestStartData's.
	Protocol string
	Method   string
	Route    string
	// Kind is the answer's kind; its Label is the value observers report.
	Kind Kind
	// Status is the protocol's own code for the answer (an HTTP status, a
	// gRPC code); 0 when the call passed through unwatched.
	Status int
	// Execution is how long the handler and the completion took; zero
	// when the handler did not run under the engine.
	Execution time.Duration
	// Err is the engine's error, if any.
	Err error
}

// MetricMethod is the method under which observers count a call: the
// HTTP method, or for an RPC front end its protocol ("grpc", "connect"),
// since every call is a POST and the route says the rest.
func (d TraceRequestEndData) MetricMethod() string { return metricMethod(d.Method, d.Protocol) }

// MetricMethod is TraceRequestEndData.MetricMethod, for a span started
// before the answer is known.
func (d TraceRequestStartData) MetricMethod() string { return metricMethod(d.Method, d.Protocol) }

func metricMethod(method, protocol string) string {
	if protocol != "" {
		return protocol
	}
	return method
}

// RequestTracerOf returns the RequestTracer of an engine's tracer (its
// Config.Tracer): the tracer itself when it implements RequestTracer;
// for a tracer made by idem.MultiTracer, those of its tracers that do,
// called in turn with their contexts chained; nil when none does.
func RequestTracerOf(t idem.Tracer) RequestTracer {
	switch found := tracers.Find[RequestTracer](t); len(found) {
	case 0:
		return nil
	case 1:
		return found[0]
	default:
		return multiRequestTracer(found)
	}
}

type multiRequestTracer []RequestTracer

func (m multiRequestTracer) TraceRequestStart(ctx context.Context, data TraceRequestStartData) context.Context {
	for _, t := range m {
		ctx = t.TraceRequestStart(ctx, data)
	}
	return ctx
}

func (m multiRequestTracer) TraceRequestEnd(ctx context.Context, data TraceRequestEndData) {
	for _, t := range m {
		t.TraceRequestEnd(ctx, data)
	}
}
