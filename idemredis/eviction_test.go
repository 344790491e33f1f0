package idemredis

import (
	"context"
	"strings"
	"testing"

	"github.com/idem-go/idem/internal/testenv"
	"github.com/redis/go-redis/v9"
)

func TestCanEvict(t *testing.T) {
	for _, c := range []struct {
		policy, maxmemory string
		want              bool
	}{
		{"noeviction", "0", false},
		{"noeviction", "1073741824", false},
		{"allkeys-lru", "0", false}, // no limit: the policy never applies
		{"allkeys-lru", "1073741824", true},
		{"allkeys-lfu", "1073741824", true},
		{"allkeys-random", "1073741824", true},
		// Every record has a TTL, so volatile-* can pick them too.
		{"volatile-lru", "1073741824", true},
		{"volatile-lfu", "1073741824", true},
		{"volatile-random", "1073741824", true},
		{"volatile-ttl", "1073741824", true},
	} {
		if got := (evictionRisk{policy: c.policy, maxmemory: c.maxmemory}).canEvict(); got != c.want {
			t.Errorf("policy %s maxmemory %s: canEvict = %v, want %v", c.policy, c.maxmemory, got, c.want)
		}
	}
}

// TestNewChecksPolicy: against the test server, New reads the policy and,
// if it is safe, says nothing; if not, it warns, and with
// RequireNoEviction it refuses. The server's settings are not changed:
// other tests share it.
func TestNewChecksPolicy(t *testing.T) {
	ctx := context.Background()
	client := newClient(t, -1)
	cfg, err := client.ConfigGet(ctx, "maxmemory*").Result()
	if err != nil {
		t.Skipf("CONFIG GET refused by the test server: %v", err)
	}
	risky := evictionRisk{policy: cfg["maxmemory-policy"], maxmemory: cfg["maxmemory"]}.canEvict()

	var logs logBuffer
	if _, err := NewStore(client, &Config{Logger: logs.logger()}); err != nil {
		t.Fatal(err)
	}
	if warned := strings.Contains(logs.String(), "may evict"); warned != risky {
		t.Fatalf("policy %v: warned=%v, logs %q", cfg, warned, logs.String())
	}
	_, err = NewStore(client, &Config{RequireNoEviction: true})
	if (err != nil) != risky {
		t.Fatalf("policy %v with RequireNoEviction: %v", cfg, err)
	}
}

// TestNewWhereConfigIsRefused: a user without the CONFIG command (as on
// managed services) still gets a store, with a warning; RequireNoEviction
// refuses it. The test adds an ACL user for itself and deletes it.
func TestNewWhereConfigIsRefused(t *testing.T) {
	ctx := context.Background()
	admin := newClient(t, -1)
	user, password := testenv.Name(), testenv.Name()
	err := admin.Do(ctx, "ACL", "SETUSER", user, "on", ">"+password, "~*", "+@all", "-config").Err()
	if err != nil {
		t.Skipf("ACL SETUSER refused by the test server: %v", err)
	}
	t.Cleanup(func() { admin.Do(context.Background(), "ACL", "DELUSER", user) })

	opt := *admin.Options()
	opt.Username, opt.Password = user, password
	limited := redis.NewClient(&opt)
	t.Cleanup(func() { _ = limited.Close() })
	if err := limited.ConfigGet(ctx, "maxmemory").Err(); err == nil {
		t.Fatal("the limited user can run CONFIG GET; the test proves nothing")
	}

	var logs logBuffer
	s, err := NewStore(limited, &Config{Prefix: testenv.Name(), Logger: logs.logger()})
	if err != nil {
		t.Fatalf("New where CONFIG is refused: %v", err)
	}
	if !strings.Contains(logs.String(), "cannot verify") {
		t.Fatalf("no warning logged: %q", logs.String())
	}
	if _, err := NewStore(limited, &Config{RequireNoEviction: true}); err == nil {
		t.Fatal("New with RequireNoEviction where CONFIG is refused succeeded")
	}
	// The store works for the limited user.
	if _, err := s.Get(ctx, "t", "k"); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Fatalf("Get through the limited user: %v, want not found", err)
	}
}

// TestNewRefusesBadConfig covers the configuration errors.
func TestNewRefusesBadConfig(t *testing.T) {
	if _, err := NewStore(nil, nil); err == nil {
		t.Error("New(nil client) succeeded")
	}
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:0"})
	defer client.Close()
	for _, prefix := range []string{"a{b", "a}b"} {
		if _, err := NewStore(client, &Config{Prefix: prefix}); err == nil {
			t.Errorf("New with prefix %q succeeded", prefix)
		}
	}
}
