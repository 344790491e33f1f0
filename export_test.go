package idem

import "time"

// WaitPollers returns how many pollers e has started for waiting
// duplicates.
func WaitPollers(e *Engine) int64 { return e.waits.pollers.Load() }

// WaitWaiters returns how many duplicates wait on (tenant, key) in e.
func WaitWaiters(e *Engine, tenant, key string) int {
	e.waits.mu.Lock()
	defer e.waits.mu.Unlock()
	if kw := e.waits.keys[waitKey{tenant, key}]; kw != nil {
		return kw.waiters
	}
	return 0
}

// SetWaitPoll sets the pauses of e's pollers, before e serves anything.
func SetWaitPoll(e *Engine, first, most time.Duration) {
	e.waits.first, e.waits.most = first, most
}
