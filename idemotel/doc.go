// Package idemotel reports what idem does to OpenTelemetry: spans and
// metrics.
//
// New returns a Tracer on an OpenTelemetry TracerProvider and
// MeterProvider (the global ones by default). Set it as the tracer of the
// engine (idem.Config.Tracer), of the janitor (idemjanitor.Config.Tracer)
// and of idemclient's Transport (Transport.Tracer); idemhttp and ideminbox
// find it on their engine. You get one span per idempotent request
// (idem.request) or message (idem.message) with its outcome, whether it
// was replayed, the store, and a short hash of the key (never the key;
// the tenant only when Config.RecordTenant is set); a child span per
// store call; the handler's own spans as children of the request's, since
// the context the handler gets carries that span; one span per client
// attempt with http.request.resend_count. The metrics are idemprom's,
// dotted (idem.requests, idem.store.operation.duration, …).
//
// docs/OBSERVABILITY.md lists every span, attribute and metric.
package idemotel
