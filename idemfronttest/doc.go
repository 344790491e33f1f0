// Package idemfronttest is the conformance suite of idem's front ends, as
// idemstoretest is that of its stores: every front end (idemhttp, and the
// gRPC, Connect, Gin, Echo, Fiber and proxy front ends) runs the same
// behaviours through Exercise, against the real front end over its real
// transport, so that each one keeps the one contract whatever its
// protocol.
//
// A front end implements Harness: Serve starts it over an engine,
// protecting a Handler given in neutral terms (a body in, a body out, or
// a rejection, or a transient failure), and returns a Client that sends a
// Call (tenant, key, body) and reads the answer back as a Reply, in the
// kit's words (idemfront.Kind: executed, replayed with the marker, in
// flight, mismatch, store unavailable, invalid key, …):
//
//	func TestConformance(t *testing.T) {
//		idemfronttest.Exercise(t, harness{}, idemfronttest.Features{}, nil)
//	}
//
// The last argument gives each case its store; nil uses idemmem. A
// module that may import database drivers passes a transactional store
// with the two functions that write and count business rows, and the
// suite then checks that the handler's writes commit with its answer and
// roll back with its failures.
//
// # Areas
//
// Duplicates (released at one barrier: one execution), Replay (byte for
// byte, with the marker), InFlight (the front end's "retry later", with
// its delay), Mismatch (another request under the key: nothing runs),
// StoreDown (unavailable, the handler not run; a failed completion),
// Tenants (kept apart; an unusable tenant refused, never as a store
// outage), Keys, Limits, Failures (panics, runtime.Goexit, transient
// answers never stored), Transactions, Wait and Disconnect (the handler
// runs on, its answer stored). Each is a subtest of Exercise, so that
// `go test -run TestConformance/Replay` runs one; the cases of an area
// run in parallel, each under a tenant of its own.
//
// # Features
//
// A front end that cannot do something says so in Features; the cases
// that need it are skipped with a logged reason, never silently passed.
//
// # Trusting the suite
//
// The package's own tests run the suite against a small in-process
// front end built on idemfront, then against copies of it with one bug
// planted each (a replay without its marker, a transient answer stored, a
// mismatch replayed, the handler run while the store is down, tenants
// ignored, a handler cancelled with its caller, …), and fail if one goes
// unnoticed.
package idemfronttest
