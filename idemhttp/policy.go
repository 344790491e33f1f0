package idemhttp

import (
	"net/http"
	"slices"
	"time"

	"github.com/idem-go/idem"
)

// Policy is what a route may set for itself, apart from the rest of the
// middleware's Config: read a middleware's with Middleware.Policy, change
// what the route needs and derive the route's middleware with
// Middleware.With. Each field means what the Config field of the same
// name means, and its zero value the same default.
type Policy struct {
	// Engine runs the route's requests; nil is the middleware's. The lease
	// and the retention belong to an engine (its heartbeat is paced by its
	// lease), so a route that needs another one (a handler that runs for
	// minutes, records kept for a week) gets an engine of its own, built
	// over the same store with that idem.Config. Keys live in the store,
	// so the routes still share the tenants' key spaces.
	Engine *idem.Engine

	// Methods are the request methods covered (Config.Methods).
	Methods []string
	// Mode and ReplayFunc say what is stored and how it is replayed
	// (Config.Mode, Config.ReplayFunc).
	Mode       idem.StorageMode
	ReplayFunc func(w http.ResponseWriter, r *http.Request, res idem.Result)
	// WaitInFlight is how long a duplicate waits for the execution in
	// flight (Config.WaitInFlight).
	WaitInFlight time.Duration
	// ReleaseOn5xx releases the key after a 5xx instead of storing it
	// (Config.ReleaseOn5xx).
	ReleaseOn5xx bool
}

// Policy returns m's policy: its engine and the fields of its Config
// that a route may change.
func (m *Middleware) Policy() Policy {
	return Policy{
		Engine:       m.engine,
		Methods:      slices.Clone(m.config.Methods),
		Mode:         m.config.Mode,
		ReplayFunc:   m.config.ReplayFunc,
		WaitInFlight: m.config.WaitInFlight,
		ReleaseOn5xx: m.config.ReleaseOn5xx,
	}
}

// With returns a middleware that is m under policy p: the same tenant
// rule, key source, fingerprint, limits, headers and hooks, the policy's
// engine, methods, storage mode, wait and 5xx rule. It is what a route
// that needs its own policy is wrapped in, as a router's per-route
// middleware (with chi: r.With(payments.Handler).Post(...)). Start from
// m.Policy() so that the fields the route does not change keep m's value:
// in a Policy literal, a field left out means its Config default, not
// m's. With returns an error when the policy is unusable, as NewMiddleware
// does.
func (m *Middleware) With(p Policy) (*Middleware, error) {
	engine := p.Engine
	if engine == nil {
		engine = m.engine
	}
	cfg := m.config
	cfg.Methods = slices.Clone(p.Methods)
	cfg.Mode = p.Mode
	cfg.ReplayFunc = p.ReplayFunc
	cfg.WaitInFlight = p.WaitInFlight
	cfg.ReleaseOn5xx = p.ReleaseOn5xx
	return NewMiddleware(engine, &cfg)
}
