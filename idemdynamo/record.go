package idemdynamo

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemcodec"
)

// modeNames are the stored names of the storage modes: words, so that an
// operator reading an item in the console understands it.
var modeNames = map[string]idem.StorageMode{
	idem.ModeResponse.String():  idem.ModeResponse,
	idem.ModeReference.String(): idem.ModeReference,
	idem.ModeMarker.String():    idem.ModeMarker,
}

func getS(item map[string]types.AttributeValue, name string) (string, bool) {
	v, ok := item[name].(*types.AttributeValueMemberS)
	if !ok {
		return "", false
	}
	return v.Value, true
}

func getB(item map[string]types.AttributeValue, name string) []byte {
	if v, ok := item[name].(*types.AttributeValueMemberB); ok {
		return v.Value
	}
	return nil
}

func getN(item map[string]types.AttributeValue, name string) (int64, error) {
	v, ok := item[name].(*types.AttributeValueMemberN)
	if !ok {
		return 0, fmt.Errorf("idemdynamo: stored item has no number %q", name)
	}
	n, err := strconv.ParseInt(v.Value, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("idemdynamo: stored %q: %w", name, err)
	}
	return n, nil
}

// getNOr reads an optional number.
func getNOr(item map[string]types.AttributeValue, name string, def int64) (int64, error) {
	if _, ok := item[name]; !ok {
		return def, nil
	}
	return getN(item, name)
}

// times is what decides whether a record is live: its lease and retention
// ends, in Unix milliseconds.
type times struct {
	state       idem.State
	lockedUntil int64
	expires     int64
}

func readTimes(item map[string]types.AttributeValue) (times, error) {
	st, _ := getS(item, attrState)
	lu, err := getN(item, attrLockedUntil)
	if err != nil {
		return times{}, err
	}
	exp, err := getN(item, attrExpires)
	if err != nil {
		return times{}, err
	}
	return times{state: idem.State(st), lockedUntil: lu, expires: exp}, nil
}

// expired reports whether a retention ending at exp has passed for every
// process whose clock is within MaxClockSkew of ours.
func (s *Store) expired(exp int64, now time.Time) bool {
	return exp+s.skew.Milliseconds() <= millis(now)
}

// leaseEnded is the same for the end of a lease.
func (s *Store) leaseEnded(lu int64, now time.Time) bool {
	return lu+s.skew.Milliseconds() <= millis(now)
}

// decode builds a Record from its item. It refuses an item this package
// could not have written, rather than replaying a half-understood result.
func (s *Store) decode(ctx context.Context, item map[string]types.AttributeValue) (*idem.Record, error) {
	rec := &idem.Record{}
	rec.Tenant, _ = getS(item, attrTenant)
	rec.Key, _ = getS(item, attrKey)
	st, _ := getS(item, attrState)
	rec.State = idem.State(st)
	switch rec.State {
	case idem.StateInFlight, idem.StateComplete:
	default:
		return nil, fmt.Errorf("idemdynamo: stored record has state %q", st)
	}
	if fp := getB(item, attrFingerprint); len(fp) > 0 {
		rec.Fingerprint = fp
	}
	var err error
	if rec.LeaseToken, err = getToken(item, attrToken); err != nil {
		return nil, err
	}
	msTimes := []struct {
		name string
		to   *time.Time
	}{{attrLockedUntil, &rec.LockedUntil}, {attrCreated, &rec.CreatedAt}, {attrExpires, &rec.ExpiresAt}}
	if rec.State == idem.StateComplete {
		msTimes = append(msTimes, struct {
			name string
			to   *time.Time
		}{attrCompleted, &rec.CompletedAt})
	}
	for _, f := range msTimes {
		ms, err := getN(item, f.name)
		if err != nil {
			return nil, err
		}
		*f.to = time.UnixMilli(ms)
	}
	if rec.Steps, err = decodeSteps(item); err != nil {
		return nil, err
	}
	if rec.State != idem.StateComplete {
		return rec, nil
	}
	modeName, _ := getS(item, attrMode)
	mode, ok := modeNames[modeName]
	if !ok {
		return nil, fmt.Errorf("idemdynamo: stored record has mode %q", modeName)
	}
	status, err := getN(item, attrStatus)
	if err != nil {
		return nil, err
	}
	rec.Result = idem.Result{Mode: mode, Status: int(status)}
	rec.Result.Reference, _ = getS(item, attrReference)
	if h := getB(item, attrHeader); len(h) > 0 {
		if rec.Result.Header, err = idemcodec.UnmarshalHeader(h); err != nil {
			return nil, fmt.Errorf("idemdynamo: stored header: %w", err)
		}
	}
	n, err := getNOr(item, attrChunks, 0)
	if err != nil {
		return nil, err
	}
	if n == 0 {
		rec.Result.Body = getB(item, attrBody)
		return rec, nil
	}
	token, err := getToken(item, attrChunkToken)
	if err != nil {
		return nil, err
	}
	pk, _ := getS(item, attrPK)
	if rec.Result.Body, err = s.readChunks(ctx, pk, token, int(n)); err != nil {
		return nil, err
	}
	return rec, nil
}

// decodeSteps reads the recovery points of an item: a list of encoded
// steps, in the order they were saved; a name saved twice keeps its
// first value (idemcodec.UnmarshalSteps).
func decodeSteps(item map[string]types.AttributeValue) ([]idem.RecordedStep, error) {
	list, ok := item[attrSteps].(*types.AttributeValueMemberL)
	if !ok || len(list.Value) == 0 {
		return nil, nil
	}
	var all []byte
	for _, v := range list.Value {
		b, ok := v.(*types.AttributeValueMemberB)
		if !ok {
			return nil, fmt.Errorf("idemdynamo: stored step is a %T, want binary", v)
		}
		all = append(all, b.Value...)
	}
	steps, err := idemcodec.UnmarshalSteps(all)
	if err != nil {
		return nil, fmt.Errorf("idemdynamo: stored steps: %w", err)
	}
	return steps, nil
}

// readChunks reads the n chunks of a body written under token.
func (s *Store) readChunks(ctx context.Context, pk string, token int64, n int) ([]byte, error) {
	var body []byte
	for i := range n {
		item, err := s.getItem(ctx, chunkKey(pk, token, i))
		if err != nil {
			return nil, fmt.Errorf("idemdynamo: read body chunk %d of %d: %w", i+1, n, err)
		}
		if item == nil {
			return nil, fmt.Errorf("idemdynamo: body chunk %d of %d is missing", i+1, n)
		}
		body = append(body, getB(item, attrData)...)
	}
	return body, nil
}

// getToken reads a token stored by tokenValue.
func getToken(item map[string]types.AttributeValue, name string) (int64, error) {
	s, ok := getS(item, name)
	if !ok {
		return 0, fmt.Errorf("idemdynamo: stored item has no token %q", name)
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("idemdynamo: stored %q: %w", name, err)
	}
	return n, nil
}
