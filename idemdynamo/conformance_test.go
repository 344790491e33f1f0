package idemdynamo_test

import (
	"context"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/idem-go/idem/idemdynamo"
	"github.com/idem-go/idem/idemstoretest"
)

// noSkew runs the suite's short leases (300ms) as they are: the suite
// waits them out on one clock, so no margin for other clocks is needed.
var noSkew = idemdynamo.Config{MaxClockSkew: -1}

// TestConformanceDynalite runs the store suite on dynalite, a real server
// process. dynalite has no TransactWriteItems, so the store runs there
// without business writes (Transactional false, as Redis does); the
// transactional cases run on minidyn below. Store and Peer are two
// clients, two connection pools, as two processes would hold.
func TestConformanceDynalite(t *testing.T) {
	endpoint := dynaliteEndpoint(t)
	table := newTable(t, endpoint)
	store, peer := newStore(t, endpoint, table, noSkew), newStore(t, endpoint, table, noSkew)
	idemstoretest.Exercise(context.Background(), t, func(t *testing.T) *idemstoretest.Fixture {
		return &idemstoretest.Fixture{Store: store, Peer: peer}
	}, idemstoretest.Capabilities{})
}

// TestConformanceMinidyn runs the suite on minidyn's HTTP server, in
// process, with business writes: each is a Put of an item in a table of
// its own, added to the unit of work with Tx and committed with the record
// in one TransactWriteItems.
func TestConformanceMinidyn(t *testing.T) {
	endpoint := minidynEndpoint(t)
	table := newTable(t, endpoint)
	orders := newOrdersTable(t, endpoint)
	cfg := noSkew
	cfg.Transactional = true
	store, peer := newStore(t, endpoint, table, cfg), newStore(t, endpoint, table, cfg)
	client := newClient(endpoint)
	idemstoretest.Exercise(context.Background(), t, func(t *testing.T) *idemstoretest.Fixture {
		return &idemstoretest.Fixture{
			Store:         store,
			Peer:          peer,
			BusinessWrite: func(ctx context.Context, id string) error { return addOrder(ctx, orders, id) },
			BusinessCount: func(ctx context.Context, id string) (int, error) { return countOrder(ctx, client, orders, id) },
		}
	}, idemstoretest.Capabilities{Transactional: true})
}

// newOrdersTable creates a business table keyed by "id".
func newOrdersTable(t testing.TB, endpoint string) string {
	t.Helper()
	name := newTable(t, endpoint)
	return name
}

// addOrder adds the business item id to the unit of work in ctx.
func addOrder(ctx context.Context, table, id string) error {
	return idemdynamo.Tx(ctx).Add(types.TransactWriteItem{Put: &types.Put{
		TableName: aws.String(table),
		Item: map[string]types.AttributeValue{
			"pk": &types.AttributeValueMemberS{Value: "order#" + id},
		},
	}})
}

// countOrder counts the committed business items id: 0 or 1.
func countOrder(ctx context.Context, client *dynamodb.Client, table, id string) (int, error) {
	out, err := client.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:      aws.String(table),
		Key:            map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "order#" + id}},
		ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		return 0, err
	}
	if len(out.Item) == 0 {
		return 0, nil
	}
	return 1, nil
}
