package idemredis

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/atonce"
	"github.com/redis/go-redis/v9"
)

// The tests of Watch run on a redis-server of their own, so that CLIENT
// LIST and PUBSUB count only their connections and subscriptions.

// watchServer is a private server, a store on it and a peer store on a
// client of its own (another process), with an admin client.
type watchServer struct {
	srv         *redisServer
	admin       *redis.Client
	store, peer *Store
}

func startWatchServer(t *testing.T) *watchServer {
	t.Helper()
	srv := startRedis(t)
	ws := &watchServer{srv: srv}
	clients := make([]*redis.Client, 3)
	for i := range clients {
		clients[i] = redis.NewClient(&redis.Options{Addr: srv.addr, PoolSize: 64})
		t.Cleanup(func() { _ = clients[i].Close() })
	}
	ws.admin = clients[0]
	ws.store = newUniversalStore(t, clients[1], "w")
	ws.peer = newUniversalStore(t, clients[2], "w")
	return ws
}

// pubsubClients counts the server's connections that hold a
// subscription, and the subscriptions they hold; a Sentinel's own
// connections (named sentinel-…, subscribed to its hello channel) are not
// counted.
func pubsubClients(t *testing.T, admin *redis.Client) (conns, subs int) {
	t.Helper()
	list, err := admin.ClientList(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(list), "\n") {
		if strings.Contains(line, " name=sentinel-") {
			continue
		}
		n := 0
		for _, field := range strings.Fields(line) {
			name, value, _ := strings.Cut(field, "=")
			if name == "sub" || name == "psub" || name == "ssub" {
				v, _ := strconv.Atoi(value)
				n += v
			}
		}
		if n > 0 {
			conns++
			subs += n
		}
	}
	return conns, subs
}

// numSub is how many connections subscribe to channel (PUBSUB NUMSUB, or
// SHARDNUMSUB when sharded).
func numSub(t *testing.T, c *redis.Client, channel string, sharded bool) int64 {
	t.Helper()
	ctx := context.Background()
	var m map[string]int64
	var err error
	if sharded {
		m, err = c.PubSubShardNumSub(ctx, channel).Result()
	} else {
		m, err = c.PubSubNumSub(ctx, channel).Result()
	}
	if err != nil {
		t.Fatal(err)
	}
	return m[channel]
}

// closedWithin reports whether ch is closed within d. Tests use it with
// a generous d to bound a wait, never to measure one.
func closedWithin(ch <-chan struct{}, d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ch:
		return true
	case <-timer.C:
		return false
	}
}

// stillOpen reports whether ch is not closed (now, and after a short
// pause for a wrongly sent notification to arrive).
func stillOpen(ch <-chan struct{}) bool {
	return !closedWithin(ch, 100*time.Millisecond)
}

// TestWatchManyWatchersOneConnection: 200 watchers of one key, started at
// one barrier, share one connection and one subscription; a completion by
// another process wakes every one of them; once they stop, the
// subscription is gone.
func TestWatchManyWatchersOneConnection(t *testing.T) {
	ctx := context.Background()
	ws := startWatchServer(t)
	if r, err := ws.store.Claim(ctx, claimParams("t", "k", "fp", 7)); err != nil || !r.Won {
		t.Fatalf("claim: %+v %v", r, err)
	}
	const n = 200
	chans := make([]<-chan struct{}, n)
	stops := make([]func(), n)
	errs := make([]error, n)
	atonce.Run(n, func(i int) {
		chans[i], stops[i], errs[i] = ws.store.Watch(ctx, "t", "k")
	})
	for i, err := range errs {
		if err != nil {
			t.Fatalf("watcher %d: %v", i, err)
		}
	}
	if conns, subs := pubsubClients(t, ws.admin); conns != 1 || subs != 1 {
		t.Fatalf("%d watchers hold %d pub/sub connections with %d subscriptions, want 1 and 1", n, conns, subs)
	}
	if got := numSub(t, ws.admin, ws.store.key("t", "k"), false); got != 1 {
		t.Fatalf("PUBSUB NUMSUB = %d, want 1", got)
	}
	for i, ch := range chans {
		if i%50 == 0 && !stillOpen(ch) {
			t.Fatalf("watcher %d woken before any change", i)
		}
	}
	unit, _ := ws.peer.Begin(ctx)
	if err := unit.Complete(ctx, idem.CompleteParams{Tenant: "t", Key: "k", Token: 7, Result: idem.Result{Status: 201}}); err != nil {
		t.Fatal(err)
	}
	for i, ch := range chans {
		if !closedWithin(ch, 30*time.Second) {
			t.Fatalf("watcher %d not woken by the completion", i)
		}
	}
	for _, stop := range stops {
		stop()
	}
	eventuallyRedis(t, "the subscription to end with its last watcher", func() error {
		if got := numSub(t, ws.admin, ws.store.key("t", "k"), false); got != 0 {
			return fmt.Errorf("PUBSUB NUMSUB = %d", got)
		}
		return nil
	})
	if conns, _ := pubsubClients(t, ws.admin); conns > 1 {
		t.Fatalf("%d pub/sub connections, want at most the one kept open", conns)
	}
}

// TestWatchWakes: every way a held record changes wakes its watchers,
// and only those of that key: a release (deleted), a release of a record
// holding steps (its lease ended), the end of the lease, and a record not
// held to begin with. A step or an extension does not wake them.
func TestWatchWakes(t *testing.T) {
	ctx := context.Background()
	ws := startWatchServer(t)
	s := ws.store
	watch := func(key string) <-chan struct{} {
		t.Helper()
		ch, stop, err := s.Watch(ctx, "t", key)
		if err != nil {
			t.Fatalf("watch %s: %v", key, err)
		}
		t.Cleanup(stop)
		return ch
	}
	claim := func(key string, token int64, lease time.Duration) {
		t.Helper()
		p := claimParams("t", key, "fp", token)
		p.Lease = lease
		if r, err := ws.peer.Claim(ctx, p); err != nil || !r.Won {
			t.Fatalf("claim %s: %+v %v", key, r, err)
		}
	}

	claim("released", 1, time.Hour)
	claim("bystander", 2, time.Hour)
	released, bystander := watch("released"), watch("bystander")
	if err := ws.peer.Release(ctx, idem.ReleaseParams{Tenant: "t", Key: "released", Token: 1}); err != nil {
		t.Fatal(err)
	}
	if !closedWithin(released, 30*time.Second) {
		t.Fatal("a release did not wake its watcher")
	}
	if !stillOpen(bystander) {
		t.Fatal("a release woke the watcher of another key")
	}

	claim("stepped", 3, time.Hour)
	stepped := watch("stepped")
	if err := saveStep(ws.peer, "stepped", 3, "charge", "x"); err != nil {
		t.Fatal(err)
	}
	if err := ws.peer.Extend(ctx, idem.ExtendParams{Tenant: "t", Key: "stepped", Token: 3, Lease: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if !stillOpen(stepped) {
		t.Fatal("a step or an extension woke a watcher")
	}
	if err := ws.peer.Release(ctx, idem.ReleaseParams{Tenant: "t", Key: "stepped", Token: 3}); err != nil {
		t.Fatal(err)
	}
	if !closedWithin(stepped, 30*time.Second) {
		t.Fatal("the release of a record holding steps did not wake its watcher")
	}

	claim("expiring", 4, 300*time.Millisecond)
	expiring := watch("expiring")
	if !closedWithin(expiring, 30*time.Second) {
		t.Fatal("the end of the lease did not wake the watcher")
	}
	if rec, err := s.Get(ctx, "t", "expiring"); err != nil || rec.LockedUntil.After(serverNow(t, s)) {
		t.Fatalf("watcher woken at the end of the lease, but the record %+v %v is still held", rec, err)
	}

	for _, key := range []string{"absent", "released"} {
		if !closedWithin(watch(key), 30*time.Second) {
			t.Fatalf("watcher of a record not held (%s) not woken at once", key)
		}
	}
	if !stillOpen(bystander) {
		t.Fatal("the bystander was woken")
	}
}

// TestWatchStop: a subscription lasts while one of its watchers does:
// stop releases a watcher, and the last one's release unsubscribes. The
// context given to Watch bounds the subscribing only: its end afterwards
// releases nothing (the engine ends it as soon as Watch returns). A
// context ended before Watch is refused. A watcher that joins after a
// change gets a fresh channel.
func TestWatchStop(t *testing.T) {
	ctx := context.Background()
	ws := startWatchServer(t)
	s := ws.store
	channel := s.key("t", "k")
	if r, err := s.Claim(ctx, claimParams("t", "k", "fp", 7)); err != nil || !r.Won {
		t.Fatalf("claim: %+v %v", r, err)
	}
	cctx, cancel := context.WithCancel(ctx)
	ended, stopEnded, err := s.Watch(cctx, "t", "k")
	if err != nil {
		t.Fatal(err)
	}
	first, stop, err := s.Watch(ctx, "t", "k")
	if err != nil {
		t.Fatal(err)
	}
	if got := numSub(t, ws.admin, channel, false); got != 1 {
		t.Fatalf("NUMSUB with two watchers = %d, want 1", got)
	}
	cancel()
	stop()
	stop() // twice is harmless
	// The watcher whose context ended keeps the subscription.
	time.Sleep(100 * time.Millisecond)
	if got := numSub(t, ws.admin, channel, false); got != 1 {
		t.Fatalf("NUMSUB after one watcher stopped and the other's context ended = %d, want 1", got)
	}
	if !stillOpen(first) || !stillOpen(ended) {
		t.Fatal("stop, or the end of a context, closed a channel")
	}
	stopEnded()
	eventuallyRedis(t, "the last watcher's stop to unsubscribe", func() error {
		if got := numSub(t, ws.admin, channel, false); got != 0 {
			return fmt.Errorf("NUMSUB = %d", got)
		}
		return nil
	})
	if _, _, err := s.Watch(cctx, "t", "k"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Watch with an ended context: %v, want context.Canceled", err)
	}

	// Rounds: a watcher after a change does not get the closed channel.
	a, stopA, err := s.Watch(ctx, "t", "k")
	if err != nil {
		t.Fatal(err)
	}
	defer stopA()
	if err := s.Extend(ctx, idem.ExtendParams{Tenant: "t", Key: "k", Token: 7, Lease: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx, idem.ReleaseParams{Tenant: "t", Key: "k", Token: 7}); err != nil {
		t.Fatal(err)
	}
	if !closedWithin(a, 30*time.Second) {
		t.Fatal("release did not wake the watcher")
	}
	if r, err := s.Claim(ctx, claimParams("t", "k", "fp", 8)); err != nil || !r.Won {
		t.Fatalf("claim: %+v %v", r, err)
	}
	b, stopB, err := s.Watch(ctx, "t", "k")
	if err != nil {
		t.Fatal(err)
	}
	defer stopB()
	if !stillOpen(b) {
		t.Fatal("a watcher after the change got a closed channel while the record is held")
	}
}

// TestWatchConnectionLost: when the server drops the pub/sub connection a
// change may go unseen, so every watcher wakes; the next Watch opens a new
// connection and is woken by the next change.
func TestWatchConnectionLost(t *testing.T) {
	ctx := context.Background()
	ws := startWatchServer(t)
	s := ws.store
	if r, err := s.Claim(ctx, claimParams("t", "k", "fp", 7)); err != nil || !r.Won {
		t.Fatalf("claim: %+v %v", r, err)
	}
	ch, stop, err := s.Watch(ctx, "t", "k")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if n, err := ws.admin.ClientKillByFilter(ctx, "TYPE", "pubsub").Result(); err != nil || n != 1 {
		t.Fatalf("CLIENT KILL TYPE pubsub = %d %v, want 1", n, err)
	}
	if !closedWithin(ch, 30*time.Second) {
		t.Fatal("watcher not woken when its connection was lost")
	}
	ch, stop2, err := s.Watch(ctx, "t", "k")
	if err != nil {
		t.Fatalf("watch after the connection was lost: %v", err)
	}
	defer stop2()
	if !stillOpen(ch) {
		t.Fatal("new watcher woken without a change")
	}
	unit, _ := s.Begin(ctx)
	if err := unit.Complete(ctx, idem.CompleteParams{Tenant: "t", Key: "k", Token: 7, Result: idem.Result{Status: 201}}); err != nil {
		t.Fatal(err)
	}
	if !closedWithin(ch, 30*time.Second) {
		t.Fatal("the completion did not wake the watcher on the new connection")
	}
	if conns, _ := pubsubClients(t, ws.admin); conns != 1 {
		t.Fatalf("%d pub/sub connections, want 1", conns)
	}
}

// TestWatchPolls: where nothing is announced (a Cluster without sharded
// pub/sub), the channel closes after the poll interval, with no change,
// and holds no subscription.
func TestWatchPolls(t *testing.T) {
	ctx := context.Background()
	ws := startWatchServer(t)
	s, err := NewStore(ws.admin, &Config{Prefix: "poll", WatchPollInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	s.watches.polling = true
	if r, err := s.Claim(ctx, claimParams("t", "k", "fp", 7)); err != nil || !r.Won {
		t.Fatalf("claim: %+v %v", r, err)
	}
	ch, stop, err := s.Watch(ctx, "t", "k")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if conns, _ := pubsubClients(t, ws.admin); conns != 0 {
		t.Fatalf("a polling watcher holds %d pub/sub connections", conns)
	}
	if !closedWithin(ch, 30*time.Second) {
		t.Fatal("a polling watcher was never woken")
	}
}

// TestWatchOnTopologies: on a Cluster of three masters, the completion's
// SPUBLISH reaches watchers of keys on every master, through one sharded
// subscription per key and one connection per master; through a Sentinel
// failover client, PUBLISH on the master does. Recovery points work there
// too: a release keeps the steps for the takeover.
func TestWatchOnTopologies(t *testing.T) {
	t.Run("cluster", func(t *testing.T) {
		addrs := startCluster(t)
		c := newClusterClient(t, addrs)
		watchAndStepScenario(t, newUniversalStore(t, c, "w"), newUniversalStore(t, newClusterClient(t, addrs), "w"), func(t *testing.T, keys []string) {
			var nodes []*redis.Client
			var mu sync.Mutex
			if err := c.ForEachMaster(context.Background(), func(ctx context.Context, node *redis.Client) error {
				mu.Lock()
				defer mu.Unlock()
				nodes = append(nodes, node)
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			conns, subs := 0, 0
			for _, node := range nodes {
				n, m := pubsubClients(t, node)
				if n != 1 {
					t.Errorf("%d pub/sub connections on master %s, want 1", n, node.Options().Addr)
				}
				conns, subs = conns+n, subs+m
			}
			if conns != 3 || subs != len(keys) {
				t.Fatalf("%d pub/sub connections with %d subscriptions, want 3 (one per master) with %d", conns, subs, len(keys))
			}
			for _, k := range keys {
				node, err := c.MasterForKey(context.Background(), k)
				if err != nil {
					t.Fatal(err)
				}
				if n := numSub(t, node, k, true); n != 1 {
					t.Fatalf("SHARDNUMSUB %s on its master = %d, want 1", k, n)
				}
			}
		})
	})
	t.Run("sentinel", func(t *testing.T) {
		set := startSentinelSet(t)
		admin := redis.NewClient(&redis.Options{Addr: set.master.addr})
		t.Cleanup(func() { _ = admin.Close() })
		watchAndStepScenario(t, newUniversalStore(t, set.client(t), "w"), newUniversalStore(t, set.client(t), "w"), func(t *testing.T, keys []string) {
			if conns, subs := pubsubClients(t, admin); conns != 1 || subs != len(keys) {
				t.Fatalf("%d pub/sub connections with %d subscriptions on the master, want 1 with %d", conns, subs, len(keys))
			}
		})
	})
}

// watchAndStepScenario watches 12 keys (spread over a Cluster's masters)
// with 10 watchers each through s, checks the connections with
// checkConns, completes the keys through peer and waits for every
// watcher; then saves a step, releases and takes over with it.
func watchAndStepScenario(t *testing.T, s, peer *Store, checkConns func(t *testing.T, keys []string)) {
	ctx := context.Background()
	var keys []string
	var chans []<-chan struct{}
	for i := range 12 {
		key := "k" + strconv.Itoa(i)
		keys = append(keys, s.key("t", key))
		if r, err := s.Claim(ctx, claimParams("t", key, "fp", int64(i+1))); err != nil || !r.Won {
			t.Fatalf("claim %s: %+v %v", key, r, err)
		}
		for range 10 {
			ch, stop, err := s.Watch(ctx, "t", key)
			if err != nil {
				t.Fatalf("watch %s: %v", key, err)
			}
			t.Cleanup(stop)
			chans = append(chans, ch)
		}
	}
	checkConns(t, keys)
	for i := range 12 {
		unit, _ := peer.Begin(ctx)
		if err := unit.Complete(ctx, idem.CompleteParams{Tenant: "t", Key: "k" + strconv.Itoa(i), Token: int64(i + 1), Result: idem.Result{Status: 201}}); err != nil {
			t.Fatalf("complete k%d: %v", i, err)
		}
	}
	for i, ch := range chans {
		if !closedWithin(ch, 30*time.Second) {
			t.Fatalf("watcher %d of k%d not woken by its completion", i%10, i/10)
		}
	}

	if r, err := s.Claim(ctx, claimParams("t", "steps", "fp", 1)); err != nil || !r.Won {
		t.Fatalf("claim: %+v %v", r, err)
	}
	if err := saveStep(s, "steps", 1, "charge", "ch_1"); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx, idem.ReleaseParams{Tenant: "t", Key: "steps", Token: 1}); err != nil {
		t.Fatal(err)
	}
	r, err := peer.Claim(ctx, claimParams("t", "steps", "fp", 2))
	if err != nil || !r.Won || !r.Takeover || stepNames(r.Steps) != `[charge="ch_1"]` {
		t.Fatalf("claim after the release: %+v %v, want a takeover with the step", r, err)
	}
}

// lateConn delivers, once the connection has sent a (un)subscribe
// command, everything it writes late, in order: the command reaches the
// server well after the client thinks it sent it, as over a slow link.
type lateConn struct {
	net.Conn
	mu    sync.Mutex
	queue chan []byte
}

func (c *lateConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	if c.queue == nil && bytes.Contains(bytes.ToLower(p), []byte("subscribe")) {
		c.queue = make(chan []byte, 1024)
		go func() {
			for b := range c.queue {
				time.Sleep(300 * time.Millisecond)
				if _, err := c.Conn.Write(b); err != nil {
					return
				}
			}
		}()
	}
	queue := c.queue
	c.mu.Unlock()
	if queue == nil {
		return c.Conn.Write(p)
	}
	queue <- bytes.Clone(p)
	return len(p), nil
}

// TestWatchReturnsSubscribed: Watch returns once the server has the
// subscription, so a change made right after it returns is seen, however
// late the subscription reaches the server.
func TestWatchReturnsSubscribed(t *testing.T) {
	ctx := context.Background()
	ws := startWatchServer(t)
	slow := redis.NewClient(&redis.Options{Addr: ws.srv.addr, Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &lateConn{Conn: c}, nil
	}})
	t.Cleanup(func() { _ = slow.Close() })
	s := newUniversalStore(t, slow, "w")
	for i := range 3 {
		key := "k" + strconv.Itoa(i)
		if r, err := ws.peer.Claim(ctx, claimParams("t", key, "fp", 7)); err != nil || !r.Won {
			t.Fatalf("claim: %+v %v", r, err)
		}
		ch, stop, err := s.Watch(ctx, "t", key)
		if err != nil {
			t.Fatal(err)
		}
		unit, _ := ws.peer.Begin(ctx)
		if err := unit.Complete(ctx, idem.CompleteParams{Tenant: "t", Key: key, Token: 7, Result: idem.Result{Status: 201}}); err != nil {
			t.Fatal(err)
		}
		if !closedWithin(ch, 10*time.Second) {
			t.Fatalf("a completion right after Watch returned was not seen (watch %d)", i)
		}
		stop()
	}
}
