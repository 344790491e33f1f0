package idemdynamo

import (
	"context"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/idem-go/idem"
)

// scanPage bounds the items one Scan request reads, so that a purge
// spends its read capacity in small steps.
const scanPage = 500

// purgeable is the condition of an item the purge may delete: its
// retention has passed, and it holds no live lease (a record in flight
// whose claim gave a retention shorter than its lease is kept). Chunk
// items have no state and go with their retention.
const purgeable = "#exp <= :cut AND (attribute_not_exists(#st) OR #st = :c OR #lu <= :cut)"

// Purge implements idem.Store: it scans the table for expired items, a
// page at a time, and deletes each with a DeleteItem conditional on it
// being still expired (a claim may have renewed it since the scan), until
// Limit records are deleted or the scan has read the whole table. The
// chunks of a deleted record's body are deleted with it; chunk items left
// by a completion that never committed go when their retention ends, and
// are not counted.
//
// On AWS, DynamoDB's TTL on the "ttl" attribute deletes expired items
// for free (see CreateTable): Purge is then optional, and a scan reads
// the whole table, so run it rarely or not at all.
func (s *Store) Purge(ctx context.Context, p idem.PurgeParams) (int, error) {
	limit := p.Limit
	if limit <= 0 {
		limit = 1000
	}
	cut := millis(s.now()) - s.skew.Milliseconds()
	names := map[string]string{"#exp": attrExpires, "#st": attrState, "#lu": attrLockedUntil, "#pk": attrPK, "#bn": attrChunks, "#bt": attrChunkToken}
	values := map[string]types.AttributeValue{":cut": num(cut), ":c": str(string(idem.StateComplete))}
	deleted := 0
	var start map[string]types.AttributeValue
	for {
		out, err := s.api.Scan(ctx, &dynamodb.ScanInput{
			TableName:                 s.table,
			FilterExpression:          aws.String(purgeable),
			ProjectionExpression:      aws.String("#pk, #st, #bn, #bt"),
			ExpressionAttributeNames:  names,
			ExpressionAttributeValues: values,
			ExclusiveStartKey:         start,
			Limit:                     aws.Int32(scanPage),
			ConsistentRead:            aws.Bool(true),
		})
		if err != nil {
			return deleted, fmt.Errorf("idemdynamo: purge: scan: %w", err)
		}
		for _, item := range out.Items {
			pk, _ := getS(item, attrPK)
			_, isRecord := item[attrState]
			if isRecord && deleted >= limit {
				return deleted, nil
			}
			_, err := s.api.DeleteItem(ctx, &dynamodb.DeleteItemInput{
				TableName:                 s.table,
				Key:                       keyOf(pk),
				ConditionExpression:       aws.String(purgeable),
				ExpressionAttributeNames:  map[string]string{"#exp": attrExpires, "#st": attrState, "#lu": attrLockedUntil},
				ExpressionAttributeValues: values,
			})
			if isConditionFailed(err) {
				continue // claimed again since the scan
			}
			if err != nil {
				return deleted, fmt.Errorf("idemdynamo: purge: delete: %w", err)
			}
			if !isRecord {
				continue
			}
			deleted++
			if n, _ := getNOr(item, attrChunks, 0); n > 0 {
				token, _ := getToken(item, attrChunkToken)
				s.deleteChunks(ctx, pk, token, int(n))
			}
		}
		if len(out.LastEvaluatedKey) == 0 {
			return deleted, nil
		}
		start = out.LastEvaluatedKey
	}
}
