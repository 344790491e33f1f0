// Package idemprom exports idem's metrics to Prometheus.
package idemprom
