package idemredis

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// evictionRisk is what one server says about evicting our keys.
type evictionRisk struct {
	addr      string
	policy    string
	maxmemory string
}

// canEvict reports whether the server may drop a record before its
// retention ends. Every record carries a TTL (that is how retention is
// kept), so the volatile-* policies select our keys just as allkeys-* do;
// volatile-ttl even prefers the records closest to expiry. Only two
// settings are safe: noeviction (at the memory limit writes fail, so a
// claim fails closed with 503 and nothing stored is lost) and maxmemory 0
// (no limit is enforced, so the policy never applies).
func (r evictionRisk) canEvict() bool {
	return r.policy != "noeviction" && r.maxmemory != "0"
}

// checkEviction reads maxmemory and maxmemory-policy on every server that
// holds records: each master of a Cluster, each shard of a Ring, the
// server (or Sentinel's master) otherwise. It returns the servers whose
// settings can evict, or an error when a server could not be asked:
// managed services often refuse or rename CONFIG.
func checkEviction(ctx context.Context, client redis.UniversalClient) ([]evictionRisk, error) {
	var (
		mu    sync.Mutex
		risky []evictionRisk
	)
	check := func(ctx context.Context, c redis.Cmdable, addr string) error {
		cfg, err := c.ConfigGet(ctx, "maxmemory*").Result()
		if err != nil {
			return err
		}
		r := evictionRisk{addr: addr, policy: cfg["maxmemory-policy"], maxmemory: cfg["maxmemory"]}
		if r.policy == "" || r.maxmemory == "" {
			return fmt.Errorf("CONFIG GET maxmemory* on %s answered %v", r.addr, cfg)
		}
		if r.canEvict() {
			mu.Lock()
			risky = append(risky, r)
			mu.Unlock()
		}
		return nil
	}
	perNode := func(ctx context.Context, c *redis.Client) error {
		return check(ctx, c, c.Options().Addr)
	}
	var err error
	switch c := client.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, perNode)
	case *redis.Ring:
		err = c.ForEachShard(ctx, perNode)
	case *redis.Client:
		err = perNode(ctx, c)
	default:
		// A wrapper of the integrator's: ask whichever server it routes to.
		err = check(ctx, c, fmt.Sprintf("%T", c))
	}
	return risky, err
}

// checkTimeout bounds the policy check, so that a server that does not
// answer (a black-holed address rather than a refused one) delays New by
// this much at most instead of by go-redis's dial retries.
const checkTimeout = 5 * time.Second

// reportEviction logs, or returns as an error when required, what
// checkEviction found.
func reportEviction(ctx context.Context, client redis.UniversalClient, config *Config, logger *slog.Logger) error {
	checkCtx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	risky, err := checkEviction(checkCtx, client)
	if err != nil {
		if config.RequireNoEviction {
			return fmt.Errorf("idemredis: cannot verify the eviction policy: %w", err)
		}
		logger.WarnContext(ctx, "idemredis: cannot verify that Redis never evicts idempotency records; make sure maxmemory-policy is noeviction",
			slog.Any("error", err))
		return nil
	}
	if len(risky) == 0 {
		return nil
	}
	var servers []string
	for _, r := range risky {
		servers = append(servers, fmt.Sprintf("%s (maxmemory-policy %s, maxmemory %s)", r.addr, r.policy, r.maxmemory))
	}
	msg := "Redis may evict idempotency records before their retention ends, and an evicted key runs again on retry; set maxmemory-policy noeviction"
	if config.RequireNoEviction {
		return fmt.Errorf("idemredis: %s: %s", msg, strings.Join(servers, ", "))
	}
	logger.WarnContext(ctx, "idemredis: "+msg, slog.String("servers", strings.Join(servers, ", ")))
	return nil
}
