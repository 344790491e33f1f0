package idempg

import "time"

// SetListenLinger sets how long s's listening connection outlives its
// last subscription; call it before the first Watch.
func SetListenLinger(s *Store, d time.Duration) { s.listen.linger = d }

// ListenSessions returns how many listening sessions s has started.
func ListenSessions(s *Store) int64 { return s.listen.sessions.Load() }
