// Package tracers finds the optional interfaces of the packages outside
// the root (idemfront's request tracer, idemjanitor's purge tracer) on an
// engine's tracer, including inside idem.MultiTracer, which implements
// only the root's interfaces and lists its tracers with Unwrap.
package tracers

import "github.com/idem-go/idem"

// Find returns the tracers of t that implement T: t itself, or those
// idem.MultiTracer combined, in order. Nil when none does.
func Find[T any](t idem.Tracer) []T {
	if x, ok := t.(T); ok {
		return []T{x}
	}
	u, ok := t.(interface{ Unwrap() []idem.Tracer })
	if !ok {
		return nil
	}
	var out []T
	for _, t := range u.Unwrap() {
		out = append(out, Find[T](t)...)
	}
	return out
}
