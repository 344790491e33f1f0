// Package idemstoretest is the conformance suite of idem.Store: every store
// runs the same behaviours through Exercise, so that the engine and the
// front ends can rely on the contract written in idem.Store's doc comments,
// whatever the database.
//
//	func TestConformance(t *testing.T) {
//		idemstoretest.Exercise(context.Background(), t, func(t *testing.T) *idemstoretest.Fixture {
//			return &idemstoretest.Fixture{
//				Store:         store,
//				Peer:          peer, // same database, another pool
//				BusinessWrite: insertOrder,
//				BusinessCount: countOrders,
//			}
//		}, idemstoretest.Capabilities{Transactional: true})
//	}
//
// # Areas
//
// Each area of the contract lives in its own file and runs as a subtest of
// Exercise: Claim, Fencing, Lease, Retention, Purge, Tenants, Bodies,
// Transactions, Engine, Steps, Wait, StoreErrors and Listing (run when the
// store implements idemkeys.Lister), so that `go test -run
// TestConformance/Lease` runs one. Inside an area the cases run in
// parallel, each under tenants of its own, so fixtures may share one
// database. The areas run one after the other, and the Purge cases alone:
// a purge deletes the expired records of every tenant.
//
// # Concurrency
//
// Duplicates are tested at the same instant: dozens of goroutines released
// by one barrier claim one key (fresh, abandoned by a dead execution, or
// past retention), half of them through Fixture.Peer when the store has
// one: a second handle on the same database, as a second process would
// hold. Completions race each other, and purges race claims. Sequential
// duplicates alone prove nothing.
//
// # Time
//
// Leases and retention are decided by the store's clock, so the suite
// sleeps past short leases (a few hundred milliseconds) instead of moving
// a fake clock. It never asserts how long something took. A run takes a
// few seconds, most of it spent waiting for leases to end.
//
// # Capabilities
//
// A store declares what it can and cannot do in Capabilities; the cases
// that need something it lacks are skipped with a logged reason, never
// silently passed. Recovery points (idem.StepStore) are expected of every
// store: the Steps area fails a store that does not implement
// idem.StepStore unless it runs with Capabilities.NoSteps.
//
// # Trusting the suite
//
// The package's own tests run the suite against a small reference store,
// then, with -idemstoretest.mutants, against copies of it with one bug
// planted each (a racy claim, a missing fence, a purge that deletes live
// records, tenants that collide, ...), and fail if a bug goes unnoticed.
package idemstoretest
