package idemredis

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Watch tells the caller when the record of (tenant, key) may have
// changed: the channel it returns is closed when the record is completed
// or released (by any process sharing the records), when the lease it
// held when Watch was called ends, when the record was not held in
// flight to begin with, and when the store lost its subscription (the
// connection broke, a Cluster slot moved), after which a change could go
// unseen. A closed channel is a reason to read the record again, never a
// promise that it changed.
//
// Watch returns once the subscription is in place on the server, so that
// a change made after it returns is seen: read the record after Watch,
// not before. ctx bounds the subscribing only: once Watch has returned,
// the subscription lasts until stop is called, whatever becomes of ctx.
// Call stop once the channel is no longer needed; it does not close the
// channel.
//
// Every watcher of a Store shares one pub/sub connection (on a Cluster,
// one per master that holds watched keys), opened at the first Watch and
// closed after a minute without watchers, and every watcher of one key
// shares one subscription, reference-counted: a thousand watchers of one
// key cost one connection, one subscription and one read of the lease.
// On a Cluster the subscription is sharded (SSUBSCRIBE, Redis 7), so a
// completion is announced only on its own shard. On a Cluster whose
// servers lack sharded pub/sub, nothing is announced: the channel is
// closed after Config.WatchPollInterval instead, and the watchers poll.
func (s *Store) Watch(ctx context.Context, tenant, key string) (changed <-chan struct{}, stop func(), err error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	return s.watches.watch(ctx, s.key(tenant, key))
}

// watchIdle is how long a pub/sub connection without watchers stays open,
// so that a waiter that wakes and watches again does not open a new one.
const watchIdle = time.Minute

// watchPing is how long the pub/sub connection may stay silent before
// the store pings it; a ping unanswered for as long again counts as a
// broken connection.
const watchPing = 15 * time.Second

// watchTimeout bounds the commands Watch sends for the shared
// subscription (the dial and SUBSCRIBE, the read of the lease): they are
// sent on behalf of every watcher of the key, so one watcher's context
// does not end them.
const watchTimeout = 5 * time.Second

// errWatchLost is what a watcher waiting for its subscription gets when
// the server dropped it unasked (a Cluster slot moved away).
var errWatchLost = errors.New("idemredis: watch: the server ended the subscription")

// watches is a store's pub/sub side: its connections, one per server
// (a single one outside a Cluster), created as watchers come.
type watches struct {
	s    *Store
	poll time.Duration

	mu      sync.Mutex
	conns   map[string]*watchConn // by master address; "" outside a Cluster
	polling bool                  // the Cluster lacks sharded pub/sub
}

func newWatches(s *Store, poll time.Duration) *watches {
	return &watches{s: s, poll: poll, conns: map[string]*watchConn{}}
}

// watchConn is one pub/sub connection and the keys watched through it.
// Its fields below mu are guarded by mu, and so are the fields of its
// watchKeys and watchGens; subscribe and unsubscribe commands are written
// under mu, so that their order on the wire is the order of the changes
// to keys.
type watchConn struct {
	w       *watches
	addr    string
	ps      *redis.PubSub
	sharded bool

	mu      sync.Mutex
	keys    map[string]*watchKey // by channel (the record's key)
	pending map[string]int       // (un)subscribe commands not yet confirmed, by channel
	dead    bool
	idle    *time.Timer // closes the connection when no key is watched
}

// watchKey is the subscription to one record's channel, shared by its
// watchers.
type watchKey struct {
	refs  int
	ready chan struct{} // closed once subscribed, or failed (err)
	done  bool          // ready is closed
	err   error
	gen   *watchGen // nil until a watcher asks, and after each change
}

// watchGen is one round of watching a key: the watchers that joined
// before the next change share its channel, closed by that change.
type watchGen struct {
	changed chan struct{}
	timer   *time.Timer // the end of the lease
	fired   bool
}

func (g *watchGen) fire() {
	if g.fired {
		return
	}
	g.fired = true
	close(g.changed)
	if g.timer != nil {
		g.timer.Stop()
	}
}

func (k *watchKey) settle(err error) {
	if k.done {
		return
	}
	k.done, k.err = true, err
	close(k.ready)
}

// fire ends the key's current round: its watchers wake.
func (k *watchKey) fire() {
	if k.gen != nil {
		k.gen.fire()
		k.gen = nil
	}
}

func (w *watches) watch(ctx context.Context, channel string) (<-chan struct{}, func(), error) {
	if w.isPolling() {
		return w.pollWatch(ctx)
	}
	c, err := w.conn(ctx, channel)
	if err != nil {
		return nil, nil, err
	}
	k, err := c.join(ctx, channel)
	if err != nil {
		if w.isPolling() {
			return w.pollWatch(ctx)
		}
		return nil, nil, err
	}
	g, first := c.round(channel, k)
	if first {
		c.arm(ctx, channel, k, g)
	}
	// ctx bounded the subscribing only (idem.Watcher): the subscription
	// lasts until stop. Ending it with ctx made every watcher of the
	// engine, whose ctx ends when Watch returns, miss every announcement.
	var once sync.Once
	return g.changed, func() { once.Do(func() { c.leave(channel, k) }) }, nil
}

func (w *watches) isPolling() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.polling
}

// pollWatch is Watch where nothing is announced: a channel closed after
// the poll interval.
func (w *watches) pollWatch(ctx context.Context) (<-chan struct{}, func(), error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	changed := make(chan struct{})
	timer := time.AfterFunc(w.poll, func() { close(changed) })
	return changed, func() { timer.Stop() }, nil
}

// conn returns the connection for channel's server, opening it when
// there is none.
func (w *watches) conn(ctx context.Context, channel string) (*watchConn, error) {
	var node *redis.Client
	addr := ""
	if cc, ok := w.s.client.(*redis.ClusterClient); ok {
		var err error
		if node, err = cc.MasterForKey(ctx, channel); err != nil {
			return nil, fmt.Errorf("idemredis: watch: %w", err)
		}
		addr = node.Options().Addr
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if c := w.conns[addr]; c != nil {
		return c, nil
	}
	c := &watchConn{w: w, addr: addr, keys: map[string]*watchKey{}, pending: map[string]int{}}
	if node != nil {
		// A shard's channels live on its master: SSUBSCRIBE there.
		c.ps, c.sharded = node.SSubscribe(context.Background()), true
	} else {
		c.ps = w.s.client.Subscribe(context.Background())
	}
	w.conns[addr] = c
	go c.read()
	return c, nil
}

// join adds a watcher to channel's subscription, subscribing when it is
// the first, and returns once the server confirmed the subscription.
func (c *watchConn) join(ctx context.Context, channel string) (*watchKey, error) {
	c.mu.Lock()
	if c.dead {
		c.mu.Unlock()
		return nil, errors.New("idemredis: watch: the connection closed meanwhile")
	}
	k := c.keys[channel]
	if k == nil {
		k = &watchKey{ready: make(chan struct{})}
		c.keys[channel] = k
		if c.idle != nil {
			c.idle.Stop()
			c.idle = nil
		}
		if err := c.command(channel, true); err != nil {
			c.mu.Unlock()
			c.fail(err)
			return nil, fmt.Errorf("idemredis: watch: %w", err)
		}
	}
	k.refs++
	c.mu.Unlock()
	select {
	case <-k.ready:
	case <-ctx.Done():
		c.leave(channel, k)
		return nil, ctx.Err()
	}
	if k.err != nil {
		c.leave(channel, k)
		return nil, fmt.Errorf("idemredis: watch: %w", k.err)
	}
	return k, nil
}

// command writes SUBSCRIBE (or UNSUBSCRIBE) for channel; c.mu is held.
func (c *watchConn) command(channel string, subscribe bool) error {
	c.pending[channel]++
	ctx, cancel := context.WithTimeout(context.Background(), watchTimeout)
	defer cancel()
	switch {
	case subscribe && c.sharded:
		return c.ps.SSubscribe(ctx, channel)
	case subscribe:
		return c.ps.Subscribe(ctx, channel)
	case c.sharded:
		return c.ps.SUnsubscribe(ctx, channel)
	default:
		return c.ps.Unsubscribe(ctx, channel)
	}
}

// round returns the key's current round, starting one when there is
// none, and reports whether it started it. A key whose subscription was
// lost since it was joined gets a round already over.
func (c *watchConn) round(channel string, k *watchKey) (*watchGen, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dead || c.keys[channel] != k {
		g := &watchGen{changed: make(chan struct{})}
		g.fire()
		return g, false
	}
	if k.gen != nil {
		return k.gen, false
	}
	k.gen = &watchGen{changed: make(chan struct{})}
	return k.gen, true
}

// arm reads the record's lease, once subscribed, and ends the round when
// the lease ends, or at once when the record is not held: a change made
// before the subscription is seen there.
func (c *watchConn) arm(ctx context.Context, channel string, k *watchKey, g *watchGen) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), watchTimeout)
	defer cancel()
	left, err := c.w.s.run(ctx, leaseScript, channel).Int64()
	c.mu.Lock()
	defer c.mu.Unlock()
	if g.fired {
		return
	}
	if err != nil || left < 0 {
		// Not held, or not known to be: the watchers look again.
		g.fire()
		if k.gen == g {
			k.gen = nil
		}
		return
	}
	// A millisecond past the end, so that the lease has ended on the
	// server's clock when the watchers look.
	g.timer = time.AfterFunc(time.Duration(left)*time.Microsecond+time.Millisecond, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		g.fire()
		if k.gen == g {
			k.gen = nil
		}
	})
}

// leave removes a watcher of channel, and the subscription with its last
// watcher.
func (c *watchConn) leave(channel string, k *watchKey) {
	c.mu.Lock()
	k.refs--
	if k.refs > 0 || c.dead || c.keys[channel] != k {
		c.mu.Unlock()
		return
	}
	delete(c.keys, channel)
	if k.gen != nil && k.gen.timer != nil {
		k.gen.timer.Stop()
	}
	err := c.command(channel, false)
	if err == nil && len(c.keys) == 0 {
		c.idle = time.AfterFunc(watchIdle, c.closeIdle)
	}
	c.mu.Unlock()
	if err != nil {
		c.fail(err)
	}
}

// closeIdle closes the connection if no key is watched through it.
func (c *watchConn) closeIdle() {
	c.mu.Lock()
	if len(c.keys) > 0 || c.dead {
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	c.fail(errors.New("idle"))
}

// fail ends the connection: every watcher wakes (a change may have gone
// unseen), a watcher waiting for its subscription gets err, and the next
// Watch opens a new connection.
func (c *watchConn) fail(err error) {
	c.w.mu.Lock()
	if c.w.conns[c.addr] == c {
		delete(c.w.conns, c.addr)
	}
	c.w.mu.Unlock()
	c.mu.Lock()
	if c.dead {
		c.mu.Unlock()
		return
	}
	c.dead = true
	for _, k := range c.keys {
		k.settle(err)
		k.fire()
	}
	if c.idle != nil {
		c.idle.Stop()
	}
	c.mu.Unlock()
	_ = c.ps.Close()
}

// read receives the connection's confirmations and messages until it
// fails or closes.
func (c *watchConn) read() {
	ctx := context.Background()
	pinged := false
	for {
		msg, err := c.ps.ReceiveTimeout(ctx, watchPing)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() && !pinged {
			// Silence: make sure the connection still answers.
			pinged = true
			if err = c.ps.Ping(ctx); err == nil {
				continue
			}
		}
		if err != nil {
			if unknownCommand(err) && c.sharded {
				c.w.mu.Lock()
				c.w.polling = true
				c.w.mu.Unlock()
			}
			c.fail(err)
			return
		}
		pinged = false
		switch m := msg.(type) {
		case *redis.Subscription:
			c.confirmed(m)
		case *redis.Message:
			c.mu.Lock()
			if k := c.keys[m.Channel]; k != nil {
				k.fire()
			}
			c.mu.Unlock()
		}
	}
}

// confirmed accounts for the server's confirmation of a (un)subscribe
// command. A key is subscribed once every command written for it is
// confirmed (the last one written was its SUBSCRIBE). An unsubscribe the
// store did not ask for is the server dropping the subscription (on a
// Cluster, when the key's slot moved): its watchers wake.
func (c *watchConn) confirmed(m *redis.Subscription) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.pending[m.Channel]
	if n == 0 {
		if strings.HasSuffix(m.Kind, "unsubscribe") {
			if k := c.keys[m.Channel]; k != nil {
				delete(c.keys, m.Channel)
				k.settle(errWatchLost)
				k.fire()
			}
		}
		return
	}
	if n > 1 {
		c.pending[m.Channel] = n - 1
		return
	}
	delete(c.pending, m.Channel)
	if k := c.keys[m.Channel]; k != nil {
		k.settle(nil)
	}
}

// unknownCommand reports whether err is a server's refusal of a command
// it does not know (SSUBSCRIBE before Redis 7).
func unknownCommand(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr) && strings.Contains(strings.ToLower(rerr.Error()), "unknown command")
}
