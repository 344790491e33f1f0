//go:build linux

package dbcrash

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/atonce"
)

// tenant owns every key of the workload.
const tenant = "dbcrash"

// The workload's shape: lanes run operations one after the other, each
// operation a fresh key sent once, a fresh key sent by dupes clients at
// one barrier, or a late retry of an earlier key of the lane.
const (
	lanes = 4
	dupes = 4
	// lease is short so that a key whose execution died with the
	// server, and whose release failed, is taken over soon.
	lease = 2 * time.Second
	// The killer waits a random time in [minGap, maxGap) after each
	// restart before the next SIGKILL.
	minGap = 200 * time.Millisecond
	maxGap = 1800 * time.Millisecond
	// attemptTimeout bounds one call of Engine.Do; answerTimeout is how
	// long the clients may keep retrying once the kills have stopped.
	// Both are failure deadlines only.
	attemptTimeout = 30 * time.Second
	answerTimeout  = 2 * time.Minute
)

// quiet drops the engine's warnings: every crash makes dozens of them.
var quiet = slog.New(slog.DiscardHandler)

// target is a private database server and the idem store on it.
type target struct {
	name string
	srv  *server
	// ready waits until the started server answers queries.
	ready func(ctx context.Context) error
	store idem.Store
	// insert writes the business row of an execution in the handler's
	// transaction, reached through ctx.
	insert func(ctx context.Context, key, nonce string) error
	// read reads back the business rows and the records, on a connection
	// of its own.
	read func(ctx context.Context) (*dbState, error)
	// claimsDurable is true when a claim is durable once its statement
	// returns (MariaDB with innodb_flush_log_at_trx_commit=1); a crash
	// must then erase none.
	claimsDurable bool
}

// restart starts the server again and waits until it answers.
func (tg *target) restart(ctx context.Context) error {
	if err := tg.srv.start(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	if err := tg.ready(ctx); err != nil {
		return fmt.Errorf("%s did not come back: %w\n%s", tg.srv.name, err, tg.srv.tail())
	}
	return nil
}

// dbState is what the database holds for the workload's tenant.
type dbState struct {
	orders  map[string][]string // key → nonces of its business rows
	records map[string]dbRecord // key → its idem record
	now     time.Time           // the database's clock, for messages
	maxWait time.Duration       // longest remaining lease of a record in flight
}

type dbRecord struct {
	state string
	token int64
	body  string
}

// pollReady calls try until it succeeds, the server exits, or ctx ends.
func pollReady(ctx context.Context, srv *server, try func(ctx context.Context) error) error {
	for {
		err := try(ctx)
		if err == nil {
			return nil
		}
		if srv.exited() {
			return fmt.Errorf("the server exited: %w", err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last error: %v)", ctx.Err(), err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// gatedStore is the engine's store: it records the claims won and what
// became of them, so that after each crash the test can tell which won
// claims the crash erased; and it holds every new call to the database
// while the test restarts the server and reads what survived.
//
// UnitOfWork calls are not held: they run on a connection taken before the
// crash, which is dead, and holding them could keep the connections that
// a held Begin waits for.
type gatedStore struct {
	inner idem.Store
	gate  sync.RWMutex

	// dead is set just before the server is killed, and cleared after
	// the look that follows the restart.
	dead atomic.Bool

	mu        sync.Mutex
	won       map[int64]string // token → key, claims won since the last look
	completed map[int64]bool   // tokens whose completion committed
	// released holds the keys of the releases sent while the server was
	// alive since the last look: each may have deleted its record. A
	// release sent after the kill reached no server.
	released map[string]bool
}

func newGatedStore(inner idem.Store) *gatedStore {
	return &gatedStore{inner: inner, won: map[int64]string{}, completed: map[int64]bool{}, released: map[string]bool{}}
}

func (g *gatedStore) Info() idem.StoreInfo { return g.inner.Info() }

func (g *gatedStore) Claim(ctx context.Context, p idem.ClaimParams) (idem.ClaimResult, error) {
	g.gate.RLock()
	defer g.gate.RUnlock()
	res, err := g.inner.Claim(ctx, p)
	if err == nil && res.Won {
		g.mu.Lock()
		g.won[p.Token] = p.Key
		g.mu.Unlock()
	}
	return res, err
}

func (g *gatedStore) Begin(ctx context.Context) (idem.UnitOfWork, error) {
	g.gate.RLock()
	defer g.gate.RUnlock()
	u, err := g.inner.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &trackedUnit{UnitOfWork: u, g: g}, nil
}

func (g *gatedStore) Extend(ctx context.Context, p idem.ExtendParams) error {
	g.gate.RLock()
	defer g.gate.RUnlock()
	return g.inner.Extend(ctx, p)
}

func (g *gatedStore) Release(ctx context.Context, p idem.ReleaseParams) error {
	g.gate.RLock()
	defer g.gate.RUnlock()
	if !g.dead.Load() {
		g.mu.Lock()
		g.released[p.Key] = true
		g.mu.Unlock()
	}
	return g.inner.Release(ctx, p)
}

func (g *gatedStore) Get(ctx context.Context, tenant, key string) (*idem.Record, error) {
	g.gate.RLock()
	defer g.gate.RUnlock()
	return g.inner.Get(ctx, tenant, key)
}

func (g *gatedStore) Purge(ctx context.Context, p idem.PurgeParams) (int, error) {
	g.gate.RLock()
	defer g.gate.RUnlock()
	return g.inner.Purge(ctx, p)
}

// trackedUnit notes the completions that committed.
type trackedUnit struct {
	idem.UnitOfWork
	g *gatedStore
}

func (u *trackedUnit) Complete(ctx context.Context, p idem.CompleteParams) error {
	err := u.UnitOfWork.Complete(ctx, p)
	if err == nil {
		u.g.mu.Lock()
		u.g.completed[p.Token] = true
		u.g.mu.Unlock()
	}
	return err
}

// claimFates counts what a crash left of the claims won before it whose
// execution neither completed nor sent a release for its key.
type claimFates struct {
	erased    int // no record: the claim never reached the disk
	held      int // still in flight under the claim's token
	committed int // complete under the claim's token: the commit happened, its answer was lost
	other     int // held by another token (taken over)
}

func (f *claimFates) add(o claimFates) {
	f.erased += o.erased
	f.held += o.held
	f.committed += o.committed
	f.other += o.other
}

// look sorts the claims won since the last look by what st shows of
// them, and starts afresh. The gate is held: nothing else runs.
func (g *gatedStore) look(st *dbState) (f claimFates, erasedKeys []string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for token, key := range g.won {
		if g.completed[token] || g.released[key] {
			continue
		}
		rec, ok := st.records[key]
		switch {
		case !ok:
			f.erased++
			erasedKeys = append(erasedKeys, key)
		case rec.token != token:
			f.other++
		case rec.state == string(idem.StateComplete):
			f.committed++
		default:
			f.held++
		}
	}
	clear(g.won)
	clear(g.completed)
	clear(g.released)
	g.dead.Store(false)
	slices.Sort(erasedKeys)
	return f, erasedKeys
}

// operation is one thing a client means to do once: a key, a body (its
// fingerprint), and the clients that sent it.
type operation struct {
	key string
	fp  []byte

	mu      sync.Mutex
	clients []*client

	runs atomic.Int64 // handler executions started
}

// client is one sender of an operation, retrying until it gets an answer.
type client struct {
	answered bool
	answer   string // the stored body: the nonce of the execution
	replayed bool
	attempts int
	fatal    error // an answer that is no answer here (422, invalid key)
}

func (op *operation) newClient() *client {
	c := &client{}
	op.mu.Lock()
	op.clients = append(op.clients, c)
	op.mu.Unlock()
	return c
}

// workload runs operations through the engine and counts what happens.
type workload struct {
	tg     *target
	engine *idem.Engine
	gs     *gatedStore

	mu  sync.Mutex
	ops []*operation

	giveUp atomic.Int64 // unix nanos after which clients stop retrying; 0: never

	inFlight, leaseLost, storeErrs, handlerErrs atomic.Int64

	kills int
	fates claimFates
	// erasures lists, per crash, the keys whose won claim it erased.
	erasures []string
}

func (w *workload) newOp(key string) *operation {
	sum := sha256.Sum256([]byte("POST /orders " + key))
	op := &operation{key: key, fp: sum[:]}
	w.mu.Lock()
	w.ops = append(w.ops, op)
	w.mu.Unlock()
	return op
}

func nonce() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// handler writes the business row, and answers with a nonce of its own:
// a second execution can never pass for a replay.
func (w *workload) handler(op *operation) func(ctx context.Context) (idem.Result, error) {
	return func(ctx context.Context) (idem.Result, error) {
		op.runs.Add(1)
		n := nonce()
		if err := w.tg.insert(ctx, op.key, n); err != nil {
			return idem.Result{}, err
		}
		return idem.Result{Mode: idem.ModeResponse, Status: 201, Body: []byte(n)}, nil
	}
}

// call sends op until it gets an answer, with the same key and body
// every time, as a retrying client does.
func (w *workload) call(ctx context.Context, op *operation, c *client) {
	backoff := 10 * time.Millisecond
	for ctx.Err() == nil {
		if g := w.giveUp.Load(); g != 0 && time.Now().UnixNano() > g {
			return
		}
		actx, cancel := context.WithTimeout(ctx, attemptTimeout)
		out, err := w.engine.Do(actx, idem.Operation{Tenant: tenant, Key: op.key, Fingerprint: op.fp}, w.handler(op))
		cancel()
		c.attempts++
		switch {
		case err == nil:
			c.answered, c.answer, c.replayed = true, string(out.Result.Body), out.Replayed
			return
		case errors.Is(err, idem.ErrFingerprintMismatch), errors.Is(err, idem.ErrInvalidKey), errors.Is(err, idem.ErrClosed):
			c.fatal = err
			return
		case errors.Is(err, idem.ErrInFlight):
			w.inFlight.Add(1)
		case errors.Is(err, idem.ErrLeaseLost):
			w.leaseLost.Add(1)
		case errors.Is(err, idem.ErrStore):
			w.storeErrs.Add(1)
		default:
			// The handler's write failed: its connection died with the
			// server.
			w.handlerErrs.Add(1)
		}
		pause := backoff/2 + mrand.N(backoff)
		backoff = min(2*backoff, 200*time.Millisecond)
		select {
		case <-ctx.Done():
		case <-time.After(pause):
		}
	}
}

// lane runs operations until stop.
func (w *workload) lane(ctx context.Context, id int, stop *atomic.Bool) {
	var mine []*operation
	for n := 0; !stop.Load() && ctx.Err() == nil; n++ {
		r := mrand.IntN(8)
		switch {
		case r >= 6 && len(mine) > 0:
			// A late retry: the operation was answered before, perhaps
			// before a crash; its answer must not have changed.
			op := mine[mrand.IntN(len(mine))]
			w.call(ctx, op, op.newClient())
		case r >= 3:
			op := w.newOp(fmt.Sprintf("l%d-%d", id, n))
			clients := make([]*client, dupes)
			for i := range clients {
				clients[i] = op.newClient()
			}
			atonce.Run(dupes, func(i int) { w.call(ctx, op, clients[i]) })
			mine = append(mine, op)
		default:
			op := w.newOp(fmt.Sprintf("l%d-%d", id, n))
			w.call(ctx, op, op.newClient())
			mine = append(mine, op)
		}
	}
}

// crashAndRestart kills the server, holds the store's callers, restarts
// the server, and sorts the claims won before the crash by what survived.
func (w *workload) crashAndRestart(t *testing.T, ctx context.Context) {
	t.Helper()
	w.gs.dead.Store(true)
	if err := w.tg.srv.crash(); err != nil {
		t.Fatalf("crash %s: %v", w.tg.name, err)
	}
	w.kills++
	// The callers in flight meet the dead server and return at once;
	// the wait is bounded only to report a caller that does not.
	locked := make(chan struct{})
	go func() { w.gs.gate.Lock(); close(locked) }()
	select {
	case <-locked:
	case <-time.After(stopTimeout):
		t.Fatalf("the store's callers did not return within %v of the crash", stopTimeout)
	}
	defer w.gs.gate.Unlock()
	if err := w.tg.restart(ctx); err != nil {
		t.Fatal(err)
	}
	st, err := w.tg.read(ctx)
	if err != nil {
		t.Fatalf("read %s after crash %d: %v", w.tg.name, w.kills, err)
	}
	f, keys := w.gs.look(st)
	w.fates.add(f)
	if len(keys) > 0 {
		w.erasures = append(w.erasures, fmt.Sprintf("crash %d: %s", w.kills, strings.Join(keys, " ")))
	}
}

// runCrashes runs the workload on tg while killing its server, then
// crashes it once more with no traffic, restarts it cleanly, and checks
// the invariants.
func runCrashes(t *testing.T, tg *target) {
	gs := newGatedStore(tg.store)
	engine, err := idem.NewEngine(gs, &idem.Config{Lease: lease, CleanupTimeout: 2 * time.Second, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cctx, ccancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer ccancel()
		_ = engine.Close(cctx)
	})
	// Cleanups run last-in, first-out: should the test end early, the
	// clients stop first, then the engine, the pool and the server.
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	w := &workload{tg: tg, engine: engine, gs: gs}

	duration := workloadDuration(t)
	var stop atomic.Bool
	var wg sync.WaitGroup
	for id := range lanes {
		wg.Go(func() { w.lane(ctx, id, &stop) })
	}
	// The killer: SIGKILL at random moments of the load.
	for end := time.Now().Add(duration); time.Now().Before(end); {
		time.Sleep(minGap + mrand.N(maxGap-minGap))
		w.crashAndRestart(t, ctx)
	}
	stop.Store(true)
	w.giveUp.Store(time.Now().Add(answerTimeout).UnixNano())
	wg.Wait()

	// Whatever was acknowledged last must survive one more crash, then
	// a clean restart.
	w.crashAndRestart(t, ctx)
	if err := tg.srv.stop(); err != nil {
		t.Fatalf("stop %s: %v", tg.name, err)
	}
	if err := tg.restart(ctx); err != nil {
		t.Fatal(err)
	}
	w.verify(t, ctx)
}

// verify reads the database back and checks every operation, then asks
// every key once more and expects its answer replayed.
func (w *workload) verify(t *testing.T, ctx context.Context) {
	t.Helper()
	st, err := w.tg.read(ctx)
	if err != nil {
		t.Fatalf("read %s: %v", w.tg.name, err)
	}
	var (
		clients, acked, fresh, replays, retries int
		lost, duplicates, unanswered, torn      int
		problems                                []string
	)
	report := func(format string, args ...any) {
		if len(problems) < 20 {
			problems = append(problems, fmt.Sprintf(format, args...))
		}
	}
	known := map[string]bool{}
	for _, op := range w.ops {
		known[op.key] = true
		rows := st.orders[op.key]
		rec, hasRec := st.records[op.key]
		if len(rows) > 1 {
			duplicates++
			report("key %s: %d business rows %v (handler started %d times)", op.key, len(rows), rows, op.runs.Load())
		}
		// One transaction holds the business row and the completion:
		// both or neither.
		complete := hasRec && rec.state == string(idem.StateComplete)
		if complete != (len(rows) > 0) || (complete && len(rows) == 1 && rec.body != rows[0]) {
			torn++
			report("key %s: record %+v (present %v) but business rows %v", op.key, rec, hasRec, rows)
		}
		var acks, how []string
		for _, c := range op.clients {
			clients++
			retries += c.attempts - 1
			switch {
			case c.fatal != nil:
				report("key %s: a client got %v", op.key, c.fatal)
			case !c.answered:
				unanswered++
				report("key %s: a client got no answer after %d attempts; record %+v (present %v)", op.key, c.attempts, rec, hasRec)
			default:
				acked++
				acks = append(acks, c.answer)
				if c.replayed {
					replays++
					how = append(how, c.answer+" (replay)")
				} else {
					fresh++
					how = append(how, c.answer+" (executed)")
				}
			}
		}
		if len(acks) == 0 {
			continue
		}
		ok := len(rows) == 1 && complete && rec.body == rows[0]
		for _, a := range acks {
			ok = ok && a == rows[0]
		}
		if !ok {
			lost++
			report("key %s: answered %s, but the database holds business rows %v and record %+v (present %v); handler started %d times",
				op.key, strings.Join(how, ", "), rows, rec, hasRec, op.runs.Load())
		}
	}
	var strays []string
	for k := range st.orders {
		if !known[k] {
			strays = append(strays, "business row "+k)
		}
	}
	for k := range st.records {
		if !known[k] {
			strays = append(strays, "record "+k)
		}
	}
	if len(strays) > 0 {
		report("rows for keys no client sent: %v", strays)
	}

	// Every key once more, all at one barrier: each must replay the
	// answer the database holds, without running. A key still in
	// flight must be claimable once its lease has passed on the
	// database's clock, so wait for that first.
	stuck := w.retryAll(t, ctx, st, report)

	t.Logf("%s: %d operations (%d requests), %d kills, %d retries (%d in flight, %d store errors, %d handler write errors, %d leases lost); "+
		"%d acknowledged (%d first answers, %d replays); lost %d, duplicates %d, torn %d, unanswered %d, stuck %d",
		w.tg.name, len(w.ops), clients, w.kills, retries, w.inFlight.Load(), w.storeErrs.Load(), w.handlerErrs.Load(), w.leaseLost.Load(),
		acked, fresh, replays, lost, duplicates, torn, unanswered, stuck)
	t.Logf("%s: claims won before a crash and not yet completed or released: %d erased by the crash (never durable), %d still held, %d completed (commit made, answer lost), %d taken over",
		w.tg.name, w.fates.erased, w.fates.held, w.fates.committed, w.fates.other)
	for _, e := range w.erasures {
		t.Logf("%s: erased claims, %s", w.tg.name, e)
	}
	if w.tg.claimsDurable && w.fates.erased > 0 {
		report("%d won claims were erased by a crash, on a store whose claims are durable once won", w.fates.erased)
	}
	if len(problems) > 0 || lost+duplicates+torn+unanswered+stuck > 0 || len(strays) > 0 {
		t.Errorf("%s: %d problems:\n%s", w.tg.name, len(problems), strings.Join(problems, "\n"))
	}
	if w.kills < 2 {
		t.Errorf("%s: only %d kills: the run proves little", w.tg.name, w.kills)
	}
}

// retryAll sends every key once more and checks that it replays what
// the database holds. It returns how many keys were still in flight
// after their lease.
func (w *workload) retryAll(t *testing.T, ctx context.Context, st *dbState, report func(string, ...any)) (stuck int) {
	t.Helper()
	if st.maxWait > 0 {
		// A record in flight: wait until its lease has passed on the
		// database's clock (the wait is read from it, not guessed).
		deadline := time.Now().Add(st.maxWait + time.Minute)
		for st.maxWait > 0 {
			if time.Now().After(deadline) {
				t.Fatalf("%s: leases still live a minute past their end", w.tg.name)
			}
			time.Sleep(st.maxWait)
			var err error
			if st, err = w.tg.read(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	outs := make([]finalOutcome, len(w.ops))
	// By barriers of retryBatch keys: the race detector allows 8128
	// goroutines, and a soak makes tens of thousands of keys.
	const retryBatch = 32
	for first := 0; first < len(w.ops); first += retryBatch {
		n := min(retryBatch, len(w.ops)-first)
		atonce.Run(n, func(j int) { w.retryOne(ctx, w.ops[first+j], &outs[first+j]) })
	}
	for i, o := range outs {
		op := w.ops[i]
		rows := st.orders[op.key]
		switch {
		case errors.Is(o.err, idem.ErrInFlight):
			stuck++
			report("key %s: still in flight after its lease", op.key)
		case o.ran:
			report("key %s: ran again on the final retry: the database held no completed record (rows %v)", op.key, rows)
		case o.err != nil:
			report("key %s: final retry: %v", op.key, o.err)
		case !o.out.Replayed || len(rows) != 1 || string(o.out.Result.Body) != rows[0]:
			report("key %s: final retry answered %q (replayed %v), business rows %v", op.key, o.out.Result.Body, o.out.Replayed, rows)
		}
	}
	return stuck
}

// finalOutcome is what the final retry of one key got.
type finalOutcome struct {
	out idem.Outcome
	err error
	ran bool // the handler ran: there was no completed record
}

// retryOne sends op once more, as a client would: a store error is
// retried (the pools still hold connections to the server before the
// clean restart, whose first use fails), anything else is the answer.
func (w *workload) retryOne(ctx context.Context, op *operation, o *finalOutcome) {
	for attempt := 0; attempt < 50 && ctx.Err() == nil; attempt++ {
		o.out, o.err = w.engine.Do(ctx, idem.Operation{Tenant: tenant, Key: op.key, Fingerprint: op.fp},
			func(ctx context.Context) (idem.Result, error) {
				o.ran = true
				return idem.Result{}, errors.New("dbcrash: a completed operation ran again")
			})
		if o.err == nil || o.ran || !errors.Is(o.err, idem.ErrStore) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}
