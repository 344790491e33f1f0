// Package observability checks, on the real stores (SQLite, PostgreSQL,
// Redis), that the metrics of idemprom say exactly what happened after a
// known workload, and that idemotel's spans and metrics do too.
package observability
