package idemdynamo_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdynamo"
)

// TestLateHolderRefused: an execution whose lease ended and whose key was
// taken over can no longer release, extend, record a step or complete:
// every write of the holder is fenced by its token. (A store that
// checked no owner on delete would let the late holder free the key of
// the execution running now.)
func TestLateHolderRefused(t *testing.T) {
	endpoint := dynaliteEndpoint(t)
	table := newTable(t, endpoint)
	late, taker := newStore(t, endpoint, table, noSkew), newStore(t, endpoint, table, noSkew)
	ctx := context.Background()
	old := idem.ClaimParams{Tenant: "t1", Key: "order-1", Fingerprint: []byte("a"), Token: 11, Lease: 100 * time.Millisecond, Retention: time.Hour}
	if res, err := late.Claim(ctx, old); err != nil || !res.Won {
		t.Fatalf("first claim: %+v, %v", res, err)
	}
	time.Sleep(250 * time.Millisecond)
	next := old
	next.Token, next.Lease = 22, time.Hour
	if res, err := taker.Claim(ctx, next); err != nil || !res.Won || !res.Takeover {
		t.Fatalf("takeover: %+v, %v", res, err)
	}

	if err := late.Release(ctx, idem.ReleaseParams{Tenant: "t1", Key: "order-1", Token: old.Token}); err != nil {
		t.Fatalf("late Release: %v", err)
	}
	if err := late.Extend(ctx, idem.ExtendParams{Tenant: "t1", Key: "order-1", Token: old.Token, Lease: time.Hour}); !errors.Is(err, idem.ErrLeaseLost) {
		t.Errorf("late Extend = %v, want idem.ErrLeaseLost", err)
	}
	if err := late.SaveStep(ctx, idem.SaveStepParams{Tenant: "t1", Key: "order-1", Token: old.Token, Name: "charge", Value: []byte(`1`)}); !errors.Is(err, idem.ErrLeaseLost) {
		t.Errorf("late SaveStep = %v, want idem.ErrLeaseLost", err)
	}
	unit, _ := late.Begin(ctx)
	if err := unit.Complete(ctx, idem.CompleteParams{Tenant: "t1", Key: "order-1", Token: old.Token, Result: idem.Result{Status: 201}}); !errors.Is(err, idem.ErrLeaseLost) {
		t.Errorf("late Complete = %v, want idem.ErrLeaseLost", err)
	}
	rec, err := taker.Get(ctx, "t1", "order-1")
	if err != nil {
		t.Fatalf("Get after the late holder's writes: %v", err)
	}
	if rec.State != idem.StateInFlight || rec.LeaseToken != next.Token || len(rec.Steps) != 0 {
		t.Fatalf("record after the late holder's writes: %s under %d with %d steps, want in flight under the taker's %d and no step",
			rec.State, rec.LeaseToken, len(rec.Steps), next.Token)
	}
}

// TestLostLeaseCancelsBusinessItems: through the engine, a handler adds a
// business item to its unit of work and stalls past its lease; another
// process takes the key over and completes. The stalled completion is
// refused, and its business item was never written: the record and the
// item go in one TransactWriteItems, which the fence cancels whole.
// minidyn, since dynalite has no TransactWriteItems.
func TestLostLeaseCancelsBusinessItems(t *testing.T) {
	endpoint := minidynEndpoint(t)
	table, orders := newTable(t, endpoint), newOrdersTable(t, endpoint)
	cfg := noSkew
	cfg.Transactional = true
	slow, fast := newStore(t, endpoint, table, cfg), newStore(t, endpoint, table, cfg)
	// No heartbeat: the slow handler is meant to lose its lease.
	slowEngine, err := idem.NewEngine(slow, &idem.Config{Lease: 200 * time.Millisecond, Heartbeat: -1})
	if err != nil {
		t.Fatal(err)
	}
	fastEngine, err := idem.NewEngine(fast, &idem.Config{Lease: 200 * time.Millisecond, Heartbeat: -1})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	op := idem.Operation{Tenant: "t1", Key: "order-1", Fingerprint: []byte("a")}
	added, resume := make(chan struct{}), make(chan struct{})
	slowDone := make(chan error, 1)
	go func() {
		_, err := slowEngine.Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
			if err := addOrder(ctx, orders, "slow"); err != nil {
				return idem.Result{}, err
			}
			close(added)
			<-resume
			return idem.Result{Status: 201, Body: []byte("slow")}, nil
		})
		slowDone <- err
	}()
	<-added
	time.Sleep(400 * time.Millisecond) // the slow lease (200ms) has ended
	out, err := fastEngine.Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
		if err := addOrder(ctx, orders, "fast"); err != nil {
			return idem.Result{}, err
		}
		return idem.Result{Status: 201, Body: []byte("fast")}, nil
	})
	if err != nil || string(out.Result.Body) != "fast" {
		t.Fatalf("takeover: %+v, %v", out, err)
	}
	close(resume)
	if err := <-slowDone; !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("the slow execution = %v, want idem.ErrLeaseLost", err)
	}
	client := newClient(endpoint)
	for id, want := range map[string]int{"slow": 0, "fast": 1} {
		n, err := countOrder(ctx, client, orders, id)
		if err != nil {
			t.Fatal(err)
		}
		if n != want {
			t.Errorf("business item %q: %d, want %d", id, n, want)
		}
	}
	rec, err := fast.Get(ctx, "t1", "order-1")
	if err != nil || rec.State != idem.StateComplete || string(rec.Result.Body) != "fast" {
		t.Fatalf("record: %+v, %v; want complete with the taker's answer", rec, err)
	}
}

// TestBusinessConditionFailsCompletion: a business write whose own
// condition fails (the order exists already) cancels the transaction,
// record included; the engine reports the error and releases the key for
// a retry, and the existing item is left as it was.
func TestBusinessConditionFailsCompletion(t *testing.T) {
	endpoint := minidynEndpoint(t)
	table, orders := newTable(t, endpoint), newOrdersTable(t, endpoint)
	cfg := noSkew
	cfg.Transactional = true
	store := newStore(t, endpoint, table, cfg)
	engine, err := idem.NewEngine(store, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	client := newClient(endpoint)
	orderKey := map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "order#x"}}
	if _, err := client.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(orders), Item: map[string]types.AttributeValue{
		"pk": orderKey["pk"], "v": &types.AttributeValueMemberS{Value: "first"},
	}}); err != nil {
		t.Fatal(err)
	}
	op := idem.Operation{Tenant: "t1", Key: "order-1"}
	_, err = engine.Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
		w := idemdynamo.Tx(ctx)
		err := w.Add(types.TransactWriteItem{Put: &types.Put{
			TableName:           aws.String(orders),
			Item:                map[string]types.AttributeValue{"pk": orderKey["pk"], "v": &types.AttributeValueMemberS{Value: "second"}},
			ConditionExpression: aws.String("attribute_not_exists(pk)"),
		}})
		if w.Len() != 1 {
			t.Errorf("Writes.Len() = %d, want 1", w.Len())
		}
		return idem.Result{Status: 201}, err
	})
	if err == nil || errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("Do with a failing business condition = %v, want an error other than idem.ErrLeaseLost", err)
	}
	got, err := client.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(orders), Key: orderKey, ConsistentRead: aws.Bool(true)})
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := got.Item["v"].(*types.AttributeValueMemberS); v == nil || v.Value != "first" {
		t.Errorf("business item after a cancelled transaction: %v, want the first one untouched", got.Item)
	}
	if _, err := store.Get(ctx, "t1", "order-1"); !errors.Is(err, idem.ErrNotFound) {
		t.Errorf("record after a cancelled transaction: %v, want released (idem.ErrNotFound)", err)
	}
}

// TestTxOutsideExecution: outside an execution Tx is nil and Add says
// that nothing would commit the writes, instead of dropping them.
func TestTxOutsideExecution(t *testing.T) {
	w := idemdynamo.Tx(context.Background())
	if w != nil {
		t.Fatalf("Tx outside an execution = %v, want nil", w)
	}
	if err := w.Add(types.TransactWriteItem{}); !errors.Is(err, idemdynamo.ErrNoUnitOfWork) {
		t.Fatalf("Add outside an execution = %v, want ErrNoUnitOfWork", err)
	}
	if w.Len() != 0 {
		t.Fatal("Len of no unit of work is not 0")
	}
}
