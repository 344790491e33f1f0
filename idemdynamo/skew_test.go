package idemdynamo_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdynamo"
)

// TestClockSkew: DynamoDB has no clock a request can read, so each
// process decides leases with its own. Two engines share a table; the
// second's clock runs 1s ahead of the first's. The first holds a key
// under a 300ms lease, its handler still running.
//
// Without a margin (MaxClockSkew negative), the second process thinks
// the lease ended 700ms ago and takes the key over while its holder runs:
// two executions. With MaxClockSkew 1.5s, the second process gets
// idem.ErrInFlight, and takes the key over only once the lease has ended
// on the holder's clock too.
func TestClockSkew(t *testing.T) {
	endpoint := dynaliteEndpoint(t)
	ahead := func() time.Time { return time.Now().Add(time.Second) }
	for _, tc := range []struct {
		name     string
		skew     time.Duration
		takeover bool // at once, while the holder runs
	}{
		{"NoMargin", -1, true},
		{"MarginCoversSkew", 1500 * time.Millisecond, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			table := newTable(t, endpoint)
			holder := newStore(t, endpoint, table, idemdynamo.Config{MaxClockSkew: tc.skew})
			fast := newStore(t, endpoint, table, idemdynamo.Config{MaxClockSkew: tc.skew, NowFunc: ahead})
			lease := 300 * time.Millisecond
			holderEngine := newEngine(t, holder, &idem.Config{Lease: lease, Heartbeat: -1})
			fastEngine := newEngine(t, fast, &idem.Config{Lease: lease, Heartbeat: -1})

			ctx := context.Background()
			op := idem.Operation{Tenant: "t1", Key: "order-1", Fingerprint: []byte("a")}
			running, release := make(chan struct{}), make(chan struct{})
			holderDone := make(chan error, 1)
			var claimed time.Time
			go func() {
				_, err := holderEngine.Do(ctx, op, func(context.Context) (idem.Result, error) {
					close(running)
					<-release
					return idem.Result{Status: 201}, nil
				})
				holderDone <- err
			}()
			<-running
			claimed = time.Now()
			defer func() { close(release); <-holderDone }()

			runs := 0
			_, err := fastEngine.Do(ctx, op, func(context.Context) (idem.Result, error) {
				runs++
				return idem.Result{Status: 201}, nil
			})
			if tc.takeover {
				if err != nil || runs != 1 {
					t.Fatalf("without a margin, the process whose clock is ahead: runs=%d err=%v; want the (unsafe) takeover", runs, err)
				}
				return
			}
			if !errors.Is(err, idem.ErrInFlight) || runs != 0 {
				t.Fatalf("with MaxClockSkew covering the skew: runs=%d err=%v; want idem.ErrInFlight", runs, err)
			}
			// On the fast clock the lease ends at lease+skew-1s after the
			// claim; wait past that, with slack.
			time.Sleep(time.Until(claimed.Add(lease + tc.skew - time.Second + 300*time.Millisecond)))
			if time.Since(claimed) < lease {
				t.Fatal("the lease has not ended on the holder's clock yet")
			}
			_, err = fastEngine.Do(ctx, op, func(context.Context) (idem.Result, error) {
				runs++
				return idem.Result{Status: 201}, nil
			})
			if err != nil || runs != 1 {
				t.Fatalf("after the lease and the margin: runs=%d err=%v; want the takeover", runs, err)
			}
		})
	}
}

func newEngine(t testing.TB, st idem.Store, cfg *idem.Config) *idem.Engine {
	t.Helper()
	e, err := idem.NewEngine(st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close(context.Background()) })
	return e
}
