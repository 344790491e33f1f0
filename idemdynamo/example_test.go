package idemdynamo_test

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/truora/minidyn/server"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdynamo"
)

// An order and the stored answer commit in one TransactWriteItems; the
// retry gets the answer replayed and writes nothing. The example runs on
// minidyn's DynamoDB-compatible server; on AWS, client is
// dynamodb.NewFromConfig(cfg).
func Example() {
	srv := httptest.NewServer(server.NewServer())
	defer srv.Close()
	client := newClient(srv.URL)
	ctx := context.Background()
	for _, table := range []string{"idem_keys", "orders"} {
		if _, err := idemdynamo.CreateTable(ctx, client, table); err != nil && !errors.Is(err, idemdynamo.ErrNoTTL) {
			panic(err)
		}
	}
	store, err := idemdynamo.NewStore(client, &idemdynamo.Config{Table: "idem_keys", Transactional: true})
	if err != nil {
		panic(err)
	}
	engine, err := idem.NewEngine(store, nil)
	if err != nil {
		panic(err)
	}
	defer engine.Close(ctx)

	createOrder := func(ctx context.Context) (idem.Result, error) {
		err := idemdynamo.Tx(ctx).Add(types.TransactWriteItem{Put: &types.Put{
			TableName:           aws.String("orders"),
			Item:                map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "ord_1"}},
			ConditionExpression: aws.String("attribute_not_exists(pk)"),
		}})
		return idem.Result{Status: 201, Body: []byte(`{"id":"ord_1"}`)}, err
	}
	op := idem.Operation{Tenant: "shop-1", Key: "order-42", Fingerprint: []byte("POST /orders {...}")}
	for range 2 {
		out, err := engine.Do(ctx, op, createOrder)
		if err != nil {
			panic(err)
		}
		fmt.Printf("%d %s replayed=%v\n", out.Result.Status, out.Result.Body, out.Replayed)
	}
	got, _ := client.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String("orders"), Key: map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "ord_1"}}})
	fmt.Println("order stored:", len(got.Item) > 0)
	// Output:
	// 201 {"id":"ord_1"} replayed=false
	// 201 {"id":"ord_1"} replayed=true
	// order stored: true
}
