// Package crashtest kills `idem serve` with SIGKILL at each step of a
// request and checks, after a restart, that the retrying client got
// exactly one execution: the original answer when the commit had happened,
// a fresh one when nothing had, and never a second order or a key stuck in
// flight.
//
// The kill points come from the demo's test-only fault injection
// (cmd/idem/internal/demo/faults.go, IDEM_FAULT and IDEM_FAULT_KEY), compiled only
// into a binary built with the tag idemfaults, as these tests build it,
// and off unless a test sets those variables in the environment of the
// child process.
// The package holds tests only; the counts of runs and what was lost are
// in docs/RELIABILITY.md, with the commands to rerun them.
//
// # Flags
//
//	-crashtest.iterations=N   iterations per kill point per store (default 3)
package crashtest
