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
//
// The recovery-point tests (steps_test.go) kill a payment process instead:
// the test binary itself, started again as a child, which runs a payment
// of two recorded steps (idem.Step: a charge, then a receipt, each a call
// to a card network stood for by tables written outside idem) and a
// business write on PostgreSQL, and stops at a kill point (after the
// charge is recorded, after the receipt is recorded, before the
// completion), where the test sends it SIGKILL. New processes retry the
// payment with the same key until one completes it; each step must have
// run once per key. A last test kills the process inside the charge, once
// the card network has made it and before idem records it: the one window
// recovery points leave, where the retry calls the network again, with the
// same downstream key (idem.DownstreamKey), and gets the first charge back.
//
// The package holds tests only; the counts of runs and what was lost are
// in docs/RELIABILITY.md, with the commands to rerun them.
//
// # Flags
//
//	-crashtest.iterations=N   iterations per kill point per store (default 3)
//	-crashtest.stepkeys=N     keys per kill point in the recovery-point
//	                          tests (default 20)
package crashtest
