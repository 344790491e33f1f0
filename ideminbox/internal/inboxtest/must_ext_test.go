package inboxtest_test

// must returns v, and panics on err: for constructors that fail only on a
// programming error (a nil handle, a negative setting), in tests.
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
