package idemredis

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
)

// A client's read and write timeouts are the application's choice for its
// request path: a claim keeps them, and fails fast (503) when Redis is
// slow. The calls that end an execution are different: a release, an
// extension, a completion. The engine sends releases and extensions on
// contexts of their own, bounded by idem.Config.CleanupTimeout (releases
// after a failed claim: a few seconds each) and by the heartbeat, often
// after the request has failed or its caller has gone; a completion has
// Config.CompleteTimeout. Cut short by a timeout shorter than that, a
// write is a release or a completion never sent, which leaves the key
// held until its lease ends (and, once the lease ends, a completion never
// sent lets a retry run the handler again); a reply cut short reports a
// failure for a call that did take effect. So these calls wait as long as
// their context allows.

// sendPatiently runs sc on key, with the client's timeouts stretched to
// ctx's deadline (see patient).
func (s *Store) sendPatiently(ctx context.Context, sc *script, key string, args ...any) *redis.Cmd {
	keys := []string{key}
	c, node := s.patient(ctx, key)
	cmd := s.eval(ctx, c, sc, false, keys, args...)
	if node && (redis.HasErrorPrefix(cmd.Err(), "MOVED") || redis.HasErrorPrefix(cmd.Err(), "ASK")) {
		// The slot moved since the Cluster client last looked: let it
		// follow the redirection.
		cmd = s.eval(ctx, s.client, sc, false, keys, args...)
	}
	return cmd
}

// patient returns the client to send a call on key with: the store's
// client, or, when ctx's deadline lies beyond the client's read or write
// timeout, a copy of it (sharing its connection pool) whose timeouts reach
// that deadline. A single server's or a Sentinel's client (*redis.Client)
// is copied; for a Cluster, the client of the master that holds key's
// slot, and node reports that the call bypasses the Cluster client's
// redirections. Other clients keep their timeouts.
func (s *Store) patient(ctx context.Context, key string) (c processor, node bool) {
	deadline, ok := ctx.Deadline()
	if !ok {
		return s.client, false
	}
	wait := time.Until(deadline)
	switch c := s.client.(type) {
	case *redis.Client:
		if shorter(c.Options(), wait) {
			return c.WithTimeout(wait), false
		}
	case *redis.ClusterClient:
		if master, err := c.MasterForKey(ctx, key); err == nil && shorter(master.Options(), wait) {
			return master.WithTimeout(wait), true
		}
	}
	return s.client, false
}

// shorter reports whether a timeout of opt would end a call before wait.
// Zero and negative timeouts (none, or no deadline set at all) never do.
func shorter(opt *redis.Options, wait time.Duration) bool {
	return opt.ReadTimeout > 0 && opt.ReadTimeout < wait || opt.WriteTimeout > 0 && opt.WriteTimeout < wait
}
