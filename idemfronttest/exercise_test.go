package idemfronttest_test

import (
	"testing"

	"github.com/idem-go/idem/idemfronttest"
)

// TestExercise runs the suite on the reference front end over idemmem, so
// that every case is known to pass on a correct front end before a real
// one meets it.
func TestExercise(t *testing.T) {
	idemfronttest.Exercise(t, refHarness{}, idemfronttest.Features{}, nil)
}
