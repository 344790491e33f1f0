// Package idemproxy is a reverse proxy (net/http/httputil.ReverseProxy)
// that puts idem's Idempotency-Key contract in front of an HTTP service
// written in any language, through the idemhttp middleware: the first
// request with a key is forwarded, and every retry with the same key and
// the same request gets the upstream's first answer back, marked
// Idempotent-Replayed: true, without reaching the upstream again.
//
//	engine, _ := idem.NewEngine(store, nil)
//	p, _ := idemproxy.New(engine, &idemproxy.Config{
//		Upstream:   upstreamURL,
//		Routes:     []string{"POST /orders"},
//		Middleware: idemhttp.Config{TenantFunc: idemproxy.HeaderTenant("X-Tenant")},
//	})
//	http.ListenAndServe(addr, p)
//
// `idem proxy` is this package as a command.
//
// # What the proxy cannot give
//
// The upstream's own database writes and the stored answer are not one
// transaction: the proxy cannot join it. Between the upstream's commit
// and the record's, a crash of the proxy leaves the key in flight until
// its lease ends, and a retry then runs the request again: the upstream
// receives the same Idempotency-Key each time, so that it can deduplicate
// that window itself.
//
// # Each failure
//
//   - The upstream is unreachable (no connection): nothing ran. The key
//     is released and the client gets 502 upstream-unreachable with
//     Retry-After.
//   - The request was sent and no whole answer came back (a timeout,
//     Config.UpstreamTimeout; a connection lost; an answer that broke
//     off): the outcome is unknown. Nothing is stored, the key stays in
//     flight until its lease ends (idem.OutcomeUnknown), the client gets
//     504 or 502 upstream-outcome-unknown; a retry after the lease runs
//     again.
//   - The upstream answers 5xx: stored and replayed, or released with
//     Middleware.ReleaseOn5xx; 404, 405, 429, 307 and 308 are sent and
//     released (idemhttp.DefaultUnstoredStatuses).
//   - The proxy dies mid-request: the lease ends, and a retry runs again.
//
// # Streams and large answers
//
// An answer is held until it ends and stored whole, up to
// Middleware.MaxResponseBody. A text/event-stream answer, one that
// declares a larger Content-Length, and one that grows past the limit,
// are passed through to the client as they come, never stored truncated:
// the operation ran, so its key is kept, and completed with the marker
// answer-not-stored under the answer's status, which every retry gets.
// Config.BufferOnly refuses such answers as idemhttp does instead (500,
// key released). A chunked answer that never ends and stays under the
// limit is held until it does: route streams around the proxy, or send
// them as text/event-stream.
//
// Deployment and guarantees, window by window: docs/PROXY.md.
package idemproxy
