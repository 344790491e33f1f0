package idemdynamo

import (
	"context"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemcodec"
)

// fence is the condition of every write of the lease holder: the record
// is in flight under its token. A late holder, whose key was taken over,
// released or completed by another execution, is refused by it.
const fence = "#tok = :tok AND #st = :f"

func fenceValues(token int64) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{":tok": tokenValue(token), ":f": str(string(idem.StateInFlight))}
}

// Extend implements idem.Store: the heartbeat moves the lease end to
// now+Lease, and the retention to at least the lease end, in one
// conditional UpdateItem fenced by the token.
func (s *Store) Extend(ctx context.Context, p idem.ExtendParams) error {
	now := s.now()
	lu := millis(now.Add(p.Lease))
	values := fenceValues(p.Token)
	values[":lu"] = num(lu)
	out, err := s.api.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 s.table,
		Key:                       keyOf(recordKey(p.Tenant, p.Key)),
		UpdateExpression:          aws.String("SET #lu = :lu"),
		ConditionExpression:       aws.String(fence),
		ExpressionAttributeNames:  map[string]string{"#tok": attrToken, "#st": attrState, "#lu": attrLockedUntil},
		ExpressionAttributeValues: values,
		ReturnValues:              types.ReturnValueAllNew,
	})
	if isConditionFailed(err) {
		return idem.ErrLeaseLost
	}
	if err != nil {
		return fmt.Errorf("idemdynamo: extend: %w", err)
	}
	// The retention must not end before the lease: a second write, fenced
	// the same way, only when the retention is shorter (the usual
	// retention, hours, is far longer than a lease).
	if exp, err := s.expiresOf(ctx, p, out); err != nil || exp >= lu {
		return err
	}
	values = fenceValues(p.Token)
	values[":exp"] = num(lu)
	values[":ttl"] = num(s.ttlSeconds(lu))
	_, err = s.api.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 s.table,
		Key:                       keyOf(recordKey(p.Tenant, p.Key)),
		UpdateExpression:          aws.String("SET #exp = :exp, #ttl = :ttl"),
		ConditionExpression:       aws.String(fence + " AND #exp < :exp"),
		ExpressionAttributeNames:  map[string]string{"#tok": attrToken, "#st": attrState, "#exp": attrExpires, "#ttl": attrTTL},
		ExpressionAttributeValues: values,
	})
	if err != nil && !isConditionFailed(err) {
		return fmt.Errorf("idemdynamo: extend the retention: %w", err)
	}
	return nil
}

// Release implements idem.Store: a DeleteItem fenced by the token, or,
// for a record holding recovery points, an UpdateItem that ends its lease
// (MaxClockSkew in the past, so that every process sees it ended).
func (s *Store) Release(ctx context.Context, p idem.ReleaseParams) error {
	pk := recordKey(p.Tenant, p.Key)
	_, err := s.api.DeleteItem(ctx, &dynamodb.DeleteItemInput{
		TableName:                 s.table,
		Key:                       keyOf(pk),
		ConditionExpression:       aws.String(fence + " AND attribute_not_exists(#steps)"),
		ExpressionAttributeNames:  map[string]string{"#tok": attrToken, "#st": attrState, "#steps": attrSteps},
		ExpressionAttributeValues: fenceValues(p.Token),
	})
	if err == nil {
		return nil
	}
	if !isConditionFailed(err) {
		return fmt.Errorf("idemdynamo: release: %w", err)
	}
	values := fenceValues(p.Token)
	values[":lu"] = num(millis(s.now()) - s.skew.Milliseconds())
	_, err = s.api.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 s.table,
		Key:                       keyOf(pk),
		UpdateExpression:          aws.String("SET #lu = :lu"),
		ConditionExpression:       aws.String(fence + " AND attribute_exists(#steps)"),
		ExpressionAttributeNames:  map[string]string{"#tok": attrToken, "#st": attrState, "#steps": attrSteps, "#lu": attrLockedUntil},
		ExpressionAttributeValues: values,
	})
	if err != nil && !isConditionFailed(err) {
		return fmt.Errorf("idemdynamo: release: %w", err)
	}
	// A failed condition: complete, or held under another token, or
	// gone. Nothing to do, as idem.Store says.
	return nil
}

// SaveStep implements idem.StepStore: the step is appended to the
// record's list in one UpdateItem fenced by the token, durable when it
// returns. A name saved twice keeps its first value when read.
func (s *Store) SaveStep(ctx context.Context, p idem.SaveStepParams) error {
	values := fenceValues(p.Token)
	values[":one"] = &types.AttributeValueMemberL{Value: []types.AttributeValue{bin(idemcodec.AppendStep(nil, p.Name, p.Value))}}
	values[":none"] = &types.AttributeValueMemberL{Value: []types.AttributeValue{}}
	_, err := s.api.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 s.table,
		Key:                       keyOf(recordKey(p.Tenant, p.Key)),
		UpdateExpression:          aws.String("SET #steps = list_append(if_not_exists(#steps, :none), :one)"),
		ConditionExpression:       aws.String(fence),
		ExpressionAttributeNames:  map[string]string{"#tok": attrToken, "#st": attrState, "#steps": attrSteps},
		ExpressionAttributeValues: values,
	})
	if isConditionFailed(err) {
		return idem.ErrLeaseLost
	}
	if err != nil {
		return fmt.Errorf("idemdynamo: save step %q: %w", p.Name, err)
	}
	return nil
}

// expiresOf returns the end of retention of the record Extend updated,
// from the item the update returned, or read where an implementation
// returns none.
func (s *Store) expiresOf(ctx context.Context, p idem.ExtendParams, out *dynamodb.UpdateItemOutput) (int64, error) {
	if out != nil && out.Attributes != nil {
		return getN(out.Attributes, attrExpires)
	}
	item, err := s.getItem(ctx, recordKey(p.Tenant, p.Key))
	if err != nil {
		return 0, fmt.Errorf("idemdynamo: extend: read the retention: %w", err)
	}
	if item == nil {
		return 0, idem.ErrLeaseLost
	}
	return getN(item, attrExpires)
}
