package idem_test

import (
	"context"
	"errors"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
)

// TestOutcomeUnknown: an execution marked OutcomeUnknown stores nothing
// whatever its function returns, and its key stays in flight for a retry.
func TestOutcomeUnknown(t *testing.T) {
	engine, err := idem.NewEngine(idemmem.NewStore(nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer engine.Close(context.Background()) //nolint:errcheck // test
	op := idem.Operation{Key: "k", Fingerprint: []byte("f")}
	cause := errors.New("upstream silent")
	_, err = engine.Do(t.Context(), op, func(ctx context.Context) (idem.Result, error) {
		if !idem.OutcomeUnknown(ctx, cause) {
			t.Error("OutcomeUnknown found no execution")
		}
		return idem.Result{Status: 201}, nil
	})
	if !errors.Is(err, idem.ErrOutcomeUnknown) || !errors.Is(err, cause) {
		t.Fatalf("Do returned %v, want ErrOutcomeUnknown wrapping the cause", err)
	}
	_, err = engine.Do(t.Context(), op, func(context.Context) (idem.Result, error) {
		t.Error("the retry ran while the key was held")
		return idem.Result{}, nil
	})
	if !errors.Is(err, idem.ErrInFlight) {
		t.Fatalf("the retry: %v, want ErrInFlight", err)
	}
	if idem.OutcomeUnknown(context.Background(), cause) {
		t.Error("OutcomeUnknown outside an execution reported one")
	}
}
