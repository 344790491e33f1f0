package idempg

import (
	"context"
	"crypto/md5"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

var _ idem.Watcher = (*Store)(nil)

const (
	// listenLinger is how long the listening connection stays open after
	// its last subscription stopped: a burst of duplicates every few
	// seconds costs one connection, not one per burst.
	listenLinger = 5 * time.Second
	// listenPing bounds the silence on the listening connection: past it
	// the connection is pinged, so that one a network dropped without a
	// word is found and replaced.
	listenPing = 30 * time.Second
	// listenRetryFirst and listenRetryMax pace the reconnections.
	listenRetryFirst = 100 * time.Millisecond
	listenRetryMax   = 5 * time.Second
)

// markSQL marks the record as waited on, when it is in flight, and says
// whether it is (marked now or before). The mark is what makes its
// completion (idem_complete, migration 0004) and its release notify;
// unmarked records never pay for pg_notify. Like the claim, it does not wait for
// its WAL flush: a mark lost in a crash only leaves the waiters to the
// engine's polling.
const markSQL = `WITH marked AS (
	UPDATE idem_keys SET waiters = true
	FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async
	WHERE tenant_id = $1 AND idem_key = $2 AND state = 'in_flight' AND NOT waiters
	RETURNING 1
)
SELECT EXISTS (SELECT FROM marked)
	OR EXISTS (SELECT FROM idem_keys WHERE tenant_id = $1 AND idem_key = $2 AND state = 'in_flight' AND waiters)`

// Watch implements idem.Watcher with LISTEN/NOTIFY: a change made by any
// process to a record waited on is heard at once. The Store listens on one
// connection of its own, taken from the pool (and then no longer counted
// in it) at the first Watch and closed a few seconds after the last
// subscription stopped; every subscription of the Store shares it. When
// that connection is lost, every subscriber is told (the channels close)
// and Watch returns an error until it is back: the engine polls meanwhile.
//
// Watch marks the record (the waiters column, migration 0004), so that its
// completion and its release notify; a record that is not in flight gets
// a channel closed already. The end of a lease is no statement, and
// notifies nothing, nor does a takeover, which only follows one: the
// engine's polling finds them.
//
// A notification names the record by an opaque token, a hash of the
// tenant and the key keyed by a secret of the schema (migration 0005,
// table idem_notify_secret): a role that may LISTEN but not read idem's
// tables learns nothing of the keys waited on. On a schema migrated only
// up to 0004, Watch listens for that migration's payload (the md5 of the
// tenant followed by the key), so that an upgrade can run before Migrate.
//
// ctx bounds the subscribing (the wait for the listening connection, the
// mark); once Watch has returned, the subscription lasts until stop.
func (s *Store) Watch(ctx context.Context, tenant, key string) (<-chan struct{}, func(), error) {
	if err := checkIdentity(tenant, key); err != nil {
		return nil, nil, err
	}
	l := s.listen
	if err := l.unsupported.Load(); err != nil {
		return nil, nil, *err
	}
	sub, err := l.subscribe(ctx, tenant, key)
	if err != nil {
		return nil, nil, err
	}
	var inFlight bool
	if err := s.pool.QueryRow(ctx, markSQL, tenant, key).Scan(&inFlight); err != nil {
		l.stop(sub)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42703" {
			// No waiters column: the schema predates migration 0004.
			err = fmt.Errorf("idempg: Watch needs migration 0004 (run Migrate): %w", err)
			l.unsupported.Store(&err)
		}
		return nil, nil, interpretError(err)
	}
	if !inFlight {
		// Complete, released or gone already: nothing will notify.
		l.fire(sub)
	}
	var once sync.Once
	return sub.ch, func() { once.Do(func() { l.stop(sub) }) }, nil
}

// watchPayload is the payload of the notifications about (tenant, key):
// idem_notify_token's (migration 0005) under secret, or, without one (a
// schema migrated up to 0004), the md5 of the tenant followed by the key.
func watchPayload(secret []byte, tenant, key string) string {
	if secret == nil {
		sum := md5.Sum([]byte(tenant))
		return hex.EncodeToString(sum[:]) + key
	}
	inner := sha256.New()
	inner.Write(secret)
	inner.Write([]byte(tenant))
	inner.Write([]byte{0})
	inner.Write([]byte(key))
	outer := sha256.New()
	outer.Write(secret)
	outer.Write(inner.Sum(nil))
	return hex.EncodeToString(outer.Sum(nil))
}

// listener is a Store's listening connection and its subscribers.
type listener struct {
	store *Store
	// linger replaces listenLinger when set, for the tests.
	linger time.Duration

	mu   sync.Mutex
	subs map[string]map[*subscription]struct{} // by payload, the ones not yet told
	n    int                                   // subscriptions not stopped
	cur  *session                              // nil: not listening
	idle *time.Timer                           // ends cur once n has stayed 0

	// unsupported holds Watch's error once the schema was found without
	// migration 0004.
	unsupported atomic.Pointer[error]
	// sessions counts the listening sessions started, for the tests.
	sessions atomic.Int64
}

// subscription is one Watch.
type subscription struct {
	payload string
	ch      chan struct{}
	told    bool // ch is closed; guarded by listener.mu
	stopped bool // guarded by listener.mu
}

// session is one run of the listening goroutine: connections made one
// after the other until it is ended.
type session struct {
	ctx    context.Context
	cancel context.CancelFunc
	// Guarded by listener.mu.
	up bool // LISTEN is in effect
	// secret keys the payloads of the current connection's
	// notifications; nil before migration 0005.
	secret []byte
	tried  chan struct{} // closed when the current connection attempt ends; replaced
	err    error         // why the last attempt failed, while not up
}

// subscribe registers a subscription for (tenant, key), once the
// connection listens: it starts the session if none runs, and waits for
// its first attempt to connect. While the connection is down after it was
// up, it fails at once. The payload to match is known once the connection
// has read the secret of the notifications.
func (l *listener) subscribe(ctx context.Context, tenant, key string) (*subscription, error) {
	sub := &subscription{ch: make(chan struct{})}
	l.mu.Lock()
	if l.idle != nil {
		l.idle.Stop()
	}
	if l.cur == nil {
		l.start()
	}
	s := l.cur
	l.n++
	for !s.up {
		if s.err != nil {
			err := s.err
			l.mu.Unlock()
			l.stop(sub)
			return nil, fmt.Errorf("idempg: Watch: the listening connection is down: %w", err)
		}
		tried := s.tried
		l.mu.Unlock()
		select {
		case <-tried:
		case <-ctx.Done():
			l.stop(sub)
			return nil, ctx.Err()
		}
		l.mu.Lock()
	}
	sub.payload = watchPayload(s.secret, tenant, key)
	if l.subs == nil {
		l.subs = make(map[string]map[*subscription]struct{})
	}
	set := l.subs[sub.payload]
	if set == nil {
		set = make(map[*subscription]struct{})
		l.subs[sub.payload] = set
	}
	set[sub] = struct{}{}
	l.mu.Unlock()
	return sub, nil
}

// start starts a session. The caller holds l.mu.
func (l *listener) start() {
	s := &session{tried: make(chan struct{})}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	l.cur = s
	l.sessions.Add(1)
	go l.run(s)
}

// stop ends a subscription, and schedules the end of the session after
// the last.
func (l *listener) stop(sub *subscription) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if sub.stopped {
		return
	}
	sub.stopped = true
	if !sub.told {
		set := l.subs[sub.payload]
		delete(set, sub)
		if len(set) == 0 {
			delete(l.subs, sub.payload)
		}
	}
	l.n--
	if l.n == 0 && l.cur != nil {
		linger := listenLinger
		if l.linger > 0 {
			linger = l.linger
		}
		if l.idle == nil {
			l.idle = time.AfterFunc(linger, l.endIfIdle)
		} else {
			l.idle.Reset(linger)
		}
	}
}

// endIfIdle ends the session when no subscription came since the timer was
// set.
func (l *listener) endIfIdle() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.n == 0 && l.cur != nil {
		l.cur.cancel()
		l.cur = nil
	}
}

// fire tells one subscriber.
func (l *listener) fire(sub *subscription) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if sub.told || sub.stopped {
		return
	}
	l.tell(sub)
	set := l.subs[sub.payload]
	delete(set, sub)
	if len(set) == 0 {
		delete(l.subs, sub.payload)
	}
}

// tell closes sub's channel. The caller holds l.mu and unfiles sub.
func (l *listener) tell(sub *subscription) {
	sub.told = true
	close(sub.ch)
}

// notify tells the subscribers of payload.
func (l *listener) notify(payload string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for sub := range l.subs[payload] {
		l.tell(sub)
	}
	delete(l.subs, payload)
}

// tellAll tells every subscriber: the connection was lost, and with it
// the notifications sent meanwhile. The caller holds l.mu.
func (l *listener) tellAll() {
	for _, set := range l.subs {
		for sub := range set {
			l.tell(sub)
		}
	}
	clear(l.subs)
}

// run is the listening goroutine of session s: it connects, listens and
// hands out notifications, and connects again when the connection is
// lost, until s is ended.
func (l *listener) run(s *session) {
	retry := listenRetryFirst
	for {
		conn, listen, secret, err := l.connect(s.ctx)
		l.mu.Lock()
		if err == nil {
			s.up, s.err, s.secret = true, nil, secret
			retry = listenRetryFirst
		} else {
			s.err = err
		}
		close(s.tried)
		s.tried = make(chan struct{})
		l.mu.Unlock()

		if err == nil {
			err = l.receive(s.ctx, conn, listen)
			conn.Close(context.Background()) //nolint:errcheck // lost or ended either way
			l.mu.Lock()
			s.up, s.err = false, err
			if l.cur == s {
				l.tellAll()
			}
			l.mu.Unlock()
		}
		if s.ctx.Err() != nil {
			return
		}
		t := time.NewTimer(retry)
		select {
		case <-t.C:
		case <-s.ctx.Done():
			t.Stop()
			return
		}
		retry = min(2*retry, listenRetryMax)
	}
}

// connect takes a connection out of the pool, so that it goes through the
// pool's configuration and hooks (search_path among them), listens on the
// channel of the idem_keys table it sees, and reads the secret of the
// notifications (nil on a schema without migration 0005).
// It returns the connection, its LISTEN statement and the secret.
func (l *listener) connect(ctx context.Context) (*pgx.Conn, string, []byte, error) {
	c, err := l.store.pool.Acquire(ctx)
	if err != nil {
		return nil, "", nil, err
	}
	conn := c.Hijack()
	var oid uint32
	var listen string
	var secret []byte
	err = conn.QueryRow(ctx, `SELECT 'idem_keys'::regclass::oid`).Scan(&oid)
	if err == nil {
		err = conn.QueryRow(ctx, `SELECT secret FROM idem_notify_secret`).Scan(&secret)
		var pgErr *pgconn.PgError
		switch {
		case errors.As(err, &pgErr) && pgErr.Code == "42P01":
			// No such table: the schema predates migration 0005, and so
			// do the notifications it sends.
			secret, err = nil, nil
		case errors.Is(err, pgx.ErrNoRows):
			err = errors.New("idempg: idem_notify_secret holds no secret (run Migrate)")
		}
	}
	if err == nil {
		// Last, so that pg_stat_activity shows what the connection is for.
		listen = "LISTEN " + pgx.Identifier{"idem_keys_" + strconv.FormatUint(uint64(oid), 10)}.Sanitize()
		_, err = conn.Exec(ctx, listen)
	}
	if err != nil {
		conn.Close(context.Background()) //nolint:errcheck // the first error is the one to report
		return nil, "", nil, err
	}
	return conn, listen, secret, nil
}

// receive hands out the notifications that arrive on conn until it fails
// or ctx ends.
func (l *listener) receive(ctx context.Context, conn *pgx.Conn, listen string) error {
	for {
		wctx, cancel := context.WithTimeout(ctx, listenPing)
		n, err := conn.WaitForNotification(wctx)
		cancel()
		switch {
		case err == nil:
			l.notify(n.Payload)
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.Is(err, context.DeadlineExceeded):
			// Silence: a timeout leaves the connection usable. Check that
			// it still reaches the server, with a LISTEN again (a no-op)
			// rather than a ping: pg_stat_activity keeps showing what the
			// connection is for.
			pctx, cancel := context.WithTimeout(ctx, listenPing)
			_, err = conn.Exec(pctx, listen)
			cancel()
			if err != nil {
				return err
			}
		default:
			return err
		}
	}
}
