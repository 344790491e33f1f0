package idempg

import "time"

// SetListenLinger sets how long s's listening connection outlives its
// last subscription; call it before the first Watch.
func SetListenLinger(s *Store, d time.Duration) { s.listen.linger = d }

// ListenSessions returns how many listening sessions s has started.
func ListenSessions(s *Store) int64 { return s.listen.sessions.Load() }

// SetStatsSampling makes KeyStats of every tenant sample tables the
// planner estimates above exact records, reading about sample of them,
// until the returned func restores the defaults.
func SetStatsSampling(exact, sample float64) func() {
	e, s := exactStatsRows, sampleRows
	exactStatsRows, sampleRows = exact, sample
	return func() { exactStatsRows, sampleRows = e, s }
}
