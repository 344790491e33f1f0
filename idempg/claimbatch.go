package idempg

import (
	"bytes"
	"cmp"
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem"
)

// claimBatchSQL is claimSQL for many claims at once: the same three steps
// (cur reads, ins writes what may be written, the final SELECT answers),
// over the rows of req instead of one pair of parameters. Each claim keeps
// the single statement's guarantees, because ON CONFLICT still decides each
// row against the latest committed version under the unique index; the
// batch only shares the statement, its round trip and its (asynchronous)
// commit between the claims.
//
// The claims arrive sorted by (tenant, key), and ins writes them in that
// order (ORDER BY r.i), so two batches running at once, from two processes,
// always take the rows' locks in the same order and cannot deadlock. One
// (tenant, key) is never twice in a batch: ON CONFLICT DO UPDATE cannot
// touch a row twice in one statement.
//
// One row comes back per claim, numbered by i (from 1, in the order sent),
// with the columns of claimSQL's answer: won, takeover, the steps a won
// takeover kept, the holding record.
//
// The arrays reach unnest through scalar subqueries so that the planner
// cannot see their length. When it can, every execution's custom plan
// looks cheaper than the generic one (it knows the batch has 3 rows, not
// the default guess of 10), so PostgreSQL never settles on the prepared
// generic plan and plans this statement again on every execution: about
// 0.3 ms of server CPU per batch, more than the batch saves.
//
// cur reads idem_keys through a LATERAL subquery that OFFSET 0 keeps from
// being flattened into a join: one primary-key lookup per claim, whatever
// the statistics say. As a plain join, the generic plan prepared while the
// table is small (a new deployment, a test) hashes req against a sequential
// scan of idem_keys, and keeps doing so as the table grows.
const claimBatchSQL = `WITH req AS (
	SELECT * FROM unnest((SELECT $1::text[]), (SELECT $2::text[]), (SELECT $3::bytea[]),
		(SELECT $4::bigint[]), (SELECT $5::bigint[]), (SELECT $6::bigint[]))
		WITH ORDINALITY AS r(tenant_id, idem_key, fingerprint, token, lease_us, retention_us, i)
), cur AS (
	SELECT r.i, ` + keysColumns + `,
		(k.expires_at <= now()
		 OR (k.state = 'in_flight' AND k.locked_until <= now() AND k.fingerprint IS NOT DISTINCT FROM r.fingerprint)) AS claimable
	FROM req r CROSS JOIN LATERAL (
		SELECT * FROM idem_keys WHERE tenant_id = r.tenant_id AND idem_key = r.idem_key OFFSET 0
	) k
), ins AS (
	INSERT INTO idem_keys AS k (tenant_id, idem_key, fingerprint, state, lease_token,
		locked_until, created_at, expires_at)
	SELECT r.tenant_id, r.idem_key, r.fingerprint, 'in_flight', r.token,
		now() + r.lease_us * interval '1 microsecond', now(), now() + r.retention_us * interval '1 microsecond'
	FROM req r, (SELECT set_config('synchronous_commit', 'off', true)) AS async
	WHERE NOT EXISTS (SELECT FROM cur WHERE cur.i = r.i AND NOT cur.claimable)
	ORDER BY r.i
` + claimConflict + `
	RETURNING k.tenant_id, k.idem_key, k.steps
)
SELECT r.i, ins.idem_key IS NOT NULL,
	ins.idem_key IS NOT NULL AND EXISTS (SELECT FROM cur t WHERE t.i = r.i AND t.expires_at > now()),
	ins.steps, ` + curColumns + `
FROM req r
	LEFT JOIN ins ON ins.tenant_id = r.tenant_id AND ins.idem_key = r.idem_key
	LEFT JOIN cur c ON c.i = r.i AND NOT c.claimable`

// keysColumns are recordColumns read from idem_keys under the alias k.
const keysColumns = `k.fingerprint, k.state, k.lease_token, k.locked_until, k.storage_mode, k.status_code,
	k.response_headers, k.response_body, k.resource_ref, k.created_at, k.completed_at, k.expires_at`

// claimWaiter is one Claim call waiting for its batch.
type claimWaiter struct {
	ctx         context.Context
	p           idem.ClaimParams
	fingerprint []byte // p.Fingerprint, or nil for none (NULL)
	// attempts counts the batches that ran this claim; see claimAttempts.
	attempts int
	// followers are claims of the same tenant, key and fingerprint,
	// queued after this one, that ride on its statement: when it loses,
	// they lose to the same record (they would have read the same row in
	// the same instant); when it wins, they queue again and find it held.
	followers []*claimWaiter
	// done receives exactly one outcome; buffered so that the batcher
	// never waits for a caller that gave up.
	done chan claimOutcome
	// state says who owns the outcome: the caller, once deliver has
	// answered (waiterAnswered), or the batcher, once the caller has given
	// up (waiterAbandoned), whichever comes first. A won claim is thus
	// either returned or released, never both, never neither.
	state atomic.Int32
}

const (
	waiterWaiting = iota
	waiterAnswered
	waiterAbandoned
)

type claimOutcome struct {
	result idem.ClaimResult
	err    error
}

// claimBatcher runs the claims of one Store in batches. Claims queue; when
// fewer than maxRunning senders are running, a claim starts one, which
// sends everything queued as one statement, then whatever queued while
// that statement ran, and so on, and exits when the queue is empty. A
// lone claim therefore goes out at once, as a batch of one: batching adds
// no waiting when there is nothing to batch with, and under load a claim
// waits at most for the statement already running, the way a group
// commit does.
type claimBatcher struct {
	store   *Store
	maxSize int
	// maxRunning bounds the claim statements running at once.
	maxRunning int

	mu      sync.Mutex
	queue   []*claimWaiter
	running int // goroutines sending batches

	// statements counts the batch statements sent, for the tests.
	statements atomic.Int64
}

func (b *claimBatcher) claim(ctx context.Context, p idem.ClaimParams, fingerprint []byte) (idem.ClaimResult, error) {
	w := &claimWaiter{ctx: ctx, p: p, fingerprint: fingerprint, done: make(chan claimOutcome, 1)}
	b.mu.Lock()
	b.queue = append(b.queue, w)
	start := b.running < b.maxRunning
	if start {
		b.running++
	}
	b.mu.Unlock()
	if start {
		// The caller sends the first batch itself, which holds its own
		// claim unless the queue was longer than a batch: a lone claim
		// then costs no goroutine and no hand-off. Whatever queued
		// meanwhile goes on in a goroutine of its own.
		b.step()
	}
	select {
	case o := <-w.done:
		return o.result, o.err
	case <-ctx.Done():
		if w.state.CompareAndSwap(waiterWaiting, waiterAbandoned) {
			// The batch may still claim the key for this caller; the
			// batcher then releases it (see deliver).
			return idem.ClaimResult{}, context.Cause(ctx)
		}
		// Answered as the context ended (both cases were ready): the
		// outcome is the caller's, a won claim included, which the
		// caller must run or release like any other.
		o := <-w.done
		return o.result, o.err
	}
}

// step sends one batch for a sender that claim has just counted in
// running, then leaves the rest of the queue to run.
func (b *claimBatcher) step() {
	b.mu.Lock()
	batch := b.take()
	b.mu.Unlock()
	if len(batch) > 0 {
		b.exec(batch)
	}
	b.mu.Lock()
	if len(b.queue) == 0 {
		b.running--
		b.mu.Unlock()
		return
	}
	b.mu.Unlock()
	go b.run()
}

// run sends batches until the queue is empty.
func (b *claimBatcher) run() {
	for {
		b.mu.Lock()
		batch := b.take()
		if len(batch) == 0 {
			b.running--
			b.mu.Unlock()
			return
		}
		b.mu.Unlock()
		b.exec(batch)
	}
}

// take removes the next batch from the queue: up to maxSize claims, in
// arrival order, at most one per (tenant, key), with the claims that
// follow it (see claimWaiter.followers). A claim of a key already in the
// batch with another fingerprint stays queued for the next batch, where it
// will find the first one's record. Claims whose caller already gave up
// are dropped. b.mu is held.
func (b *claimBatcher) take() []*claimWaiter {
	var batch []*claimWaiter
	var leaders map[identity]*claimWaiter
	rest := b.queue[:0]
	for _, w := range b.queue {
		if w.ctx.Err() != nil {
			continue
		}
		id := identity{w.p.Tenant, w.p.Key}
		if leader, dup := leaders[id]; dup {
			if bytes.Equal(leader.fingerprint, w.fingerprint) {
				leader.followers = append(leader.followers, w)
			} else {
				rest = append(rest, w)
			}
			continue
		}
		if len(batch) == b.maxSize {
			rest = append(rest, w)
			continue
		}
		if leaders == nil {
			leaders = make(map[identity]*claimWaiter, len(b.queue))
		}
		leaders[id] = w
		batch = append(batch, w)
	}
	clear(b.queue[len(rest):])
	b.queue = rest
	return batch
}

type identity struct{ tenant, key string }

// exec runs one batch statement and hands each claim its outcome.
func (b *claimBatcher) exec(batch []*claimWaiter) {
	slices.SortFunc(batch, func(x, y *claimWaiter) int {
		return cmp.Or(cmp.Compare(x.p.Tenant, y.p.Tenant), cmp.Compare(x.p.Key, y.p.Key))
	})

	// The statement serves every caller in the batch, so it is cancelled
	// only when all of them have given up, not when the first one does.
	// Every caller is counted before any callback is registered: the
	// callback of a context that has already ended runs at once, and must
	// not bring the count to zero while live callers remain uncounted.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	remaining := 0
	for _, w := range batch {
		remaining += 1 + len(w.followers)
	}
	for _, w := range batch {
		for _, x := range append([]*claimWaiter{w}, w.followers...) {
			stop := context.AfterFunc(x.ctx, func() {
				mu.Lock()
				remaining--
				if remaining == 0 {
					cancel()
				}
				mu.Unlock()
			})
			defer stop()
		}
	}

	// Outcomes are handed out only once the statement has ended without
	// error, that is once its implicit transaction has committed: a claim
	// is not won before then.
	b.statements.Add(1)
	results, err := b.query(ctx, batch)
	if err != nil {
		err = claimError(err)
		for _, w := range batch {
			b.deliver(w, claimOutcome{err: err})
			for _, f := range w.followers {
				b.deliver(f, claimOutcome{err: err})
			}
		}
		// Unless marked idem.ErrNotApplied, the engine of every waiter
		// releases the claim the statement may have won, fenced by its
		// token. Followers claimed nothing of their own, and their
		// releases are harmless.
		return
	}
	var again []*claimWaiter
	for i, w := range batch {
		followers := w.followers
		w.followers = nil
		res := results[i]
		switch {
		case res.won:
			result, err := res.result(w.p)
			b.deliver(w, claimOutcome{result: result, err: err})
			again = append(again, followers...)
		case res.answered():
			for _, x := range append([]*claimWaiter{w}, followers...) {
				result, err := res.result(x.p)
				b.deliver(x, claimOutcome{result: result, err: err})
			}
		default:
			// As Claim's loop does: a fresh snapshot will read the winner.
			w.attempts++
			if w.attempts >= claimAttempts {
				b.deliver(w, claimOutcome{err: errClaimRace})
			} else {
				again = append(again, w)
			}
			again = append(again, followers...)
		}
	}
	if len(again) > 0 {
		b.mu.Lock()
		b.queue = append(again, b.queue...)
		b.mu.Unlock()
	}
}

// query runs the claims of batch as one statement: claimSQL when there is
// only one, which costs the server less than claimBatchSQL over one row,
// else claimBatchSQL. results[i] answers batch[i].
func (b *claimBatcher) query(ctx context.Context, batch []*claimWaiter) ([]claimRow, error) {
	// The connection first, so that a failure to get one is known to have
	// sent nothing (idem.ErrNotApplied): no claim to release.
	conn, err := b.store.pool.Acquire(ctx)
	if err != nil {
		return nil, idem.NotApplied(err)
	}
	defer conn.Release()
	n := len(batch)
	results := make([]claimRow, n)
	if n == 1 {
		w, res := batch[0], &results[0]
		err := conn.QueryRow(ctx, b.store.claimQuery, w.p.Tenant, w.p.Key, w.fingerprint, w.p.Token,
			micros(w.p.Lease), micros(w.p.Retention)).Scan(res.dest()...)
		return results, err
	}
	tenants := make([]string, n)
	keys := make([]string, n)
	fingerprints := make([][]byte, n)
	tokens := make([]int64, n)
	leases := make([]int64, n)
	retentions := make([]int64, n)
	for i, w := range batch {
		tenants[i], keys[i], fingerprints[i] = w.p.Tenant, w.p.Key, w.fingerprint
		tokens[i], leases[i], retentions[i] = w.p.Token, micros(w.p.Lease), micros(w.p.Retention)
	}
	rows, err := conn.Query(ctx, claimBatchSQL, tenants, keys, fingerprints, tokens, leases, retentions)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var i int64
		var row claimRow
		if err := rows.Scan(append([]any{&i}, row.dest()...)...); err != nil {
			return nil, err
		}
		if i < 1 || i > int64(n) {
			continue
		}
		results[i-1] = row
	}
	rows.Close()
	return results, rows.Err()
}

// deliver hands w its outcome. When w's caller has already given up and
// the claim was won, nobody will run or release it: the batcher releases
// it at once, fenced by its token, so that the key is free for the
// client's retry instead of in flight until the lease expires.
func (b *claimBatcher) deliver(w *claimWaiter, o claimOutcome) {
	if w.state.CompareAndSwap(waiterWaiting, waiterAnswered) {
		w.done <- o
		return
	}
	if o.result.Won {
		go func() {
			ctx, cancel := context.WithTimeout(context.WithoutCancel(w.ctx), 5*time.Second)
			defer cancel()
			_ = b.store.Release(ctx, idem.ReleaseParams{Tenant: w.p.Tenant, Key: w.p.Key, Token: w.p.Token})
		}()
	}
}
