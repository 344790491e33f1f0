package idemdynamo

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
)

// ErrNoTTL is wrapped by CreateTable's error when the table is ready but
// DynamoDB's TTL could not be turned on.
var ErrNoTTL = errors.New("idemdynamo: the table is ready, but its TTL could not be turned on (expired records stay until Purge deletes them)")

// TableAPI is the part of the DynamoDB client CreateTable uses;
// *dynamodb.Client implements it.
type TableAPI interface {
	CreateTable(ctx context.Context, in *dynamodb.CreateTableInput, opts ...func(*dynamodb.Options)) (*dynamodb.CreateTableOutput, error)
	DescribeTable(ctx context.Context, in *dynamodb.DescribeTableInput, opts ...func(*dynamodb.Options)) (*dynamodb.DescribeTableOutput, error)
	UpdateTimeToLive(ctx context.Context, in *dynamodb.UpdateTimeToLiveInput, opts ...func(*dynamodb.Options)) (*dynamodb.UpdateTimeToLiveOutput, error)
}

// CreateTable creates the records table when it does not exist, waits
// until it is active, and turns DynamoDB's TTL on for its "ttl"
// attribute. It reports whether it created the table. Safe to run again,
// and from several processes at once.
//
// The table has one key, the string partition key "pk", and bills per
// request (no capacity to plan). Every record is one item whose
// partition key encodes tenant and key, so the keys of every tenant
// spread over all the partitions. Bodies over 300 kB take extra items.
//
// When TTL cannot be turned on (an emulator without it, such as minidyn,
// or a role without dynamodb:UpdateTimeToLive), the table is still
// created and usable, and CreateTable returns an error wrapping ErrNoTTL:
// expired records then stay until Purge deletes them.
func CreateTable(ctx context.Context, api TableAPI, table string) (created bool, err error) {
	if table == "" {
		table = DefaultTable
	}
	_, err = api.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName:            aws.String(table),
		AttributeDefinitions: []types.AttributeDefinition{{AttributeName: aws.String(attrPK), AttributeType: types.ScalarAttributeTypeS}},
		KeySchema:            []types.KeySchemaElement{{AttributeName: aws.String(attrPK), KeyType: types.KeyTypeHash}},
		BillingMode:          types.BillingModePayPerRequest,
	})
	var inUse *types.ResourceInUseException
	switch {
	case err == nil:
		created = true
	case errors.As(err, &inUse):
	default:
		return false, fmt.Errorf("idemdynamo: create table %s: %w", table, err)
	}
	for {
		out, err := api.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(table)})
		if err != nil {
			return created, fmt.Errorf("idemdynamo: describe table %s: %w", table, err)
		}
		// minidyn reports no status at all: its tables are usable at once.
		if out.Table != nil && (out.Table.TableStatus == types.TableStatusActive || out.Table.TableStatus == "") {
			break
		}
		select {
		case <-ctx.Done():
			return created, fmt.Errorf("idemdynamo: table %s is not active yet: %w", table, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	_, err = api.UpdateTimeToLive(ctx, &dynamodb.UpdateTimeToLiveInput{
		TableName:               aws.String(table),
		TimeToLiveSpecification: &types.TimeToLiveSpecification{AttributeName: aws.String(attrTTL), Enabled: aws.Bool(true)},
	})
	var apiErr smithy.APIError
	if err != nil && !(errors.As(err, &apiErr) && apiErr.ErrorCode() == "ValidationException" && strings.Contains(apiErr.ErrorMessage(), "already enabled")) {
		return created, fmt.Errorf("%w on %s: %w", ErrNoTTL, table, err)
	}
	return created, nil
}
