package idemhttp

import (
	"context"
	"net/http"
	"strings"
	"time"

	"github.com/idem-go/idem/idemfront"
)

// clockBase anchors the handler's timing: time.Since of a Time that
// carries a monotonic reading reads the monotonic clock alone, half the
// cost of time.Now.
var clockBase = time.Now()

// monotonic returns the time elapsed since clockBase.
func monotonic() time.Duration { return time.Since(clockBase) }

// requestTrace is what a traced request passes to serve and gets back.
type requestTrace struct {
	ctx       context.Context // the tracer's, for the engine and the handler
	execution time.Duration   // the handler and the completion
	err       error           // the engine's
	pattern   string          // the ServeMux pattern the handler's request got
}

// serveTraced is serve under the engine's RequestTracer. mux is next
// when next is a ServeMux, else nil.
func (m *Middleware) serveTraced(w http.ResponseWriter, r *http.Request, next http.Handler, mux *http.ServeMux) {
	route := m.route(r, r.Pattern)
	if route == unmatched && mux != nil && m.config.RouteFunc == nil {
		// The middleware wraps the router, which has not run yet: ask
		// it which pattern it will serve.
		_, pattern := mux.Handler(r)
		route = m.route(r, pattern)
	}
	t := requestTrace{ctx: m.tracer.TraceRequestStart(r.Context(), idemfront.TraceRequestStartData{Method: r.Method, Route: route})}
	outcome, status := idemfront.Panicked, 0
	defer func() {
		if route == unmatched {
			// The middleware wraps the router: the route is known once
			// the router has run.
			route = m.route(r, t.pattern)
		}
		// Also when a handler's http.ErrAbortHandler is raised again
		// through the middleware: the request was answered, if at all, by
		// a broken connection.
		m.tracer.TraceRequestEnd(t.ctx, idemfront.TraceRequestEndData{
			Method: r.Method, Route: route, Kind: outcome, Status: status,
			Execution: t.execution, Err: t.err,
		})
	}()
	outcome, status = m.serve(w, r, next, &t)
}

// unmatched is the route of a request whose route is not known.
const unmatched = "unmatched"

// route names r's route for a trace: Config.RouteFunc's answer, else
// pattern, what net/http's ServeMux matched, without its method (the
// method is reported apart); "unmatched" when there is none.
func (m *Middleware) route(r *http.Request, pattern string) string {
	var route string
	if m.config.RouteFunc != nil {
		route = m.config.RouteFunc(r)
	} else {
		route = pattern
		// "[METHOD ][HOST]/[PATH]": a method is followed by a space, and
		// no host or path holds one.
		if i := strings.IndexByte(route, ' '); i >= 0 {
			route = strings.TrimLeft(route[i+1:], " \t")
		}
	}
	if route == "" {
		return unmatched
	}
	return route
}
