package idemdynamo_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdynamo"
)

// TestTTLAttribute: the item carries its retention end for DynamoDB's TTL,
// in seconds, MaxClockSkew after the end the store itself compares
// (milliseconds), so that AWS never deletes a record a process with a
// slower clock still replays; the heartbeat moves both when the lease
// would outlive the retention. Clocks are injected, so the values are
// exact.
func TestTTLAttribute(t *testing.T) {
	endpoint := dynaliteEndpoint(t)
	table := newTable(t, endpoint)
	now := time.UnixMilli(1_800_000_000_123)
	st := newStore(t, endpoint, table, idemdynamo.Config{MaxClockSkew: 2 * time.Second, NowFunc: func() time.Time { return now }})
	ctx := context.Background()
	p := idem.ClaimParams{Tenant: "t1", Key: "order-1", Token: 5, Lease: 10 * time.Second, Retention: 30 * time.Second}
	if res, err := st.Claim(ctx, p); err != nil || !res.Won {
		t.Fatalf("claim: %+v %v", res, err)
	}
	check := func(wantExp int64) {
		t.Helper()
		out, err := newClient(endpoint).Scan(ctx, &dynamodb.ScanInput{TableName: aws.String(table)})
		if err != nil || len(out.Items) != 1 {
			t.Fatalf("scan: %v, %d items", err, len(out.Items))
		}
		item := out.Items[0]
		exp := item["exp"].(*types.AttributeValueMemberN).Value
		ttl := item["ttl"].(*types.AttributeValueMemberN).Value
		wantTTL := (wantExp + 2000 + 999) / 1000
		if exp != strconv.FormatInt(wantExp, 10) || ttl != strconv.FormatInt(wantTTL, 10) {
			t.Fatalf("exp=%s ttl=%s, want exp=%d ttl=%d", exp, ttl, wantExp, wantTTL)
		}
	}
	check(now.Add(30 * time.Second).UnixMilli())
	// A heartbeat whose lease ends after the retention pushes both.
	now = now.Add(25 * time.Second)
	if err := st.Extend(ctx, idem.ExtendParams{Tenant: "t1", Key: "order-1", Token: 5, Lease: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	check(now.Add(10 * time.Second).UnixMilli())
	// Within the margin after the retention, the record still counts...
	now = now.Add(10*time.Second + 2*time.Second - time.Millisecond)
	if res, err := st.Claim(ctx, idem.ClaimParams{Tenant: "t1", Key: "order-1", Token: 6, Lease: time.Second, Retention: time.Minute}); err != nil || res.Won {
		t.Fatalf("claim within the margin after retention: %+v %v, want lost", res, err)
	}
	// ...and past it, it counts as absent, deleted or not: a new claim
	// wins afresh.
	now = now.Add(time.Millisecond)
	res, err := st.Claim(ctx, idem.ClaimParams{Tenant: "t1", Key: "order-1", Token: 6, Lease: time.Second, Retention: time.Minute})
	if err != nil || !res.Won || res.Takeover {
		t.Fatalf("claim past retention: %+v %v, want won afresh", res, err)
	}
}
