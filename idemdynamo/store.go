package idemdynamo

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/idem-go/idem"
)

// DefaultTable is the table used when Config.Table is empty.
const DefaultTable = "idem_keys"

// DefaultMaxClockSkew is Config.MaxClockSkew's default.
const DefaultMaxClockSkew = time.Second

// API is the part of the DynamoDB client the store uses; *dynamodb.Client
// implements it.
type API interface {
	PutItem(ctx context.Context, in *dynamodb.PutItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error)
	GetItem(ctx context.Context, in *dynamodb.GetItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error)
	UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error)
	DeleteItem(ctx context.Context, in *dynamodb.DeleteItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.DeleteItemOutput, error)
	Scan(ctx context.Context, in *dynamodb.ScanInput, opts ...func(*dynamodb.Options)) (*dynamodb.ScanOutput, error)
	TransactWriteItems(ctx context.Context, in *dynamodb.TransactWriteItemsInput, opts ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error)
}

// Config configures a Store. The zero value of every field means its
// documented default.
type Config struct {
	// Table is the table holding the records (see CreateTable for its
	// layout). Defaults to "idem_keys".
	Table string

	// NowFunc is the clock that decides leases and retention. DynamoDB
	// has no clock a request can read, so the application's is used: the
	// processes sharing a table must keep their clocks within
	// MaxClockSkew of each other (NTP, or the Amazon Time Sync Service).
	// Defaults to time.Now.
	NowFunc func() time.Time

	// MaxClockSkew bounds how far apart the clocks of the processes
	// sharing the table may be. A lease counts as ended, and a retention
	// as passed, only MaxClockSkew after its stored end, so that a process
	// whose clock runs ahead by up to that much never takes a live lease
	// over. It lengthens every takeover by as much. Defaults to 1s;
	// negative means no margin.
	MaxClockSkew time.Duration

	// Transactional says that the handlers keep their business writes in
	// DynamoDB through Tx, so that a unit of work rolled back undoes them:
	// the engine then releases the key of a handler that failed or was
	// cancelled, as on a SQL store. Leave it false when the handlers also
	// write elsewhere (another database, a queue), whose writes no
	// rollback undoes: the engine then keeps such a key in flight until
	// its lease ends instead. Tx works either way. Defaults to false.
	Transactional bool
}

// Store is an idem.Store on one DynamoDB table. It is safe for concurrent
// use; create it with NewStore.
type Store struct {
	api           API
	table         *string
	now           func() time.Time
	skew          time.Duration
	transactional bool
}

var (
	_ idem.Store     = (*Store)(nil)
	_ idem.StepStore = (*Store)(nil)
)

// NewStore returns a store over the table of config, through api (a
// *dynamodb.Client). A nil config means every default. It sends nothing:
// create the table first (CreateTable, or the template in docs/STORES.md).
func NewStore(api API, config *Config) (*Store, error) {
	if api == nil {
		return nil, errors.New("idemdynamo: NewStore needs a DynamoDB client")
	}
	cfg := Config{}
	if config != nil {
		cfg = *config
	}
	if cfg.Table == "" {
		cfg.Table = DefaultTable
	}
	if cfg.NowFunc == nil {
		cfg.NowFunc = time.Now
	}
	switch {
	case cfg.MaxClockSkew == 0:
		cfg.MaxClockSkew = DefaultMaxClockSkew
	case cfg.MaxClockSkew < 0:
		cfg.MaxClockSkew = 0
	}
	return &Store{api: api, table: aws.String(cfg.Table), now: cfg.NowFunc, skew: cfg.MaxClockSkew, transactional: cfg.Transactional}, nil
}

// Info implements idem.Store: "dynamodb", transactional as Config says.
func (s *Store) Info() idem.StoreInfo {
	return idem.StoreInfo{Name: "dynamodb", Transactional: s.transactional}
}

// Table returns the name of the store's table.
func (s *Store) Table() string { return *s.table }

// Attribute names. Short, since DynamoDB bills every item by the bytes of
// its attribute names as well as its values.
const (
	attrPK          = "pk"    // S: the key of the item (recordKey, chunkKey)
	attrTenant      = "t"     // S
	attrKey         = "k"     // S
	attrState       = "st"    // S: "in_flight" or "complete"
	attrFingerprint = "fp"    // B, absent when empty
	attrToken       = "tok"   // S: decimal (see tokenValue)
	attrLockedUntil = "lu"    // N: Unix milliseconds
	attrCreated     = "cr"    // N: Unix milliseconds
	attrCompleted   = "ca"    // N: Unix milliseconds
	attrExpires     = "exp"   // N: Unix milliseconds, the end of retention
	attrTTL         = "ttl"   // N: Unix seconds, for DynamoDB's TTL
	attrMode        = "m"     // S: the storage mode's name
	attrStatus      = "sc"    // N
	attrHeader      = "h"     // B: idemcodec.MarshalHeader, absent when empty
	attrBody        = "b"     // B, absent when empty or chunked
	attrReference   = "ref"   // S, absent when empty
	attrSteps       = "steps" // L of B: each an idemcodec.AppendStep encoding
	attrChunks      = "bn"    // N: how many chunk items hold the body
	attrChunkToken  = "bt"    // S: the token the chunks were written under
	attrData        = "d"     // B: a chunk's part of the body
	attrCompletion  = "cid"   // S: the id of the call that completed the record
)

// recordKey encodes (tenant, key) as the partition key of the record.
// The whole pair is the partition key, so that DynamoDB's hash spreads
// the keys of one tenant over every partition: a busy tenant never
// makes a hot partition. The tenant's length comes first, so that no
// two pairs share an encoding whatever bytes they hold.
func recordKey(tenant, key string) string {
	return "r#" + strconv.Itoa(len(tenant)) + "#" + tenant + "#" + key
}

// chunkKey is the partition key of the i-th chunk of a body written under
// token for the record pk.
func chunkKey(pk string, token int64, i int) string {
	return "c#" + strconv.FormatInt(token, 10) + "#" + strconv.Itoa(i) + "#" + pk
}

func keyOf(pk string) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{attrPK: &types.AttributeValueMemberS{Value: pk}}
}

func str(s string) types.AttributeValue { return &types.AttributeValueMemberS{Value: s} }

func num(n int64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(n, 10)}
}

func bin(b []byte) types.AttributeValue { return &types.AttributeValueMemberB{Value: b} }

func millis(t time.Time) int64 { return t.UnixMilli() }

// ttlSeconds is the TTL attribute for a retention ending at expMillis:
// rounded up to the second, and MaxClockSkew later, so that DynamoDB,
// on its own clock, never deletes a record a process still counts as
// live.
func (s *Store) ttlSeconds(expMillis int64) int64 {
	ms := expMillis + s.skew.Milliseconds()
	return (ms + 999) / 1000
}

// isConditionFailed reports whether err is a failed condition of a single
// item write.
func isConditionFailed(err error) bool {
	var cf *types.ConditionalCheckFailedException
	return errors.As(err, &cf)
}

// notSent wraps idem.ErrNotApplied around the error of a context that
// ended before a request was sent.
func notSent(ctx context.Context, op string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("idemdynamo: %s: %w: %w", op, idem.ErrNotApplied, err)
	}
	return nil
}

// getItem reads an item with a strongly consistent read: an eventually
// consistent one could miss a claim or a completion that just happened.
func (s *Store) getItem(ctx context.Context, pk string) (map[string]types.AttributeValue, error) {
	out, err := s.api.GetItem(ctx, &dynamodb.GetItemInput{TableName: s.table, Key: keyOf(pk), ConsistentRead: aws.Bool(true)})
	if err != nil {
		return nil, err
	}
	if len(out.Item) == 0 {
		return nil, nil
	}
	return out.Item, nil
}

// Get implements idem.Store: the record of (tenant, key) whatever its
// state or retention, its body reassembled from its chunks.
func (s *Store) Get(ctx context.Context, tenant, key string) (*idem.Record, error) {
	item, err := s.getItem(ctx, recordKey(tenant, key))
	if err != nil {
		return nil, fmt.Errorf("idemdynamo: get: %w", err)
	}
	if item == nil {
		return nil, idem.ErrNotFound
	}
	return s.decode(ctx, item)
}

// tokenValue stores a lease token as a decimal string, not a number: it
// is an identifier compared for equality, and an emulator that keeps
// numbers as float64 (minidyn) would round a 63-bit token, so that two
// tokens could compare equal.
func tokenValue(token int64) types.AttributeValue {
	return str(strconv.FormatInt(token, 10))
}
