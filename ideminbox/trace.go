package ideminbox

import (
	"context"

	"github.com/idem-go/idem"
)

// processTraced is Process under the engine's MessageTracer.
func (in *Inbox) processTraced(ctx context.Context, msg Message, handler HandlerFunc) (Decision, error) {
	ctx = in.tracer.TraceMessageStart(ctx, idem.TraceMessageStartData{Consumer: in.config.Consumer, Subject: msg.Subject, Attempt: msg.Attempt})
	d, err := in.process(ctx, msg, handler)
	in.tracer.TraceMessageEnd(ctx, idem.TraceMessageEndData{Consumer: in.config.Consumer, Action: d.Action.String(), Err: err})
	return d, err
}
