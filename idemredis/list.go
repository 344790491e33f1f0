package idemredis

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemkeys"
	"github.com/idem-go/idem/internal/keylist"
)

var _ idemkeys.Lister = (*Store)(nil)

// MaxListed bounds what ListKeys and KeyStats read: Redis has no index of
// the records, so each call walks the keyspace with SCAN, matching the
// record keys (of one tenant, and one key prefix, when given) on the
// server, and reads every match. A call that matches more records than
// this fails, asking for a tenant or a prefix, rather than hold them all
// in memory.
const MaxListed = 100_000

// listFields are the fields a listed record is read from: all but the
// body and the steps.
var listFields = []string{"tenant", "key", "fingerprint", "state", "token", "locked_until",
	"created_at", "expires_at", "completed_at", "mode", "status", "header", "reference"}

// ListKeys implements idemkeys.Lister. It costs a SCAN of the whole
// keyspace (every server's, on a Cluster) and one HMGET per matching
// record, pipelined, then sorts the matches: fine for thousands of
// records, slow for millions. The tenant and the prefix narrow what the
// server returns, not what it walks. See MaxListed.
func (s *Store) ListKeys(ctx context.Context, p idemkeys.ListParams) (idemkeys.Page, error) {
	if err := keylist.CheckStatus(p.Status); err != nil {
		return idemkeys.Page{}, err
	}
	if _, _, err := keylist.Decode(p.After); err != nil {
		return idemkeys.Page{}, err
	}
	now, recs, err := s.scanRecords(ctx, p.Tenant, p.Prefix)
	if err != nil {
		return idemkeys.Page{}, err
	}
	return keylist.Page(recs, p, now)
}

// KeyStats implements idemkeys.Lister at the cost of ListKeys. Records past
// their retention are deleted by Redis itself: none is ever expired.
func (s *Store) KeyStats(ctx context.Context, p idemkeys.StatsParams) (idemkeys.Stats, error) {
	now, recs, err := s.scanRecords(ctx, p.Tenant, "")
	if err != nil {
		return idemkeys.Stats{}, err
	}
	c := keylist.NewCounter(now)
	for _, rec := range recs {
		c.Add(rec)
	}
	return c.Stats(), nil
}

// forgetScript deletes KEYS[1] when it is complete under the token.
// ARGV: token. Returns 1, or 0 when there is no such record.
var forgetScript = newScript("", `
local cur = redis.call('HMGET', KEYS[1], 'state', 'token')
if cur[1] ~= 'complete' or cur[2] ~= ARGV[1] then
	return 0
end
redis.call('DEL', KEYS[1])
return 1
`)

// Forget implements idemkeys.Lister, in one script.
func (s *Store) Forget(ctx context.Context, p idemkeys.ForgetParams) error {
	n, err := s.run(ctx, forgetScript, s.key(p.Tenant, p.Key), strconv.FormatInt(p.Token, 10)).Int()
	if err != nil {
		return fmt.Errorf("idemredis: forget: %w", err)
	}
	if n == 0 {
		return idem.ErrNotFound
	}
	return nil
}

// globEscape escapes what SCAN's MATCH takes for a pattern.
func globEscape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if strings.IndexByte(`*?[]\`, s[i]) >= 0 {
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// pattern is the MATCH of the record keys of tenant (all when empty) whose
// key starts with prefix.
func (s *Store) pattern(tenant, prefix string) string {
	if tenant == "" {
		return globEscape(s.prefix) + ":{*"
	}
	t := escape(tenant)
	return globEscape(s.prefix+":{"+strconv.Itoa(len(t))+":"+t+":"+escape(prefix)) + "*"
}

// scanRecords reads the records that match, and the server's clock.
func (s *Store) scanRecords(ctx context.Context, tenant, prefix string) (time.Time, []*idem.Record, error) {
	now, err := s.client.Time(ctx).Result()
	if err != nil {
		return time.Time{}, nil, fmt.Errorf("idemredis: list: %w", err)
	}
	match := s.pattern(tenant, prefix)
	var mu sync.Mutex
	var keys []string
	scan := func(ctx context.Context, c redis.Cmdable) error {
		iter := c.Scan(ctx, 0, match, 1000).Iterator()
		for iter.Next(ctx) {
			mu.Lock()
			keys = append(keys, iter.Val())
			n := len(keys)
			mu.Unlock()
			if n > MaxListed {
				return fmt.Errorf("idemredis: list: more than %d records match; name a tenant or a key prefix", MaxListed)
			}
		}
		return iter.Err()
	}
	if cc, ok := s.client.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return scan(ctx, c) })
	} else {
		err = scan(ctx, s.client)
	}
	if err != nil {
		return time.Time{}, nil, err
	}
	recs := make([]*idem.Record, 0, len(keys))
	for start := 0; start < len(keys); start += 500 {
		batch := keys[start:min(start+500, len(keys))]
		cmds := make([]*redis.SliceCmd, len(batch))
		_, err := s.client.Pipelined(ctx, func(pipe redis.Pipeliner) error {
			for i, k := range batch {
				cmds[i] = pipe.HMGet(ctx, k, listFields...)
			}
			return nil
		})
		if err != nil && err != redis.Nil {
			return time.Time{}, nil, fmt.Errorf("idemredis: list: %w", err)
		}
		for _, cmd := range cmds {
			vals, err := cmd.Result()
			if err != nil {
				return time.Time{}, nil, fmt.Errorf("idemredis: list: %w", err)
			}
			f := make(map[string]string, len(listFields))
			for i, v := range vals {
				if str, ok := v.(string); ok {
					f[listFields[i]] = str
				}
			}
			if f["state"] == "" {
				continue // expired or deleted since the SCAN
			}
			rec, err := decodeRecord(f)
			if err != nil {
				return time.Time{}, nil, err
			}
			recs = append(recs, rec)
		}
	}
	return now, recs, nil
}
