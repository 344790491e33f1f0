// Package idemprom counts what idem does in Prometheus metrics.
//
// NewCollector returns a Collector, registered with a Prometheus
// registry. Set it as the tracer of the engine (idem.Config.Tracer), of
// the janitor (idemjanitor.Config.Tracer) and of idemclient's Transport
// (Transport.Tracer); idemhttp and ideminbox find it on their engine. You
// get the requests by outcome, method and route, the time handlers take
// to run and commit, every store call's duration, the keys in flight, lost
// leases, takeovers, heartbeat failures, purges, replay ages, stored
// sizes, inbox messages and client attempts and retries. No metric
// carries a tenant or a key; label children are made ahead, so an
// observation costs no allocation.
//
// docs/OBSERVABILITY.md lists every metric, what it means, and alert
// rules.
package idemprom
