// Package demo is the orders API that `idem serve` runs: a small orders
// service (POST /orders, GET /orders, GET /orders/{id}),
// wired to idem as an application would be. Authentication sits in front
// of the idempotency layer; idemhttp is mounted on the one route it
// protects, after routing, so that routing answers (404, 405, redirects)
// never reach it; the order is written in the transaction of the stored
// answer (idemsql.DB, idempg.DB); validation failures are answered with
// idem.NotExecuted, so they are sent but never stored.
//
// It is internal: an example to read and a service to test against, whose
// handlers, table and settings change with the demo. Nothing outside this
// module can import it, so no program comes to depend on it.
package demo
