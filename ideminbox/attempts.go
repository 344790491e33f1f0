package ideminbox

import (
	"container/list"
	"sync"
)

// localAttempts counts the failed deliveries of messages whose broker does
// not number deliveries (a RabbitMQ classic queue only says "redelivered").
// The count lives in this process only: it is lost on restart and not
// shared between competing instances. That is enough to end redelivery
// loops (a poison message takes at most MaxAttempts deliveries per
// instance), which is all it is for; brokers that count deliveries
// (JetStream, RabbitMQ quorum queues) make it unnecessary.
type localAttempts struct {
	mu    sync.Mutex
	limit int
	order *list.List // of string keys, oldest failure first
	count map[string]*list.Element
}

type localEntry struct {
	key      string
	failures int
}

func newLocalAttempts(limit int) *localAttempts {
	return &localAttempts{limit: limit, order: list.New(), count: make(map[string]*list.Element)}
}

func (l *localAttempts) failures(key string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e, ok := l.count[key]; ok {
		return e.Value.(*localEntry).failures
	}
	return 0
}

func (l *localAttempts) fail(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e, ok := l.count[key]; ok {
		e.Value.(*localEntry).failures++
		l.order.MoveToBack(e)
		return
	}
	for l.order.Len() >= l.limit {
		oldest := l.order.Front()
		l.order.Remove(oldest)
		delete(l.count, oldest.Value.(*localEntry).key)
	}
	l.count[key] = l.order.PushBack(&localEntry{key: key, failures: 1})
}

func (l *localAttempts) forget(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e, ok := l.count[key]; ok {
		l.order.Remove(e)
		delete(l.count, key)
	}
}
