package testenv

// Must returns v, and panics on err: for constructors that fail only on a
// programming error (a nil handle, a negative setting), in tests. One
// helper for every package's tests, instead of a copy in each.
func Must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
