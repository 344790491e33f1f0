package idemfronttest

import (
	"context"
	"strings"
	"testing"

	"github.com/idem-go/idem/idemfront"
)

// tenants: one key names one operation per tenant, and a tenant no store
// could keep is refused as the server's bug it is.
func (s *suite) tenants(t *testing.T) {
	t.Run("Isolated", func(t *testing.T) {
		t.Parallel()
		e := s.newEnv(t, Options{}, func(_ context.Context, body []byte) Response {
			return Response{Body: append([]byte("for "), body...)}
		})
		alice, bob := e.call("k", "alice's order"), e.call("k", "bob's order")
		alice.Tenant, bob.Tenant = e.tenant+"-alice", e.tenant+"-bob"
		wantAnswer(t, "alice", e.send(alice), idemfront.Executed, []byte("for alice's order"))
		// Bob sends alice's key with another body: no mismatch, his own
		// operation.
		wantAnswer(t, "bob under alice's key", e.send(bob), idemfront.Executed, []byte("for bob's order"))
		wantAnswer(t, "alice again", e.send(alice), idemfront.Replayed, []byte("for alice's order"))
		wantAnswer(t, "bob again", e.send(bob), idemfront.Replayed, []byte("for bob's order"))
		// And alice's exact request from bob is bob's first.
		bobAsAlice := alice
		bobAsAlice.Tenant = e.tenant + "-carol"
		wantAnswer(t, "carol with alice's request", e.send(bobAsAlice), idemfront.Executed, []byte("for alice's order"))
		e.wantRuns(3, "three tenants")
	})
	t.Run("Invalid", func(t *testing.T) {
		// Not UTF-8, or holding a control character (C0, DEL, C1): such a
		// tenant comes from a bug of the server's tenant rule. Refused
		// before the store sees it, as the server's error: never as a
		// store outage, which a caller would retry for ever.
		t.Parallel()
		e := s.newEnv(t, Options{}, ok("ran"))
		for _, bad := range []string{"\xff\xfe", "acme\x00", "\x1fidem", "acme\n", "csi\u009b"} {
			c := e.call("k", "a")
			c.Tenant = e.tenant + bad
			r := e.send(c)
			if r.Kind != idemfront.InvalidTenant && r.Kind != idemfront.Internal {
				t.Errorf("tenant %q: answered %s, want invalid_tenant (or the front end's internal error)", strings.ToValidUTF8(bad, "?"), r.Kind)
			}
		}
		e.wantRuns(0, "every tenant was unusable")
	})
}

// keys: a malformed key is refused, and nothing runs.
func (s *suite) keys(t *testing.T) {
	t.Run("Invalid", func(t *testing.T) {
		t.Parallel()
		e := s.newEnv(t, Options{}, ok("ran"))
		for _, bad := range []string{"has space", strings.Repeat("k", 256)} {
			wantKind(t, "key "+clip([]byte(bad)), e.send(e.call(bad, "a")), idemfront.InvalidKey)
		}
		e.wantRuns(0, "every key was malformed")
	})
	t.Run("Longest", func(t *testing.T) {
		t.Parallel()
		e := s.newEnv(t, Options{}, ok("ran"))
		key := strings.Repeat("k", 255)
		wantAnswer(t, "a 255-character key", e.send(e.call(key, "a")), idemfront.Executed, []byte("ran"))
		wantAnswer(t, "its retry", e.send(e.call(key, "a")), idemfront.Replayed, []byte("ran"))
	})
}
