package ideminbox

import (
	"context"
	"errors"
	"time"

	"github.com/idem-go/idem"
)

// AwaitStore blocks until the store takes a claim again, trying every
// StoreRetryInterval, or until ctx ends (then it returns ctx's error). An
// adapter calls it while it holds a delivery that Process answered Hold
// with a store error (Decision.AwaitsStore), and takes no new message
// meanwhile: none could be processed. Once the inbox is closed it returns
// idem.ErrClosed.
func (in *Inbox) AwaitStore(ctx context.Context) error {
	for {
		switch err := in.checkStore(ctx); {
		case err == nil:
			return nil
		case errors.Is(err, idem.ErrClosed):
			return err
		}
		t := time.NewTimer(in.config.StoreRetryInterval)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
}

// checkStore claims and releases probeKey, and returns the store's error
// (a *idem.StoreError) if that failed, or idem.ErrClosed once the inbox
// is closed. A claim lost to another check counts as an answer.
func (in *Inbox) checkStore(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, in.engine.Config().CleanupTimeout)
	defer cancel()
	_, err := in.engine.Do(ctx, idem.Operation{Tenant: in.tenant, Key: probeKey}, func(ctx context.Context) (idem.Result, error) {
		idem.NotExecuted(ctx)
		return idem.Result{Mode: idem.ModeMarker}, nil
	})
	if err == nil || errors.Is(err, idem.ErrInFlight) {
		return nil
	}
	if errors.Is(err, idem.ErrClosed) {
		return err
	}
	if !errors.Is(err, idem.ErrStore) {
		err = &idem.StoreError{Op: "check", Err: err}
	}
	in.storeEpoch.Add(1)
	return err
}
