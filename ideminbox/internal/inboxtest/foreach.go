package inboxtest

import "testing"

// Transactional lists the constructors of the backends whose effects
// commit with the dedup record.
func transactional() []func(testing.TB) *Backend {
	return []func(testing.TB) *Backend{SQLite, Postgres}
}

// ForEach runs fn as a subtest on every transactional backend. A backend
// whose server is unavailable is skipped (failed under CI=true).
func ForEach(t *testing.T, fn func(t *testing.T, b *Backend)) {
	for i, open := range transactional() {
		name := [...]string{"sqlite", "postgres"}[i]
		t.Run(name, func(t *testing.T) {
			fn(t, open(t))
		})
	}
}
