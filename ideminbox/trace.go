package ideminbox

import "context"

// MessageTracer observes the messages an Inbox processes: one call when
// Process starts, one when it returns. Set it in Config.Tracer; idemprom's
// Collector and idemotel's Tracer implement it, as well as the engine's
// idem.Tracer: a value that implements both is set in both places,
// idem.Config.Tracer for the engine's operations and Config.Tracer here
// for the messages, and each of its hooks is called once.
//
// Calls come from many goroutines at once: a MessageTracer must be safe
// for concurrent use, and fast.
type MessageTracer interface {
	// TraceMessageStart is called when Inbox.Process starts. The context
	// it returns is the one the engine and the handler run under: it must
	// be ctx or a context derived from it.
	TraceMessageStart(ctx context.Context, data TraceMessageStartData) context.Context
	// TraceMessageEnd is called when Process returns, with the context
	// TraceMessageStart returned.
	TraceMessageEnd(ctx context.Context, data TraceMessageEndData)
}

// TraceMessageStartData describes a message that arrives.
type TraceMessageStartData struct {
	// Consumer is Config.Consumer.
	Consumer string
	// Subject is where the message came from (subject, queue).
	Subject string
	// Attempt is the broker's delivery number, 0 when it keeps none.
	Attempt int
}

// TraceMessageEndData describes a message that was processed.
type TraceMessageEndData struct {
	// Consumer is Config.Consumer.
	Consumer string
	// Action is what the broker is to be told (see Actions for every value).
	Action Action
	// Err is the error Process returned with the decision.
	Err error
}

// MultiTracer returns a MessageTracer that calls each of tracers in turn;
// the contexts of the Start calls are chained, each tracer starting from
// the previous one's. Nil tracers are skipped; with none left it returns
// nil.
func MultiTracer(tracers ...MessageTracer) MessageTracer {
	var m multiTracer
	for _, t := range tracers {
		if t != nil {
			m = append(m, t)
		}
	}
	switch len(m) {
	case 0:
		return nil
	case 1:
		return m[0]
	}
	return m
}

type multiTracer []MessageTracer

func (m multiTracer) TraceMessageStart(ctx context.Context, data TraceMessageStartData) context.Context {
	for _, t := range m {
		ctx = t.TraceMessageStart(ctx, data)
	}
	return ctx
}

func (m multiTracer) TraceMessageEnd(ctx context.Context, data TraceMessageEndData) {
	for _, t := range m {
		t.TraceMessageEnd(ctx, data)
	}
}

// processTraced is Process under Config.Tracer.
func (in *Inbox) processTraced(ctx context.Context, msg Message, handler HandlerFunc) (Decision, error) {
	ctx = in.config.Tracer.TraceMessageStart(ctx, TraceMessageStartData{Consumer: in.config.Consumer, Subject: msg.Subject, Attempt: msg.Attempt})
	d, err := in.process(ctx, msg, handler)
	in.config.Tracer.TraceMessageEnd(ctx, TraceMessageEndData{Consumer: in.config.Consumer, Action: d.Action, Err: err})
	return d, err
}
