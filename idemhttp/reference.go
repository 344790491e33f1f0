package idemhttp

import "context"

// SetReference names the resource the handler created, for
// idem.ModeReference: the reference is stored instead of the response
// body, and ReplayFunc receives it. ctx is the request's context. Outside
// a protected request it does nothing.
func SetReference(ctx context.Context, ref string) {
	if rec, ok := ctx.Value(referenceKey{}).(*recorder); ok {
		rec.ref = ref
		rec.refSet = true
	}
}

type referenceKey struct{}
