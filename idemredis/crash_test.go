package idemredis

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/atonce"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/redis/go-redis/v9"
)

var (
	crashes   = flag.Int("idemredis.crashes", 3, "SIGKILLs of Redis per persistence mode in TestRedisCrash")
	crashSeed = flag.Uint64("idemredis.crashseed", 0, "seed of TestRedisCrash's random moments; 0 draws one (logged)")
	// Half the outages of TestRedisCrash last 1 to 3s: with these
	// defaults they outlast the lease and the completions' resends.
	crashLease           = flag.Duration("idemredis.crashlease", time.Second, "the lease of TestRedisCrash's engines")
	crashCompleteTimeout = flag.Duration("idemredis.crashcompletetimeout", 500*time.Millisecond, "Config.CompleteTimeout of TestRedisCrash's stores")
)

// killableRedis is a private redis-server that a test kills with SIGKILL
// and starts again on the same port and directory, as a crashed server
// restarted by its supervisor would be.
type killableRedis struct {
	t      *testing.T
	bin    string
	addr   string
	args   []string
	cmd    *exec.Cmd
	exited chan error
	log    *lockedWriter
}

func startKillableRedis(t *testing.T, args ...string) *killableRedis {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		testenv.Unavailable(t, "redis-server binary", err)
	}
	port := freePortPair(t)
	k := &killableRedis{t: t, bin: bin, addr: "127.0.0.1:" + strconv.Itoa(port), log: &lockedWriter{b: &strings.Builder{}}}
	k.args = append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", t.TempDir()}, args...)
	k.start()
	t.Cleanup(func() {
		if k.cmd != nil {
			k.kill()
		}
	})
	return k
}

// start runs the server and waits until it answers PING (its data
// loaded).
func (k *killableRedis) start() {
	k.t.Helper()
	if err := k.tryStart(); err != nil {
		k.t.Fatal(err)
	}
}

// tryStart is start for another goroutine than the test's.
func (k *killableRedis) tryStart() error {
	k.cmd = exec.Command(k.bin, k.args...)
	k.cmd.Stdout, k.cmd.Stderr = k.log, k.log
	if err := k.cmd.Start(); err != nil {
		return fmt.Errorf("start redis-server: %v", err)
	}
	k.exited = make(chan error, 1)
	cmd, exited := k.cmd, k.exited
	go func() { exited <- cmd.Wait() }()
	if !waitPing(k.addr, k.exited) {
		return fmt.Errorf("redis-server on %s did not answer:\n%s", k.addr, k.log)
	}
	return nil
}

// kill ends the server with SIGKILL and waits for it to be gone.
func (k *killableRedis) kill() {
	_ = k.cmd.Process.Signal(syscall.SIGKILL)
	<-k.exited
	k.cmd = nil
}

// crashLog is what TestRedisCrash saw of every operation.
type crashLog struct {
	mu   sync.Mutex
	keys map[string]*keyLog
}

// keyLog is one operation's history: its executions in the order they
// started, and the answers its callers were given.
type keyLog struct {
	executions []*execLog
	running    int  // handlers of this key inside their body now
	overlapped bool // two handlers of this key ran at the same time
	acked      string
	stuck      bool
}

// execLog is one execution of a handler and what its Do returned.
type execLog struct {
	body  string
	acked bool   // its Do returned its answer, fresh: the caller got it
	ended string // otherwise, how its Do ended (see failure)
}

// failure names how the Do of an execution whose answer was not
// acknowledged ended.
func failure(err error) string {
	var se *idem.StoreError
	switch {
	case errors.Is(err, idem.ErrLeaseLost):
		// Another execution held the key, or none did: the record was
		// taken over once the lease ended, or forgotten by the restart.
		return "lease lost"
	case errors.As(err, &se):
		return "store " + se.Op + " failed"
	default:
		return fmt.Sprint(err)
	}
}

func (l *crashLog) key(key string) *keyLog {
	k, ok := l.keys[key]
	if !ok {
		k = &keyLog{}
		l.keys[key] = k
	}
	return k
}

// crashResult sums up a crashLog.
type crashResult struct {
	operations, acked int
	lostAcked         int            // acknowledged answers that a later call did not replay
	duplicates        int            // keys whose handler ran more than once
	dupAfterAck       int            // of which a second execution followed an acknowledged answer
	dupBefore         map[string]int // the others, by how the first execution's Do ended
	overlaps          int            // keys whose handlers ran at the same time
	stuck             int            // keys refused as in flight beyond their lease
}

func (r crashResult) String() string {
	return fmt.Sprintf("%d operations, %d acknowledged; %d acknowledged answers lost; %d keys ran twice or more (%d after an acknowledged answer, %d before any was: %v); %d ran two handlers at once; %d stuck beyond their lease",
		r.operations, r.acked, r.lostAcked, r.duplicates, r.dupAfterAck, r.duplicates-r.dupAfterAck, r.dupBefore, r.overlaps, r.stuck)
}

// TestRedisCrash kills a private Redis with SIGKILL at random moments
// while two engines (two clients, as two processes) run fresh keys and
// duplicates released at one barrier, restarts it on the same data
// directory, and lets the callers retry until they get an answer. Then it
// asks every acknowledged key once more, and reports what was lost:
// acknowledged answers that did not replay, handlers that ran twice for
// one key, keys refused as in flight beyond their lease.
//
// What it asserts is what Redis can promise in each mode (docs/STORES.md):
// in every mode no key is stuck beyond its lease, and a handler runs twice
// only after its first answer was lost (never acknowledged, or forgotten
// by the restart); with appendfsync always, no acknowledged answer is
// lost and no two handlers of one key run at once. A SIGKILL ends the
// process, not the machine: what Redis wrote to the AOF survives in the
// page cache, so everysec loses here only what Redis had not yet written,
// and a power loss could cost it up to the last second or two.
func TestRedisCrash(t *testing.T) {
	seed := *crashSeed
	if seed == 0 {
		seed = rand.Uint64()
	}
	t.Logf("seed %d (-idemredis.crashseed to replay the same moments)", seed)
	for _, mode := range []struct {
		name   string
		args   []string
		always bool
	}{
		{"no persistence", nil, false},
		{"aof everysec", []string{"--appendonly", "yes", "--appendfsync", "everysec"}, false},
		{"aof always", []string{"--appendonly", "yes", "--appendfsync", "always"}, true},
	} {
		t.Run(mode.name, func(t *testing.T) {
			res := runCrashes(t, rand.New(rand.NewPCG(seed, uint64(len(mode.name)))), mode.args)
			t.Logf("%s, %d kills, lease %v, CompleteTimeout %v: %v", mode.name, *crashes, *crashLease, *crashCompleteTimeout, res)
			if res.stuck != 0 {
				t.Errorf("%d keys stuck beyond their lease", res.stuck)
			}
			if mode.always && (res.lostAcked != 0 || res.dupAfterAck != 0 || res.overlaps != 0) {
				t.Errorf("appendfsync always lost acknowledged answers or ran two handlers at once: %v", res)
			}
		})
	}
}

func runCrashes(t *testing.T, rng *rand.Rand, args []string) crashResult {
	ctx := context.Background()
	srv := startKillableRedis(t, args...)
	lease := *crashLease
	var engines [2]*idem.Engine
	for i := range engines {
		c := redis.NewClient(&redis.Options{Addr: srv.addr, PoolSize: 32, DialTimeout: time.Second})
		t.Cleanup(func() { _ = c.Close() })
		s, err := NewStore(c, &Config{CompleteTimeout: *crashCompleteTimeout})
		if err != nil {
			t.Fatal(err)
		}
		e, err := idem.NewEngine(s, &idem.Config{Lease: lease, Logger: new(logBuffer).logger()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.Close(context.Background()) })
		engines[i] = e
	}
	log := &crashLog{keys: map[string]*keyLog{}}
	// handler is one call's handler for key; it leaves its execution in
	// *ran.
	handler := func(key string, ran **execLog) func(context.Context) (idem.Result, error) {
		return func(context.Context) (idem.Result, error) {
			log.mu.Lock()
			k := log.key(key)
			x := &execLog{body: fmt.Sprintf("%s#%d", key, len(k.executions)+1)}
			*ran = x
			k.executions = append(k.executions, x)
			k.running++
			if k.running > 1 {
				k.overlapped = true
			}
			log.mu.Unlock()
			time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond) // a business write
			log.mu.Lock()
			k.running--
			log.mu.Unlock()
			return idem.Result{Status: 201, Body: []byte(x.body)}, nil
		}
	}
	// call runs one caller of key until it gets an answer, and returns it.
	// A caller that meets the key in flight for longer than the lease (and
	// a margin for a slow machine) while Redis answers gives up: the key
	// is stuck.
	call := func(engine *idem.Engine, key string) (answer string, ok bool) {
		op := idem.Operation{Tenant: "t", Key: key, Fingerprint: []byte("fp")}
		var inFlightSince time.Time
		for {
			var ran *execLog
			out, err := engine.Do(ctx, op, handler(key, &ran))
			if err != nil && ran != nil {
				log.mu.Lock()
				ran.ended = failure(err)
				log.mu.Unlock()
			}
			if err == nil {
				log.mu.Lock()
				k := log.key(key)
				if !out.Replayed {
					for _, x := range k.executions {
						if x.body == string(out.Result.Body) {
							x.acked = true
						}
					}
				}
				if k.acked == "" {
					k.acked = string(out.Result.Body)
				}
				log.mu.Unlock()
				return string(out.Result.Body), true
			}
			switch {
			case errors.Is(err, idem.ErrInFlight):
				if inFlightSince.IsZero() {
					inFlightSince = time.Now()
				} else if time.Since(inFlightSince) > lease+5*time.Second {
					log.mu.Lock()
					log.key(key).stuck = true
					log.mu.Unlock()
					return "", false
				}
			case errors.Is(err, idem.ErrStore), errors.Is(err, idem.ErrLeaseLost):
				inFlightSince = time.Time{}
			default:
				t.Errorf("Do(%s): %v", key, err)
				return "", false
			}
			time.Sleep(time.Duration(5+rand.IntN(20)) * time.Millisecond)
		}
	}

	stop := make(chan struct{})
	var workers sync.WaitGroup
	var next sync.Mutex
	n := 0
	newKey := func() string {
		next.Lock()
		defer next.Unlock()
		n++
		return fmt.Sprint("op-", n)
	}
	for w := range 6 {
		workers.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				key := newKey()
				if w%2 == 0 {
					// Duplicates of one key at one instant, over both engines.
					atonce.Run(4, func(i int) { call(engines[i%2], key) })
				} else {
					call(engines[w%2], key)
				}
			}
		})
	}
	for i := range *crashes {
		time.Sleep(time.Duration(50+rng.IntN(400)) * time.Millisecond)
		srv.kill()
		// Every other outage outlasts the completions' resends (with the
		// default -idemredis.crashcompletetimeout) and go-redis's own, so
		// that some completions never land.
		down := time.Duration(rng.IntN(200)) * time.Millisecond
		if i%2 == 1 {
			down = time.Second + time.Duration(rng.IntN(2000))*time.Millisecond
		}
		time.Sleep(down)
		srv.start()
	}
	time.Sleep(time.Duration(50+rng.IntN(400)) * time.Millisecond)
	close(stop)
	workers.Wait()

	// Every acknowledged key, asked once more (as a caller would, until it
	// gets an answer: a record that the restart took back to an earlier
	// state in flight answers 409 until its lease ends): it must be the
	// answer its callers got.
	log.mu.Lock()
	acked := map[string]string{}
	for key, k := range log.keys {
		if k.acked != "" {
			acked[key] = k.acked
		}
	}
	log.mu.Unlock()
	lost := 0
	for key, body := range acked {
		if answer, ok := call(engines[0], key); ok && answer != body {
			lost++
		}
	}

	res := crashResult{dupBefore: map[string]int{}}
	log.mu.Lock()
	defer log.mu.Unlock()
	res.operations, res.acked, res.lostAcked = len(log.keys), len(acked), lost
	for _, k := range log.keys {
		if k.stuck {
			res.stuck++
		}
		if k.overlapped {
			res.overlaps++
		}
		if len(k.executions) < 2 {
			continue
		}
		res.duplicates++
		afterAck := false
		for _, x := range k.executions[:len(k.executions)-1] {
			afterAck = afterAck || x.acked
		}
		if afterAck {
			res.dupAfterAck++
		} else {
			res.dupBefore[k.executions[0].ended]++
		}
	}
	return res
}

// TestCompletionOutlastsOutage: the handler has run when Redis goes away
// (killed and restarted on its AOF) or stops taking writes for a moment
// (a read-only replica, as during a failover). The completion resends
// itself until the server answers, so the answer is stored, the caller
// gets it, and the retry replays it: one execution. go-redis's own
// resends are off, so that the store's are what is tested.
func TestCompletionOutlastsOutage(t *testing.T) {
	for _, c := range []struct {
		name   string
		args   []string
		outage func(t *testing.T, k *killableRedis, admin *redis.Client) (end func() error)
	}{
		{"restart", []string{"--appendonly", "yes", "--appendfsync", "always"}, func(t *testing.T, k *killableRedis, _ *redis.Client) func() error {
			k.kill()
			return k.tryStart
		}},
		{"read-only", nil, func(t *testing.T, k *killableRedis, admin *redis.Client) func() error {
			if err := admin.Do(context.Background(), "REPLICAOF", "127.0.0.1", freePortPair(t)).Err(); err != nil {
				t.Fatal(err)
			}
			return func() error { return admin.Do(context.Background(), "REPLICAOF", "NO", "ONE").Err() }
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			srv := startKillableRedis(t, c.args...)
			admin := redis.NewClient(&redis.Options{Addr: srv.addr})
			t.Cleanup(func() { _ = admin.Close() })
			client := redis.NewClient(&redis.Options{Addr: srv.addr, MaxRetries: -1})
			t.Cleanup(func() { _ = client.Close() })
			failed := &firstFailure{seen: make(chan struct{})}
			client.AddHook(failed)
			// A bound far beyond a restart's length: it only ends a test
			// that fails.
			s, err := NewStore(client, &Config{CompleteTimeout: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			e, err := idem.NewEngine(s, &idem.Config{Logger: new(logBuffer).logger()})
			if err != nil {
				t.Fatal(err)
			}
			op := idem.Operation{Tenant: "t", Key: "k", Fingerprint: []byte("fp")}
			executions := 0
			ended := make(chan error, 1)
			out, err := e.Do(ctx, op, func(context.Context) (idem.Result, error) {
				executions++
				failed.armed.Store(true)
				end := c.outage(t, srv, admin)
				// The outage ends once the completion has met it.
				go func() {
					<-failed.seen
					ended <- end()
				}()
				return idem.Result{Status: 201, Body: []byte("stored")}, nil
			})
			if err := <-ended; err != nil {
				t.Fatal(err)
			}
			if err != nil || out.Replayed {
				t.Fatalf("execution whose completion met the outage: %+v %v, want its answer", out, err)
			}
			out, err = e.Do(ctx, op, func(context.Context) (idem.Result, error) {
				executions++
				return idem.Result{Status: 201, Body: []byte("ran again")}, nil
			})
			if err != nil || !out.Replayed || string(out.Result.Body) != "stored" {
				t.Fatalf("retry: %+v %v, want the replay", out, err)
			}
			if executions != 1 {
				t.Fatalf("%d executions, want 1", executions)
			}
		})
	}
}

// firstFailure is a go-redis hook that closes seen when a command first
// fails once armed, other than for a script the server did not have
// (which go-redis sends again at once as EVAL).
type firstFailure struct {
	armed atomic.Bool
	once  sync.Once
	seen  chan struct{}
}

func (f *firstFailure) DialHook(next redis.DialHook) redis.DialHook { return next }

func (f *firstFailure) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err != nil && f.armed.Load() && !redis.HasErrorPrefix(err, "NOSCRIPT") {
			f.once.Do(func() { close(f.seen) })
		}
		return err
	}
}

func (f *firstFailure) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (w *lockedWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}
