// Package reliability proves idem's guarantees under faults, end to end:
// real HTTP servers running idemhttp over real stores (SQLite files and
// PostgreSQL schemas), with leases lost under slow handlers, a store cut
// off in the middle of a load, hostile keys and bodies, two tenants
// sharing key names, and a mixed concurrent workload whose every request
// and answer is recorded and checked against the invariants at the end.
//
// It holds tests only; internal/tcpproxy is the loopback TCP proxy through
// which a test makes PostgreSQL unreachable and brings it back. The faults, the
// stores, the counts of runs and what was lost are listed, with the
// commands to rerun them, in docs/RELIABILITY.md.
//
// # Flags
//
//	-reliability.soak=2m    run the invariant workload for that long (off by default)
//	-reliability.mutant=X   break one guarantee on purpose (see mutants in
//	                        the tests); the scenario guarding it must fail
package reliability
