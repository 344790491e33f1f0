package idemdynamo

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemcodec"
)

// MaxWrites is how many business writes one unit of work may hold:
// TransactWriteItems takes at most 100 actions, and the completion of the
// record is one of them.
const MaxWrites = 99

// chunkSize is the largest body stored in the record item itself, and the
// size of each chunk item of a larger one: DynamoDB refuses items over
// 400 KB, names and values included.
const chunkSize = 300_000

// ErrTooManyWrites is returned by Writes.Add past MaxWrites.
var ErrTooManyWrites = fmt.Errorf("idemdynamo: a unit of work holds at most %d business writes (TransactWriteItems takes 100 actions, the record is one)", MaxWrites)

// ErrNoUnitOfWork is returned by Add on the nil Writes that Tx returns
// outside an execution on an idemdynamo store (a request without a key,
// or another store): nothing would commit the writes.
var ErrNoUnitOfWork = errors.New("idemdynamo: no unit of work in this context (no execution of an idemdynamo store); write directly instead")

// ErrWritesClosed is returned by Writes.Add once the unit of work has
// completed or rolled back.
var ErrWritesClosed = errors.New("idemdynamo: the unit of work has ended; its business writes can no longer change")

// Writes holds the business writes of one execution, which the completion
// commits with the record in one TransactWriteItems: the items and the
// stored answer are written together or not at all, and a lost lease
// cancels all of them. Get it with Tx.
type Writes struct {
	mu     sync.Mutex
	items  []types.TransactWriteItem
	closed bool
}

// Add adds business writes to the unit of work: Put, Update, Delete or
// ConditionCheck entries on any table of the account, as
// TransactWriteItems takes them. Nothing is sent before the completion.
// A condition of one of them that fails at the completion cancels the
// whole transaction, record included: the completion then fails and the
// engine answers with an error.
func (w *Writes) Add(items ...types.TransactWriteItem) error {
	if w == nil {
		return ErrNoUnitOfWork
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return ErrWritesClosed
	}
	if len(w.items)+len(items) > MaxWrites {
		return ErrTooManyWrites
	}
	w.items = append(w.items, items...)
	return nil
}

// Len returns how many business writes the unit of work holds.
func (w *Writes) Len() int {
	if w == nil {
		return 0
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.items)
}

// take closes w and returns its writes.
func (w *Writes) take() []types.TransactWriteItem {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
	items := w.items
	w.items = nil
	return items
}

type writesKey struct{}

// Tx returns the business writes of the execution running in ctx (the
// context the engine gives the handler), or nil outside an execution on
// an idemdynamo store, whose Add returns ErrNoUnitOfWork.
//
//	err := idemdynamo.Tx(ctx).Add(types.TransactWriteItem{Put: &types.Put{TableName: aws.String("orders"), Item: order}})
//	if errors.Is(err, idemdynamo.ErrNoUnitOfWork) {
//		// a request without a key: write the item directly
//	}
func Tx(ctx context.Context) *Writes {
	w, _ := ctx.Value(writesKey{}).(*Writes)
	return w
}

// Begin implements idem.Store: a unit of work that collects the handler's
// business writes (Tx) until Complete. It sends nothing.
func (s *Store) Begin(ctx context.Context) (idem.UnitOfWork, error) {
	return &unit{s: s, w: &Writes{}}, nil
}

type unit struct {
	s *Store
	w *Writes
}

// Context returns ctx carrying the unit's Writes (Tx).
func (u *unit) Context(ctx context.Context) context.Context {
	return context.WithValue(ctx, writesKey{}, u.w)
}

// Rollback forgets the business writes: none was sent. The record stays
// in flight.
func (u *unit) Rollback(ctx context.Context) error {
	u.w.take()
	return nil
}

// Complete implements idem.UnitOfWork: the record becomes complete,
// fenced by the lease token, in one conditional UpdateItem, or, when the
// handler added business writes, in one TransactWriteItems with them. A
// body too large for one item is written first to chunk items of its
// own, which nothing reads until the record names them.
func (u *unit) Complete(ctx context.Context, p idem.CompleteParams) error {
	s := u.s
	items := u.w.take()
	if _, known := modeNames[p.Result.Mode.String()]; !known {
		return fmt.Errorf("idemdynamo: complete: unknown storage mode %d", p.Result.Mode)
	}
	header, err := idemcodec.MarshalHeader(p.Result.Header)
	if err != nil {
		return fmt.Errorf("idemdynamo: complete: %w", err)
	}
	if err := notSent(ctx, "complete"); err != nil {
		return err
	}
	pk := recordKey(p.Tenant, p.Key)
	now := s.now()
	set := "SET #st = :c, #ca = :ca, #m = :m, #sc = :sc"
	names := map[string]string{"#st": attrState, "#ca": attrCompleted, "#m": attrMode, "#sc": attrStatus, "#tok": attrToken}
	values := map[string]types.AttributeValue{
		":c":   str(string(idem.StateComplete)),
		":f":   str(string(idem.StateInFlight)),
		":ca":  num(millis(now)),
		":m":   str(p.Result.Mode.String()),
		":sc":  num(int64(p.Result.Status)),
		":tok": tokenValue(p.Token),
	}
	add := func(attr string, v types.AttributeValue) {
		set += ", #" + attr + " = :" + attr
		names["#"+attr] = attr
		values[":"+attr] = v
	}
	// The id of this call: a resend by the SDK, after an answer was lost,
	// finds it and knows its write took effect, where a second call
	// under the same token is refused.
	id := requestToken()
	add(attrCompletion, str(id))
	if len(header) > 0 {
		add(attrHeader, bin(header))
	}
	if p.Result.Reference != "" {
		add(attrReference, str(p.Result.Reference))
	}
	chunks := 0
	if body := p.Result.Body; len(body) > chunkSize {
		n, err := s.writeChunks(ctx, pk, p.Token, body)
		if err != nil {
			return err
		}
		chunks = n
		add(attrChunks, num(int64(n)))
		add(attrChunkToken, tokenValue(p.Token))
	} else if len(body) > 0 {
		add(attrBody, bin(body))
	}
	cond := "#tok = :tok AND #st = :f"
	if len(items) == 0 {
		_, err = s.api.UpdateItem(ctx, &dynamodb.UpdateItemInput{
			TableName: s.table, Key: keyOf(pk),
			UpdateExpression: aws.String(set), ConditionExpression: aws.String(cond),
			ExpressionAttributeNames: names, ExpressionAttributeValues: values,
		})
	} else {
		all := append(items, types.TransactWriteItem{Update: &types.Update{
			TableName: s.table, Key: keyOf(pk),
			UpdateExpression: aws.String(set), ConditionExpression: aws.String(cond),
			ExpressionAttributeNames: names, ExpressionAttributeValues: values,
		}})
		_, err = s.api.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{
			TransactItems: all,
			// The SDK resends a request whose answer was lost; with a
			// token, DynamoDB runs the transaction at most once.
			ClientRequestToken: aws.String(id),
		})
	}
	if err == nil {
		return nil
	}
	var cancelled *types.TransactionCanceledException
	if !isConditionFailed(err) && !errors.As(err, &cancelled) {
		// The write may or may not have happened (a timeout, a lost
		// answer): the engine releases the key, fenced on the in-flight
		// state, which does nothing if it did.
		return fmt.Errorf("idemdynamo: complete: %w", err)
	}
	// A condition failed: the record's fence, or, in a transaction, a
	// business write's own. The record says which.
	cur, rerr := s.getItem(context.WithoutCancel(ctx), pk)
	if rerr != nil {
		return fmt.Errorf("idemdynamo: complete refused (%w), and the record could not be read: %w", err, rerr)
	}
	if cur != nil {
		st, _ := getS(cur, attrState)
		tok, _ := getToken(cur, attrToken)
		cid, _ := getS(cur, attrCompletion)
		switch {
		case tok == p.Token && st == string(idem.StateComplete) && cid == id:
			// This very completion, resent by the SDK after its answer
			// was lost: it took effect.
			return nil
		case tok == p.Token && st == string(idem.StateInFlight):
			// Still ours: a business write's condition failed, or
			// DynamoDB cancelled the transaction for another reason (a
			// conflict with a concurrent transaction on one of its items).
			return fmt.Errorf("idemdynamo: complete: the transaction was cancelled (%s), so nothing was written: %w", reasons(cancelled), err)
		}
	}
	if chunks > 0 {
		s.deleteChunks(context.WithoutCancel(ctx), pk, p.Token, chunks)
	}
	return idem.ErrLeaseLost
}

// writeChunks writes body to chunk items under token, after checking that
// the record is still ours (a lost lease would leave them unread), and
// returns how many it wrote. They carry the record's retention, so that
// the purge and DynamoDB's TTL delete them with it, or alone if the
// completion never names them.
func (s *Store) writeChunks(ctx context.Context, pk string, token int64, body []byte) (int, error) {
	cur, err := s.getItem(ctx, pk)
	if err != nil {
		return 0, fmt.Errorf("idemdynamo: complete: read the record: %w", err)
	}
	if cur == nil {
		return 0, idem.ErrLeaseLost
	}
	if st, _ := getS(cur, attrState); st != string(idem.StateInFlight) {
		return 0, idem.ErrLeaseLost
	}
	if tok, _ := getToken(cur, attrToken); tok != token {
		return 0, idem.ErrLeaseLost
	}
	exp, err := getN(cur, attrExpires)
	if err != nil {
		return 0, err
	}
	n := 0
	for off := 0; off < len(body); off += chunkSize {
		part := body[off:min(off+chunkSize, len(body))]
		_, err := s.api.PutItem(ctx, &dynamodb.PutItemInput{TableName: s.table, Item: map[string]types.AttributeValue{
			attrPK:      str(chunkKey(pk, token, n)),
			attrData:    bin(part),
			attrExpires: num(exp),
			attrTTL:     num(s.ttlSeconds(exp)),
		}})
		if err != nil {
			s.deleteChunks(context.WithoutCancel(ctx), pk, token, n)
			return 0, fmt.Errorf("idemdynamo: complete: write body chunk %d: %w", n+1, err)
		}
		n++
	}
	return n, nil
}

// deleteChunks deletes the first n chunks written under token, as far as
// it can: those it misses are deleted with their retention.
func (s *Store) deleteChunks(ctx context.Context, pk string, token int64, n int) {
	for i := range n {
		_, _ = s.api.DeleteItem(ctx, &dynamodb.DeleteItemInput{TableName: s.table, Key: keyOf(chunkKey(pk, token, i))})
	}
}

// requestToken returns a fresh ClientRequestToken (at most 36 characters).
func requestToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// reasons lists the cancellation reasons of a cancelled transaction.
func reasons(e *types.TransactionCanceledException) string {
	if e == nil || len(e.CancellationReasons) == 0 {
		return "no reason given"
	}
	var codes []string
	for i, r := range e.CancellationReasons {
		if c := aws.ToString(r.Code); c != "" && c != "None" {
			codes = append(codes, fmt.Sprintf("item %d: %s", i+1, c))
		}
	}
	return strings.Join(codes, ", ")
}
