package demo

// Crash injection, for tests/crashtest only. The crash tests prove that
// a process killed with SIGKILL at any step of a request loses nothing:
// they build cmd/idem with the build tag idemfaults and start `idem serve`
// with
//
//	IDEM_FAULT=after-claim|after-write|after-commit
//	IDEM_FAULT_KEY=<an Idempotency-Key>
//
// and the process kills itself, with no chance to clean up, when the
// request carrying that key reaches that step. The hook itself is in
// faults.go, compiled only with the tag; a release build has
// faults_off.go instead, where injectFault does nothing and the variables
// are ignored.

// Environment variables of the crash injection.
const (
	envFault    = "IDEM_FAULT"
	envFaultKey = "IDEM_FAULT_KEY"
)

// faultPoint is a step of a request at which an armed server kills itself.
type faultPoint string

const (
	// faultAfterClaim: the handler starts. The claim is committed (the
	// key is in flight under a lease); nothing else is, and the handler's
	// transaction is open but empty.
	faultAfterClaim faultPoint = "after-claim"
	// faultAfterWrite: the order is inserted through the handler's
	// transaction, which is not committed yet.
	faultAfterWrite faultPoint = "after-write"
	// The third point, after-commit, is not the handler's to call: the
	// hook (faults.go) kills the process when the answer starts, after
	// idemhttp's commit.
)
