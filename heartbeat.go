package idem

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"
)

// heartbeat extends the lease of a running handler every Config.Heartbeat
// on a timer (no goroutine while idle). When the store says the lease is
// lost, it cancels the handler's context: the completion would be refused
// anyway, so the handler may as well stop.
type heartbeat struct {
	store    Store
	params   ExtendParams
	interval time.Duration
	logger   *slog.Logger
	cancel   context.CancelCauseFunc

	mu        sync.Mutex
	timer     *time.Timer
	stopped   bool
	leaseLost bool
}

func (e *Engine) startHeartbeat(op Operation, token int64, cancel context.CancelCauseFunc) *heartbeat {
	h := &heartbeat{
		store:    e.store,
		params:   ExtendParams{Tenant: op.Tenant, Key: op.Key, Token: token, Lease: e.config.Lease},
		interval: e.config.Heartbeat,
		logger:   e.config.Logger,
		cancel:   cancel,
	}
	h.mu.Lock()
	h.timer = time.AfterFunc(h.interval, h.beat)
	h.mu.Unlock()
	return h
}

func (h *heartbeat) beat() {
	ctx, cancel := context.WithTimeout(context.Background(), h.interval)
	err := h.store.Extend(ctx, h.params)
	cancel()

	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stopped {
		return
	}
	if errors.Is(err, ErrLeaseLost) {
		h.leaseLost = true
		h.cancel(ErrLeaseLost)
		return
	}
	if err != nil {
		// A store hiccup: the lease still runs for a while, try again at
		// the next beat.
		h.logger.Warn("idem: lease heartbeat failed", slog.String("key", h.params.Key), slog.Any("error", err))
	}
	h.timer.Reset(h.interval)
}

func (h *heartbeat) stop() {
	h.mu.Lock()
	h.stopped = true
	h.timer.Stop()
	h.mu.Unlock()
}

func (h *heartbeat) lost() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.leaseLost
}
