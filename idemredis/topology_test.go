package idemredis

import (
	"context"
	"errors"
	"fmt"
	"log"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstoretest"
	"github.com/idem-go/idem/internal/atonce"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/redis/go-redis/v9"
)

// The tests in this file start their own Redis servers (the redis-server
// binary of the machine, as .ci/run uses) to run the store on the two
// topologies a single server cannot show: a Cluster of three masters, and
// a master with a replica watched by a Sentinel, failover included.

func init() {
	// go-redis logs every address a Sentinel names; the failover test
	// makes it name many. Other lines still go to the standard logger.
	redis.SetLogger(sentinelQuiet{})
}

type sentinelQuiet struct{}

func (sentinelQuiet) Printf(ctx context.Context, format string, v ...any) {
	if msg := fmt.Sprintf(format, v...); !strings.HasPrefix(msg, "sentinel: ") {
		log.Print(msg)
	}
}

// redisServer is one redis-server process of a test, stopped when the
// test ends.
type redisServer struct {
	addr string
	port int
	dir  string
	cmd  *exec.Cmd
	log  *strings.Builder
}

// startRedis starts redis-server on a free port with args added to a
// configuration that keeps nothing on disk, and waits until it answers.
// A Cluster node also listens on its port + 10000, so ports are drawn
// below 55536. Without the binary the test is skipped (failed under CI).
func startRedis(t *testing.T, args ...string) *redisServer {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		testenv.Unavailable(t, "redis-server binary", err)
	}
	for try := 0; ; try++ {
		port := freePortPair(t)
		dir := t.TempDir()
		s := &redisServer{addr: "127.0.0.1:" + strconv.Itoa(port), port: port, dir: dir, log: &strings.Builder{}}
		all := append([]string{
			"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no", "--dir", dir,
		}, args...)
		if len(args) > 0 && strings.HasSuffix(args[0], ".conf") {
			// A configuration file (Sentinel's) must come first.
			all = append([]string{args[0]}, append(all[:len(all)-len(args)], args[1:]...)...)
		}
		s.cmd = exec.Command(bin, all...)
		s.cmd.Stdout, s.cmd.Stderr = &lockedWriter{b: s.log}, &lockedWriter{b: s.log}
		if err := s.cmd.Start(); err != nil {
			t.Fatalf("start redis-server: %v", err)
		}
		exited := make(chan error, 1)
		go func() { exited <- s.cmd.Wait() }()
		t.Cleanup(func() {
			_ = s.cmd.Process.Kill()
			<-exited
		})
		if waitPing(s.addr, exited) {
			return s
		}
		if try == 5 {
			t.Fatalf("redis-server on %s never answered:\n%s", s.addr, s.log)
		}
	}
}

// freePortPair returns a port that is free, and whose Cluster bus port
// (+10000) is free too, at the time of asking.
func freePortPair(t *testing.T) int {
	t.Helper()
	for range 100 {
		port := 20000 + rand.IntN(35000)
		a, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			continue
		}
		b, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port+10000))
		_ = a.Close()
		if err != nil {
			continue
		}
		_ = b.Close()
		return port
	}
	t.Fatal("no free port pair")
	return 0
}

// waitPing waits up to 10s for PING to succeed, or for the process to
// exit (a port taken meanwhile), and says whether the server answered.
func waitPing(addr string, exited <-chan error) bool {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		select {
		case <-exited:
			return false
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return true
		}
		time.Sleep(50 * time.Millisecond)
	}
	return false
}

type lockedWriter struct {
	mu sync.Mutex
	b  *strings.Builder
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// eventuallyRedis polls cond every 50ms for up to 30s.
func eventuallyRedis(t *testing.T, what string, cond func() error) {
	t.Helper()
	var err error
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if err = cond(); err == nil {
			return
		}
	}
	t.Fatalf("gave up waiting for %s: %v", what, err)
}

// startCluster starts three masters, gives each a third of the 16384
// slots, introduces them to each other, and waits until every node says
// the cluster is ok. It returns the nodes' addresses.
func startCluster(t *testing.T) []string {
	t.Helper()
	ctx := context.Background()
	const nodes = 3
	addrs := make([]string, nodes)
	clients := make([]*redis.Client, nodes)
	for i := range nodes {
		s := startRedis(t, "--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(t.TempDir(), "nodes.conf"),
			"--cluster-node-timeout", "5000")
		addrs[i] = s.addr
		clients[i] = redis.NewClient(&redis.Options{Addr: s.addr})
		t.Cleanup(func() { _ = clients[i].Close() })
	}
	const slots = 16384
	for i, c := range clients {
		first, last := i*slots/nodes, (i+1)*slots/nodes-1
		if err := c.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", first, last).Err(); err != nil {
			t.Fatalf("CLUSTER ADDSLOTSRANGE on %s: %v", addrs[i], err)
		}
	}
	for i := 1; i < nodes; i++ {
		host, port, _ := net.SplitHostPort(addrs[i])
		if err := clients[0].ClusterMeet(ctx, host, port).Err(); err != nil {
			t.Fatalf("CLUSTER MEET: %v", err)
		}
	}
	for i, c := range clients {
		eventuallyRedis(t, "cluster_state:ok on "+addrs[i], func() error {
			info, err := c.ClusterInfo(ctx).Result()
			if err != nil {
				return err
			}
			if !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_known_nodes:3") {
				return errors.New(strings.TrimSpace(info))
			}
			return nil
		})
	}
	return addrs
}

func newClusterClient(t *testing.T, addrs []string) *redis.ClusterClient {
	t.Helper()
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, PoolSize: 64})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestCluster runs the conformance suite on a Redis Cluster of three
// masters, each fixture's Store and Peer on cluster clients of their own,
// and checks that records do spread over the three nodes (the suite would
// otherwise prove nothing a single node does not).
func TestCluster(t *testing.T) {
	addrs := startCluster(t)
	idemstoretest.Exercise(context.Background(), t, func(t *testing.T) *idemstoretest.Fixture {
		prefix := testenv.Name()
		return &idemstoretest.Fixture{
			Store: newUniversalStore(t, newClusterClient(t, addrs), prefix),
			Peer:  newUniversalStore(t, newClusterClient(t, addrs), prefix),
		}
	}, idemstoretest.Capabilities{Transactional: false, SelfExpiring: true})

	t.Run("records spread over the nodes", func(t *testing.T) {
		ctx := context.Background()
		c := newClusterClient(t, addrs)
		s := newUniversalStore(t, c, testenv.Name())
		for i := range 60 {
			op := claimParams("tenant-"+strconv.Itoa(i%3), "key-"+strconv.Itoa(i), "fp", 1)
			if r, err := s.Claim(ctx, op); err != nil || !r.Won {
				t.Fatalf("claim %d: %+v %v", i, r, err)
			}
		}
		perNode := map[string]int64{}
		var mu sync.Mutex
		err := c.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
			n, err := node.DBSize(ctx).Result()
			mu.Lock()
			perNode[node.Options().Addr] = n
			mu.Unlock()
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(perNode) != 3 {
			t.Fatalf("records on %d masters, want 3: %v", len(perNode), perNode)
		}
		for addr, n := range perNode {
			if n == 0 {
				t.Errorf("no record on %s: %v", addr, perNode)
			}
		}
	})
}

// TestClusterDuplicatesAtOnce: 50 engines, half on one cluster client and
// half on another, run one key released at the same instant, for keys
// whose slots are on each of the three masters: one execution per key.
func TestClusterDuplicatesAtOnce(t *testing.T) {
	addrs := startCluster(t)
	prefix := testenv.Name()
	engines := make([]*idem.Engine, 2)
	for i := range engines {
		e, err := idem.NewEngine(newUniversalStore(t, newClusterClient(t, addrs), prefix), nil)
		if err != nil {
			t.Fatal(err)
		}
		engines[i] = e
	}
	for k := range 6 {
		key := "pay-" + strconv.Itoa(k)
		var mu sync.Mutex
		executions, replays, inFlight := 0, 0, 0
		atonce.Run(50, func(i int) {
			out, err := engines[i%2].Do(context.Background(), idem.Operation{Tenant: "t", Key: key, Fingerprint: []byte("same")},
				func(context.Context) (idem.Result, error) {
					mu.Lock()
					executions++
					mu.Unlock()
					time.Sleep(20 * time.Millisecond) // keep the others meeting it in flight
					return idem.Result{Status: 201, Body: []byte("order " + key)}, nil
				})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case errors.Is(err, idem.ErrInFlight):
				inFlight++
			case err != nil:
				t.Errorf("Do: %v", err)
			case out.Replayed && string(out.Result.Body) == "order "+key:
				replays++
			case !out.Replayed:
			default:
				t.Errorf("replay of %s = %q", key, out.Result.Body)
			}
		})
		if executions != 1 || executions+replays+inFlight != 50 {
			t.Errorf("%s: %d executions, %d replays, %d in flight; want 1 execution of 50", key, executions, replays, inFlight)
		}
	}
}

// newUniversalStore returns a store over any client with prefix. The
// servers of these tests are the test's own and die with it, so nothing
// is deleted afterwards.
func newUniversalStore(t testing.TB, client redis.UniversalClient, prefix string) *Store {
	t.Helper()
	s, err := NewStore(client, &Config{Prefix: prefix})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return s
}

// sentinelSet is a master, its replica and one Sentinel watching them
// under the name "idem".
type sentinelSet struct {
	master, replica, sentinel *redisServer
}

func startSentinelSet(t *testing.T) *sentinelSet {
	t.Helper()
	ctx := context.Background()
	master := startRedis(t)
	replica := startRedis(t, "--replicaof", "127.0.0.1", strconv.Itoa(master.port))
	conf := filepath.Join(t.TempDir(), "sentinel.conf")
	// A quorum of one: this test's single Sentinel decides alone. Ten
	// seconds before a master counts as down, so that a slow machine does
	// not fail over by itself; the failover test asks for one explicitly.
	body := fmt.Sprintf("sentinel monitor idem 127.0.0.1 %d 1\n"+
		"sentinel down-after-milliseconds idem 10000\n"+
		"sentinel failover-timeout idem 10000\n", master.port)
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	sentinel := startRedis(t, conf, "--sentinel")
	sc := redis.NewSentinelClient(&redis.Options{Addr: sentinel.addr})
	defer sc.Close()
	rc := redis.NewClient(&redis.Options{Addr: master.addr})
	defer rc.Close()
	eventuallyRedis(t, "the replica in sync and known to the Sentinel", func() error {
		info, err := rc.Info(ctx, "replication").Result()
		if err != nil {
			return err
		}
		if !strings.Contains(info, "connected_slaves:1") || !strings.Contains(info, "state=online") {
			return errors.New(info)
		}
		replicas, err := sc.Replicas(ctx, "idem").Result()
		if err != nil {
			return err
		}
		if len(replicas) != 1 {
			return fmt.Errorf("sentinel knows %d replicas", len(replicas))
		}
		return nil
	})
	return &sentinelSet{master: master, replica: replica, sentinel: sentinel}
}

func (set *sentinelSet) client(t *testing.T) *redis.Client {
	t.Helper()
	c := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:    "idem",
		SentinelAddrs: []string{set.sentinel.addr},
		PoolSize:      64,
	})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestSentinel runs the conformance suite through Sentinel failover
// clients (the master the Sentinel names, found by asking it).
func TestSentinel(t *testing.T) {
	set := startSentinelSet(t)
	idemstoretest.Exercise(context.Background(), t, func(t *testing.T) *idemstoretest.Fixture {
		prefix := testenv.Name()
		return &idemstoretest.Fixture{
			Store: newUniversalStore(t, set.client(t), prefix),
			Peer:  newUniversalStore(t, set.client(t), prefix),
		}
	}, idemstoretest.Capabilities{Transactional: false, SelfExpiring: true})
}

// TestSentinelFailover: a key completed, and one in flight, both
// replicated (WAIT); the Sentinel promotes the replica and turns the old
// master into its replica. Through the same store afterwards, on the new
// master, which has never loaded idem's scripts (EVALSHA answers
// NOSCRIPT, the store falls back to EVAL): a new key runs and is stored
// there, the completed key replays, and the in-flight one is still in
// flight and fenced.
func TestSentinelFailover(t *testing.T) {
	ctx := context.Background()
	set := startSentinelSet(t)
	client := set.client(t)
	s := newUniversalStore(t, client, testenv.Name())
	e, err := idem.NewEngine(s, &idem.Config{Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	done := idem.Operation{Tenant: "t", Key: "done", Fingerprint: []byte("fp")}
	if _, err := e.Do(ctx, done, func(context.Context) (idem.Result, error) {
		return idem.Result{Status: 201, Body: []byte("first")}, nil
	}); err != nil {
		t.Fatal(err)
	}
	if r, err := s.Claim(ctx, claimParams("t", "running", "fp", 1)); err != nil || !r.Won {
		t.Fatalf("claim: %+v %v", r, err)
	}
	// Replication is asynchronous: without WAIT a failover may lose the
	// last writes, as the package documentation says.
	if n, err := client.Wait(ctx, 1, 5*time.Second).Result(); err != nil || n != 1 {
		t.Fatalf("WAIT = %d %v, want 1 replica", n, err)
	}

	promoted := redis.NewClient(&redis.Options{Addr: set.replica.addr})
	defer promoted.Close()
	demoted := redis.NewClient(&redis.Options{Addr: set.master.addr})
	defer demoted.Close()
	if loaded, err := promoted.ScriptExists(ctx, claimScript.flagged.sha).Result(); err != nil || loaded[0] {
		t.Fatalf("SCRIPT EXISTS on the replica = %v %v, want a server that never loaded the claim script", loaded, err)
	}
	sc := redis.NewSentinelClient(&redis.Options{Addr: set.sentinel.addr})
	defer sc.Close()
	if err := sc.Failover(ctx, "idem").Err(); err != nil {
		t.Fatalf("SENTINEL FAILOVER: %v", err)
	}
	role := func(c *redis.Client) string {
		r, err := c.Do(ctx, "ROLE").Slice()
		if err != nil || len(r) == 0 {
			return fmt.Sprint(err)
		}
		return fmt.Sprint(r[0])
	}
	eventuallyRedis(t, "the replica promoted and the old master its replica", func() error {
		addr, err := sc.GetMasterAddrByName(ctx, "idem").Result()
		if err != nil {
			return err
		}
		if got := net.JoinHostPort(addr[0], addr[1]); got != set.replica.addr {
			return fmt.Errorf("the Sentinel names %s", got)
		}
		if p, d := role(promoted), role(demoted); p != "master" || d != "slave" {
			return fmt.Errorf("roles: promoted %s, demoted %s", p, d)
		}
		return nil
	})

	// The failover client learns of the switch from the Sentinel and
	// reconnects; until then a write meets the old master, now a
	// read-only replica, which the store reports as a store error, never
	// as an outcome.
	fresh := idem.Operation{Tenant: "t", Key: "new", Fingerprint: []byte("fp")}
	runs := 0
	eventuallyRedis(t, "a new key run on the new master", func() error {
		out, err := e.Do(ctx, fresh, func(context.Context) (idem.Result, error) {
			runs++
			return idem.Result{Status: 201, Body: []byte("new")}, nil
		})
		if err != nil && !errors.Is(err, idem.ErrStore) {
			t.Fatalf("Do after failover: %v, want an outcome or a store error", err)
		}
		if err == nil && (out.Replayed || string(out.Result.Body) != "new") {
			t.Fatalf("new key after failover: %+v", out)
		}
		return err
	})
	if runs != 1 {
		t.Errorf("the new key ran %d times", runs)
	}
	if n, err := promoted.Exists(ctx, s.key("t", "new")).Result(); err != nil || n != 1 {
		t.Fatalf("the new key's record on the new master: %d %v", n, err)
	}
	if loaded, err := promoted.ScriptExists(ctx, claimScript.flagged.sha).Result(); err != nil || !loaded[0] {
		t.Fatalf("SCRIPT EXISTS on the new master = %v %v: the claim did not go through EVAL there", loaded, err)
	}

	out, err := e.Do(ctx, done, func(context.Context) (idem.Result, error) {
		t.Error("the completed key ran again after the failover")
		return idem.Result{}, nil
	})
	if err != nil || !out.Replayed || string(out.Result.Body) != "first" {
		t.Fatalf("after failover: %+v %v, want the replay of \"first\"", out, err)
	}
	if r, err := s.Claim(ctx, claimParams("t", "running", "fp", 2)); err != nil || r.Won || r.Record.LeaseToken != 1 {
		t.Fatalf("claim of the in-flight key after failover: %+v %v, want lost to token 1", r, err)
	}
	if err := s.Extend(ctx, idem.ExtendParams{Tenant: "t", Key: "running", Token: 2, Lease: time.Minute}); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("extend with a stale token after failover: %v, want ErrLeaseLost", err)
	}
	if err := s.Extend(ctx, idem.ExtendParams{Tenant: "t", Key: "running", Token: 1, Lease: time.Minute}); err != nil {
		t.Fatalf("extend by the holder after failover: %v", err)
	}
}

// claimParams claims (tenant, key) for a minute, kept for an hour.
func claimParams(tenant, key, fp string, token int64) idem.ClaimParams {
	return idem.ClaimParams{Tenant: tenant, Key: key, Fingerprint: []byte(fp), Token: token, Lease: time.Minute, Retention: time.Hour}
}
