package idempg_test

import (
	"context"
	"errors"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idempg"
	"github.com/jackc/pgx/v5/pgconn"
)

// TestSingleTransactionAbortedOnFreshConnection: a handler whose failed
// statement aborted its transaction and that answers 409 gets that answer
// stored alone, also on a connection that has not completed an execution
// before. Complete prepares its INSERT once per connection, and a PREPARE
// sent into the aborted transaction is refused (25P02): the answer was
// lost and Do failed with a store error.
func TestSingleTransactionAbortedOnFreshConnection(t *testing.T) {
	for _, replace := range []bool{false, true} {
		name := "fresh key"
		if replace {
			name = "record past retention"
		}
		t.Run(name, func(t *testing.T) {
			// A new pool: none of its connections has prepared anything.
			e, eng := newSingleEnv(t, 2)
			ctx := context.Background()
			op := idem.Operation{Key: "aborted-fresh", Fingerprint: []byte("f")}
			if replace {
				if _, err := e.pool.Exec(ctx, `INSERT INTO idem_keys (tenant_id, idem_key, fingerprint, state, lease_token,
					locked_until, storage_mode, status_code, created_at, completed_at, expires_at)
					VALUES ('', $1, 'old', 'complete', 1, now(), 1, 200, now() - interval '2 days', now() - interval '2 days', now() - interval '1 day')`,
					op.Key); err != nil {
					t.Fatal(err)
				}
			}
			out, err := eng.Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
				if err := insertOrder(ctx, op.Key); err != nil {
					return idem.Result{}, err
				}
				_, err := idempg.TxFromContext(ctx).Exec(ctx, `SELECT 1/0`)
				var pgErr *pgconn.PgError
				if !errors.As(err, &pgErr) {
					t.Fatalf("want a server error, got %v", err)
				}
				return idem.Result{Status: 409}, nil
			})
			if err != nil || out.Result.Status != 409 {
				t.Fatalf("Do = %+v, %v; want the 409 stored", out, err)
			}
			rec, err := e.store.Get(ctx, "", op.Key)
			if err != nil || rec.State != idem.StateComplete || rec.Result.Status != 409 {
				t.Fatalf("Get = %+v, %v; want the 409 complete", rec, err)
			}
			if n := e.countOrders(t, op.Key); n != 0 {
				t.Errorf("%d orders, want the aborted write undone", n)
			}
			if n := e.heldLocks(t); n != 0 {
				t.Errorf("%d advisory locks still held", n)
			}
		})
	}
}
