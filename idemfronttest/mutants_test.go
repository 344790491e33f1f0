package idemfronttest_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/idem-go/idem/idemfronttest"
)

// mutantEnv names the bug the child process plants.
const mutantEnv = "IDEMFRONTTEST_MUTANT"

// mutants are the planted bugs, each with the case of the suite that must
// catch it.
var mutants = map[string]struct {
	bugs   bugs
	caught string // the subtest of Exercise that must fail
}{
	"noMarker":           {bugs{noMarker: true}, "Replay/ByteForByte"},
	"replayTrimmed":      {bugs{replayTrimmed: true}, "Replay/ByteForByte"},
	"storesTransient":    {bugs{storesTransient: true}, "Failures/TransientNotStored"},
	"noFingerprint":      {bugs{noFingerprint: true}, "Mismatch/AfterCompletion"},
	"mismatchAsInFlight": {bugs{mismatchAsInFlight: true}, "Mismatch/WhileInFlight"},
	"runWhenStoreDown":   {bugs{runWhenStoreDown: true}, "StoreDown/HandlerNotRun"},
	"runsInFlight":       {bugs{runsInFlight: true}, "InFlight/RetryLater"},
	"tenantIgnored":      {bugs{tenantIgnored: true}, "Tenants/Isolated"},
	"noTenantCheck":      {bugs{noTenantCheck: true}, "Tenants/Invalid"},
	"cancelOnDisconnect": {bugs{cancelOnDisconnect: true}, "Disconnect/HandlerRunsOn"},
	"noRetryAfter":       {bugs{noRetryAfter: true}, "InFlight/RetryLater"},
	"noWait":             {bugs{noWait: true}, "Wait/DuplicatesGetTheAnswer"},
	"noRequestLimit":     {bugs{noRequestLimit: true}, "Limits/Request"},
	"truncateResponse":   {bugs{truncateResponse: true}, "Limits/Response"},
	"recoversPanic":      {bugs{recoversPanic: true}, "Failures/Panic"},
}

// TestMutants proves the suite can fail: each planted bug must make the
// case named in mutants fail. Each bug runs in a child test binary, since
// a failing subtest cannot be caught in process; the reference front end
// answers in process, so the whole run takes a few seconds.
func TestMutants(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping in -short mode: one test binary per planted bug")
	}
	if os.Getenv(mutantEnv) != "" {
		t.Skip("skipping: a child of TestMutants")
	}
	for name, m := range mutants {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			area, _, _ := strings.Cut(m.caught, "/")
			cmd := exec.Command(os.Args[0], "-test.run=^TestMutantChild$/^"+area+"$", "-test.count=1", "-test.v")
			cmd.Env = append(os.Environ(), mutantEnv+"="+name)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the suite passed a front end with bug %s:\n%s", name, out)
			}
			if !strings.Contains(string(out), "--- FAIL: TestMutantChild/"+m.caught+" ") {
				t.Fatalf("bug %s did not fail %s:\n%s", name, m.caught, out)
			}
		})
	}
}

// TestMutantChild runs the suite against the bug TestMutants names; it
// does nothing in a normal run.
func TestMutantChild(t *testing.T) {
	name := os.Getenv(mutantEnv)
	if name == "" {
		t.Skip("skipping: runs only as a child of TestMutants")
	}
	m, ok := mutants[name]
	if !ok {
		t.Fatalf("unknown mutant %q", name)
	}
	idemfronttest.Exercise(t, refHarness{bugs: m.bugs}, idemfronttest.Features{}, nil)
}
