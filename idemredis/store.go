package idemredis

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem"
	"github.com/redis/go-redis/v9"
)

// DefaultPrefix is the key prefix used when Config.Prefix is empty.
const DefaultPrefix = "idem"

// Config configures a Store. The zero value of every field means its
// documented default.
type Config struct {
	// Prefix starts every key the store writes: records live at
	// "<Prefix>:{<tenant and key>}". Processes that share records must use
	// the same prefix; distinct applications on one server use distinct
	// ones. It may not contain '{' or '}', which would move the Cluster
	// hash tag. Defaults to "idem".
	Prefix string

	// Logger receives the warning about an eviction policy that can drop
	// records, or about a policy New could not read. Defaults to
	// slog.Default().
	Logger *slog.Logger

	// RequireNoEviction makes New fail, instead of logging a warning, when
	// a server may evict records (see New) or when its policy cannot be
	// read. Defaults to false.
	RequireNoEviction bool

	// CompleteTimeout bounds the completion of a handler's answer,
	// resends included. The handler has run by then, so its answer is
	// stored whatever becomes of its caller (the end of the context given
	// to the engine, and its deadline, are ignored), and while Redis
	// cannot be reached, its reply is lost or it refuses the write (a
	// restart, a failover, a full server before Redis 7), the completion
	// is sent again, under the same completion id, until this much time
	// has passed. An answer never stored leaves the key in flight until
	// its lease ends, and the next retry then runs the handler again.
	// Defaults to 5s; negative means a single attempt on the caller's
	// context.
	CompleteTimeout time.Duration

	// WatchPollInterval is how often a watcher checks the record again on
	// a Cluster whose servers lack sharded pub/sub (before Redis 7): the
	// channel Watch returns is then closed after this long, whether or
	// not the record changed. Defaults to 250ms.
	WatchPollInterval time.Duration
}

// DefaultWatchPollInterval is Config.WatchPollInterval's default.
const DefaultWatchPollInterval = 250 * time.Millisecond

// DefaultCompleteTimeout is Config.CompleteTimeout's default.
const DefaultCompleteTimeout = 5 * time.Second

// Store is an idem.Store on Redis. It is safe for concurrent use; create it
// with NewStore.
type Store struct {
	client          redis.UniversalClient
	prefix          string
	completeTimeout time.Duration
	plain           atomic.Bool // a server refused the flagged scripts (see eval)
	// notify is the command the completion and the release announce a
	// change with: SPUBLISH on a Cluster, PUBLISH elsewhere.
	notify  string
	watches *watches
}

var (
	_ idem.Store     = (*Store)(nil)
	_ idem.StepStore = (*Store)(nil)
)

// Info implements idem.Store: "redis", without transactions.
func (s *Store) Info() idem.StoreInfo { return idem.StoreInfo{Name: "redis"} }

// NewStore returns a store over client: a single server, a Sentinel failover
// client or a Cluster client. A nil config means every default.
//
// NewStore checks the servers' memory policy with CONFIG GET. A record that
// Redis evicts before its retention ends is forgotten, and its next retry
// runs the operation again, so only maxmemory-policy noeviction (or no
// maxmemory limit at all) is safe: every record has a TTL, so the
// volatile-* policies can evict them just as the allkeys-* ones can. An
// unsafe policy is logged as a warning. Where CONFIG is refused or
// renamed (managed services) or the server cannot be reached, NewStore logs
// that it could not check and still returns the store: the first claim
// will tell whether the server is there, and fail closed if it is not.
// The check gives up after 5s. Config.RequireNoEviction turns both
// warnings into errors.
func NewStore(client redis.UniversalClient, config *Config) (*Store, error) {
	if client == nil {
		return nil, errors.New("idemredis: NewStore needs a client")
	}
	cfg := Config{}
	if config != nil {
		cfg = *config
	}
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	if strings.ContainsAny(cfg.Prefix, "{}") {
		return nil, fmt.Errorf("idemredis: prefix %q contains a brace, which would break the Cluster hash tag", cfg.Prefix)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.CompleteTimeout == 0 {
		cfg.CompleteTimeout = DefaultCompleteTimeout
	}
	if cfg.WatchPollInterval <= 0 {
		cfg.WatchPollInterval = DefaultWatchPollInterval
	}
	if err := reportEviction(context.Background(), client, &cfg, cfg.Logger); err != nil {
		return nil, err
	}
	s := &Store{client: client, prefix: cfg.Prefix, completeTimeout: cfg.CompleteTimeout, notify: "PUBLISH"}
	if _, ok := client.(*redis.ClusterClient); ok {
		s.notify = "SPUBLISH"
	}
	s.watches = newWatches(s, cfg.WatchPollInterval)
	return s, nil
}

func (s *Store) key(tenant, key string) string { return recordKey(s.prefix, tenant, key) }

// Claim implements idem.Store in one Lua script: it reads the record and,
// when there is none, it is past retention, or it is in flight with an
// expired lease and the same fingerprint, writes a fresh in-flight record
// with the lease deadline taken from the server's clock and a TTL that
// ends with the retention (or the lease, if that ends later). A claim won
// over an in-flight record (a takeover) reports it, with the recovery
// points the earlier executions recorded (ClaimResult.Takeover, Steps).
func (s *Store) Claim(ctx context.Context, p idem.ClaimParams) (idem.ClaimResult, error) {
	// Sent once, without go-redis's resends, so that its error tells
	// whether it may have run: a resend can meet a refusal (a replica
	// after a failover, a full server) after a first attempt that ran and
	// whose reply was lost.
	reply, err := s.eval(ctx, claimScript, true, []string{s.key(p.Tenant, p.Key)},
		p.Tenant, p.Key, p.Fingerprint, strconv.FormatInt(p.Token, 10),
		p.Lease.Microseconds(), p.Retention.Microseconds()).Slice()
	if err != nil {
		err = fmt.Errorf("idemredis: claim: %w", err)
		if !mayHaveRun(err) {
			// Otherwise the script may run, or have run, after all: the
			// engine releases what it may claim, fenced by the token.
			err = idem.NotApplied(err)
		}
		return idem.ClaimResult{}, err
	}
	if len(reply) == 0 {
		return idem.ClaimResult{}, errors.New("idemredis: claim: empty reply")
	}
	if won, _ := reply[0].(int64); won == 1 {
		return wonClaim(reply)
	}
	if len(reply) != 2 {
		return idem.ClaimResult{}, fmt.Errorf("idemredis: claim: unexpected reply %v", reply)
	}
	fields, err := decodePairs(reply[1])
	if err != nil {
		return idem.ClaimResult{}, err
	}
	rec, err := decodeRecord(fields)
	if err != nil {
		return idem.ClaimResult{}, err
	}
	return idem.ClaimResult{Record: rec}, nil
}

// Extend implements idem.Store in one Lua script fenced by the token.
func (s *Store) Extend(ctx context.Context, p idem.ExtendParams) error {
	ok, err := s.run(ctx, extendScript, s.key(p.Tenant, p.Key),
		strconv.FormatInt(p.Token, 10), p.Lease.Microseconds()).Int()
	if err != nil {
		return fmt.Errorf("idemredis: extend: %w", err)
	}
	if ok != 1 {
		return idem.ErrLeaseLost
	}
	return nil
}

// Release implements idem.Store in one Lua script fenced by the token. A
// record holding recovery points is not deleted: its lease ends now, and
// it stays in flight, under its retention, for the next claim to take
// over with its steps. Watchers of the key are woken (Watch).
func (s *Store) Release(ctx context.Context, p idem.ReleaseParams) error {
	if err := s.run(ctx, releaseScript, s.key(p.Tenant, p.Key),
		strconv.FormatInt(p.Token, 10), s.notify).Err(); err != nil {
		return fmt.Errorf("idemredis: release: %w", err)
	}
	return nil
}

// Get implements idem.Store, recovery points included. Records past their
// retention have been deleted by their TTL, so Get returns
// idem.ErrNotFound for them.
func (s *Store) Get(ctx context.Context, tenant, key string) (*idem.Record, error) {
	fields, err := s.client.HGetAll(ctx, s.key(tenant, key)).Result()
	if err != nil {
		return nil, fmt.Errorf("idemredis: get: %w", err)
	}
	if len(fields) == 0 {
		return nil, idem.ErrNotFound
	}
	return decodeRecord(fields)
}

// Purge implements idem.Store and deletes nothing: every record carries a
// TTL that ends with its retention (or its lease, if that ends later), so
// Redis deletes expired records itself, and a scan of the keyspace for
// them would only load the server. It returns 0, so an idemjanitor.Janitor
// pointed at this store is harmless but useless.
func (s *Store) Purge(ctx context.Context, p idem.PurgeParams) (int, error) {
	return 0, ctx.Err()
}

// Begin implements idem.Store. Redis cannot join the handler's business
// transaction: the Tx only completes (see the package documentation).
func (s *Store) Begin(ctx context.Context) (idem.UnitOfWork, error) {
	return tx{s}, ctx.Err()
}

// mayHaveRun reports whether a claim that failed with err may
// nevertheless have run, or run later, on the server. It did not when the
// server answered it with an error: a refusal (out of memory, a read-only
// replica, a failed disk, a script the server does not know, a slot it
// does not serve, a server still loading) comes before the script's
// first write, and the claim script makes no write before that point
// (scripts.go). Nor when it was never sent whole: no connection could be
// made (dial) or taken from the pool, the client was closed, or writing
// the command failed, so that the server received none or part of it,
// which it never runs. Anything else (a reply that timed out or never
// came, a connection reset after the command went out, a context that
// ended meanwhile) may hide a claim that ran.
//
// This holds for the claim only because it is sent once (see Claim): after
// go-redis's resends, the last error says nothing of the earlier attempts.
func mayHaveRun(err error) bool {
	var rerr redis.Error
	if errors.As(err, &rerr) {
		return false
	}
	var op *net.OpError
	if errors.As(err, &op) && (op.Op == "dial" || op.Op == "write") {
		return false
	}
	return !errors.Is(err, redis.ErrPoolTimeout) && !errors.Is(err, redis.ErrClosed)
}
