package idemstoretest_test

import (
	"context"
	"flag"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/idem-go/idem/idemstoretest"
)

var runMutants = flag.Bool("idemstoretest.mutants", false,
	"run the suite against stores with planted bugs, and fail if it misses one (slow: one test binary per bug)")

// mutantEnv names the bug the child process plants.
const mutantEnv = "IDEMSTORETEST_MUTANT"

// mutants are the planted bugs, each with the case of the suite that must
// catch it.
var mutants = map[string]struct {
	bugs   bugs
	caught string // the subtest of Exercise that must fail
}{
	"racyClaim":              {bugs{racyClaim: true}, "Claim/Race"},
	"noFence":                {bugs{noFence: true}, "Fencing/CompleteWrongToken"},
	"takeoverAnyFingerprint": {bugs{takeoverAnyFingerprint: true}, "Lease/NoTakeoverWithOtherFingerprint"},
	"ignoreRetention":        {bugs{ignoreRetention: true}, "Retention/CompleteExpires"},
	"purgeLiveLeases":        {bugs{purgeLiveLeases: true}, "Purge/BoundedBatches"},
	"purgeNoLimit":           {bugs{purgeNoLimit: true}, "Purge/BoundedBatches"},
	"joinedID":               {bugs{joinedID: true}, "Tenants/NoCollisions"},
	"foldCase":               {bugs{foldCase: true}, "Claim/AwkwardKeys"},
	"truncateBody":           {bugs{truncateBody: true}, "Bodies/Large"},
	"extendKeepsRetention":   {bugs{extendKeepsRetention: true}, "Lease/ExtendKeepsKey"},
	"ignoreCtx":              {bugs{ignoreCtx: true}, "StoreErrors/CancelledClaimFails"},
	"releaseAny":             {bugs{releaseAny: true}, "Fencing/ReleaseWrongToken"},
	"keepWritesOnLostLease":  {bugs{keepWritesOnLostLease: true}, "Transactions/TakeoverByPeerRollsBack"},
	"racyTakeover":           {bugs{racyTakeover: true}, "Claim/RaceOverExpired"},
	"completeTwice":          {bugs{completeTwice: true}, "Fencing/CompleteTwice"},
	"extendNoop":             {bugs{extendNoop: true}, "Engine/HeartbeatKeepsKey"},
	"aliasBody":              {bugs{aliasBody: true}, "Bodies/NoAliasing"},
	"purgeStaleSnapshot":     {bugs{purgeStaleSnapshot: true}, "Purge/RacesClaims"},
	"stepsNoFence":           {bugs{stepsNoFence: true}, "Steps/SaveStepFenced"},
	"stepsLastValue":         {bugs{stepsLastValue: true}, "Steps/FirstValueKept"},
	"stepAliasValue":         {bugs{stepAliasValue: true}, "Steps/FirstValueKept"},
	"racySaveStep":           {bugs{racySaveStep: true}, "Steps/ConcurrentSaves"},
	"stepsInUnit":            {bugs{stepsInUnit: true}, "Steps/OutsideUnitOfWork"},
	"stepsIgnoreTenant":      {bugs{stepsIgnoreTenant: true}, "Steps/Tenants"},
	"releaseDropsSteps":      {bugs{releaseDropsSteps: true}, "Steps/SurviveRelease"},
	"releaseKeepsLease":      {bugs{releaseKeepsLease: true}, "Steps/SurviveRelease"},
	"takeoverDropsSteps":     {bugs{takeoverDropsSteps: true}, "Steps/Takeover"},
	"takeoverFlagAlways":     {bugs{takeoverFlagAlways: true}, "Steps/Takeover"},
	"expiredKeepsSteps":      {bugs{expiredKeepsSteps: true}, "Steps/ExpiredForgetsSteps"},
	"purgeSkipsStepped":      {bugs{purgeSkipsStepped: true}, "Steps/Purge"},
}

// TestMutants proves the suite can fail: each planted bug must make the
// case named in mutants fail. Each bug runs in a child test binary, since
// a failing subtest cannot be caught in process.
func TestMutants(t *testing.T) {
	if !*runMutants {
		t.Skip("skipping: pass -idemstoretest.mutants to run the suite against planted bugs")
	}
	for name, m := range mutants {
		t.Run(name, func(t *testing.T) {
			area, _, _ := strings.Cut(m.caught, "/")
			cmd := exec.Command(os.Args[0], "-test.run=^TestMutantChild$/^"+area+"$", "-test.count=1", "-test.v")
			cmd.Env = append(os.Environ(), mutantEnv+"="+name)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the suite passed a store with bug %s:\n%s", name, out)
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
	idemstoretest.Exercise(context.Background(), t, func(t *testing.T) *idemstoretest.Fixture {
		s := newRefStore(m.bugs)
		return &idemstoretest.Fixture{Store: s, Peer: s, BusinessWrite: s.businessWrite, BusinessCount: s.businessCount}
	}, idemstoretest.Capabilities{Transactional: true})
}
