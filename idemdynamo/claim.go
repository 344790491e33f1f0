package idemdynamo

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"

	"github.com/idem-go/idem"
)

// claimAttempts bounds the rounds of a claim that keeps meeting a record
// changing under it (released, expired or taken over between the write
// and the read).
const claimAttempts = 8

// Claim implements idem.Store.
//
// A fresh claim is one conditional PutItem, won when the key has no
// record or its record is past retention. A takeover (in flight, lease
// ended, same fingerprint) is a conditional UpdateItem instead, which
// keeps the recovery points a PutItem would erase; it is tried only
// after a read showed such a record. A lost claim reads the record with
// a consistent GetItem: it never relies on the failed write returning
// the item (ReturnValuesOnConditionCheckFailure), which dynalite ignores
// and minidyn leaves empty. Each write decides by its own condition, so
// two claims never both win, whatever happens between them.
func (s *Store) Claim(ctx context.Context, p idem.ClaimParams) (idem.ClaimResult, error) {
	if err := notSent(ctx, "claim"); err != nil {
		return idem.ClaimResult{}, err
	}
	pk := recordKey(p.Tenant, p.Key)
	for range claimAttempts {
		now := s.now()
		cut := millis(now) - s.skew.Milliseconds()
		exp := millis(now.Add(p.Retention))
		item := map[string]types.AttributeValue{
			attrPK:          str(pk),
			attrTenant:      str(p.Tenant),
			attrKey:         str(p.Key),
			attrState:       str(string(idem.StateInFlight)),
			attrToken:       tokenValue(p.Token),
			attrLockedUntil: num(millis(now.Add(p.Lease))),
			attrCreated:     num(millis(now)),
			attrExpires:     num(exp),
			attrTTL:         num(s.ttlSeconds(exp)),
		}
		if len(p.Fingerprint) > 0 {
			item[attrFingerprint] = bin(p.Fingerprint)
		}
		_, err := s.api.PutItem(ctx, &dynamodb.PutItemInput{
			TableName:                 s.table,
			Item:                      item,
			ConditionExpression:       aws.String("attribute_not_exists(pk) OR #exp <= :cut"),
			ExpressionAttributeNames:  map[string]string{"#exp": attrExpires},
			ExpressionAttributeValues: map[string]types.AttributeValue{":cut": num(cut)},
		})
		if err == nil {
			return idem.ClaimResult{Won: true}, nil
		}
		if !isConditionFailed(err) {
			return idem.ClaimResult{}, claimError(err)
		}
		cur, err := s.getItem(ctx, pk)
		if err != nil {
			return idem.ClaimResult{}, fmt.Errorf("idemdynamo: claim: read the record: %w", err)
		}
		if cur == nil {
			continue // released or purged since the write: claim again
		}
		tm, err := readTimes(cur)
		if err != nil {
			return idem.ClaimResult{}, err
		}
		now = s.now()
		if s.expired(tm.expires, now) {
			continue
		}
		if tm.state == idem.StateInFlight && s.leaseEnded(tm.lockedUntil, now) {
			if bytes.Equal(getB(cur, attrFingerprint), p.Fingerprint) {
				res, won, err := s.takeOver(ctx, pk, p)
				if err != nil {
					return idem.ClaimResult{}, err
				}
				if won {
					return res, nil
				}
				continue
			}
		}
		rec, err := s.decode(ctx, cur)
		if err != nil {
			return idem.ClaimResult{}, err
		}
		return idem.ClaimResult{Record: rec}, nil
	}
	return idem.ClaimResult{}, fmt.Errorf("idemdynamo: claim: the record kept changing over %d attempts", claimAttempts)
}

// takeOver claims an in-flight record whose lease ended, keeping its
// recovery points.
func (s *Store) takeOver(ctx context.Context, pk string, p idem.ClaimParams) (idem.ClaimResult, bool, error) {
	now := s.now()
	cut := millis(now) - s.skew.Milliseconds()
	exp := millis(now.Add(p.Retention))
	cond := "#st = :f AND #lu <= :cut AND #exp > :cut AND "
	values := map[string]types.AttributeValue{
		":f":   str(string(idem.StateInFlight)),
		":cut": num(cut),
		":tok": tokenValue(p.Token),
		":lu":  num(millis(now.Add(p.Lease))),
		":exp": num(exp),
		":ttl": num(s.ttlSeconds(exp)),
	}
	names := map[string]string{"#st": attrState, "#lu": attrLockedUntil, "#exp": attrExpires, "#tok": attrToken, "#ttl": attrTTL, "#fp": attrFingerprint}
	if len(p.Fingerprint) > 0 {
		cond += "#fp = :fp"
		values[":fp"] = bin(p.Fingerprint)
	} else {
		cond += "attribute_not_exists(#fp)"
	}
	out, err := s.api.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 s.table,
		Key:                       keyOf(pk),
		UpdateExpression:          aws.String("SET #tok = :tok, #lu = :lu, #exp = :exp, #ttl = :ttl"),
		ConditionExpression:       aws.String(cond),
		ExpressionAttributeNames:  names,
		ExpressionAttributeValues: values,
		ReturnValues:              types.ReturnValueAllNew,
	})
	if isConditionFailed(err) {
		return idem.ClaimResult{}, false, nil
	}
	if err != nil {
		return idem.ClaimResult{}, false, fmt.Errorf("idemdynamo: claim (takeover): %w", err)
	}
	res := idem.ClaimResult{Won: true, Takeover: true}
	if out.Attributes != nil {
		if res.Steps, err = decodeSteps(out.Attributes); err != nil {
			return idem.ClaimResult{}, false, err
		}
	} else {
		// An implementation that returns no attributes: read them. The
		// record is ours now, so nothing else changes its steps.
		cur, err := s.getItem(ctx, pk)
		if err != nil {
			return idem.ClaimResult{}, false, fmt.Errorf("idemdynamo: claim (takeover): read the steps: %w", err)
		}
		if cur != nil {
			if res.Steps, err = decodeSteps(cur); err != nil {
				return idem.ClaimResult{}, false, err
			}
		}
	}
	return res, true, nil
}

// claimError wraps the error of a claim's write, with idem.ErrNotApplied
// when DynamoDB answered that it refused the request: a single-item
// write that fails with a client-side error (validation, throttling, a
// missing table) changed nothing.
func claimError(err error) error {
	var api smithy.APIError
	if errors.As(err, &api) && api.ErrorFault() == smithy.FaultClient {
		return fmt.Errorf("idemdynamo: claim: %w: %w", idem.ErrNotApplied, err)
	}
	return fmt.Errorf("idemdynamo: claim: %w", err)
}
