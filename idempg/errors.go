package idempg

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/idem-go/idem"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// SQLStateLeaseLost is the SQLSTATE that the idem_complete function
// (migration 0002) raises when no in-flight record holds the caller's lease
// token. It is outside every class PostgreSQL defines, so it cannot be
// confused with a server error.
const SQLStateLeaseLost = "IDL01"

// interpretError translates driver errors into idem's at the seam, so that
// callers test with errors.Is and never look at pgx types. The original
// error stays in the chain.
func interpretError(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return idem.ErrNotFound
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == SQLStateLeaseLost {
		return idem.ErrLeaseLost
	}
	return err
}

// checkIdentity refuses, before any statement, a tenant or key that
// PostgreSQL would refuse (text holds valid UTF-8 without NUL bytes; the
// key's CHECK wants 1 to 255 characters). Batched claims share one
// statement, so one such claim would otherwise fail every claim batched
// with it.
//
// Its errors never quote the tenant or the key: a tracer exports error
// texts (idemotel records them even with RecordTenant off), and a tenant
// names a customer.
func checkIdentity(tenant, key string) error {
	for _, f := range [...]struct{ name, value string }{{"tenant", tenant}, {"key", key}} {
		if !utf8.ValidString(f.value) || strings.IndexByte(f.value, 0) >= 0 {
			return fmt.Errorf("idempg: the %s is not valid UTF-8 text without NUL bytes, which PostgreSQL's text cannot hold (%d bytes; its value is not shown)", f.name, len(f.value))
		}
	}
	if n := utf8.RuneCountInString(key); n < 1 || n > 255 {
		return fmt.Errorf("%w: %d characters; idem_keys holds 1 to 255", idem.ErrInvalidKey, n)
	}
	return nil
}

// claimError interprets the error of a claim statement, marked
// idem.ErrNotApplied unless the claim may nevertheless run, and commit,
// on the server: when it was sent (pgconn cannot say it was not) and the
// server did not answer it with an error of its own (which aborts the
// statement). That is a statement cancelled, or whose connection was
// lost, in flight; the engine then releases the key, fenced by the token.
func claimError(err error) error {
	var pgErr *pgconn.PgError
	mayHaveRun := !pgconn.SafeToRetry(err) && !errors.As(err, &pgErr) && !errors.Is(err, idem.ErrNotApplied)
	err = interpretError(err)
	if !mayHaveRun {
		err = idem.NotApplied(err)
	}
	return err
}
