package ideminbox

import (
	"context"
	"errors"

	"github.com/idem-go/idem"
)

// State is where a message stands for one consumer.
type State uint8

const (
	// StateAbsent: no record, never processed (or purged after retention).
	StateAbsent State = iota
	// StateInFlight: an instance is processing it now, or crashed doing so
	// and its lease has not ended yet.
	StateInFlight
	// StateProcessed: the handler ran and its effects committed.
	StateProcessed
	// StatePoison: the message failed on its last allowed attempt and was
	// recorded as poison.
	StatePoison
)

// String returns the state's name, for logs.
func (s State) String() string {
	switch s {
	case StateAbsent:
		return "absent"
	case StateInFlight:
		return "in_flight"
	case StateProcessed:
		return "processed"
	case StatePoison:
		return "poison"
	}
	return "unknown"
}

// Status describes the record of one message.
type Status struct {
	State State
	// Error is the last error of a poison message.
	Error string
	// Attempt is the delivery on which a poison message was given up.
	Attempt int
	// Subject is where a poison message came from.
	Subject string
	// Data is the payload of a poison message, or its first
	// Config.MaxPoisonData bytes.
	Data []byte
	// DataSize is the length of the whole payload of a poison message:
	// more than len(Data) when Data was cut.
	DataSize int
}

// Status reads the record of the message id, as stored: a record past
// retention that no purge has deleted yet is still reported.
func (in *Inbox) Status(ctx context.Context, id string) (Status, error) {
	rec, err := in.store.Get(ctx, in.tenant, Key(id))
	if errors.Is(err, idem.ErrNotFound) {
		return Status{State: StateAbsent}, nil
	}
	if err != nil {
		return Status{}, err
	}
	if rec.State == idem.StateInFlight {
		return Status{State: StateInFlight}, nil
	}
	p, data, ok := decodePoison(rec.Result)
	if !ok {
		return Status{State: StateProcessed}, nil
	}
	return Status{State: StatePoison, Error: p.Error, Attempt: p.Attempt, Subject: p.Subject, Data: data, DataSize: p.DataSize}, nil
}
