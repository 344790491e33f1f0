package crashtest

import (
	"testing"
)

// TestCrashSingleTransaction is TestCrash on PostgreSQL with `idem serve
// --single-transaction`: the claim is the first statement of the order's
// transaction and its lock is the lease. Killed with SIGKILL before the
// commit, the process leaves nothing (PostgreSQL rolls its transaction
// back when its connection dies, and frees the key); killed after it, the
// committed answer is replayed. Either way the retrying client gets one
// order and a 201.
func TestCrashSingleTransaction(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping: builds the idem binary and kills it repeatedly (-short)")
	}
	if *iterations < 1 {
		t.Fatalf("-crashtest.iterations=%d: want at least 1", *iterations)
	}
	st := openPostgres(t)
	st.bin = idemBinary(t)
	st.addr = "127.0.0.1:0"
	st.serveArgs, st.single = []string{"--single-transaction", "--wait-in-flight", "5s"}, true
	for _, point := range points {
		t.Run(point, func(t *testing.T) {
			var s stats
			for i := range *iterations {
				st.crashOnce(t, point, i, &s)
				if t.Failed() {
					return
				}
			}
			t.Logf("postgres --single-transaction %s: %s", point, &s)
		})
	}
}
