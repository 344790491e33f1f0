package idempg

import (
	"context"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemcodec"
)

// saveStepSQL appends one step to the record's recovery points, fenced by
// the lease token and the in-flight state. idem's encoding of a list of
// steps is the concatenation of the encodings of its steps, so appending
// is a plain ||, without reading the column first. The update touches an
// unindexed column only: a HOT update.
const saveStepSQL = `UPDATE idem_keys SET steps = COALESCE(steps, ''::bytea) || $4::bytea
WHERE tenant_id = $1 AND idem_key = $2 AND lease_token = $3 AND state = 'in_flight'`

// SaveStep implements idem.StepStore: it records one step of the execution
// holding (Tenant, Key) under Token, and returns once it is committed
// (synchronously: unlike the claim, a recovery point is never lost in a
// crash of the database, nor is any claim committed before it). It runs on
// the pool, as a statement of its own, never in the handler's transaction:
// a rollback of the handler's writes keeps the step recorded, since its
// effect, made elsewhere, stands. It returns idem.ErrLeaseLost when the
// record is no longer in flight under Token.
//
// A name saved twice by one execution (two Steps of one name run at once)
// is stored twice, and only its first value is ever read back
// (idemcodec.UnmarshalSteps keeps the first): checking first would cost a read,
// or a lock, on every step, for a mistake of the handler's. Executions
// that take a key over never save a name again, since idem.Step returns
// the recorded value instead of running the step.
func (s *Store) SaveStep(ctx context.Context, p idem.SaveStepParams) error {
	if err := checkIdentity(p.Tenant, p.Key); err != nil {
		return err
	}
	tag, err := s.pool.Exec(ctx, saveStepSQL, p.Tenant, p.Key, p.Token, idemcodec.AppendStep(nil, p.Name, p.Value))
	if err != nil {
		return interpretError(err)
	}
	if tag.RowsAffected() == 0 {
		return idem.ErrLeaseLost
	}
	return nil
}

// decodeSteps decodes the steps column; NULL and empty are no steps.
func decodeSteps(b []byte) ([]idem.RecordedStep, error) {
	if len(b) == 0 {
		return nil, nil
	}
	return idemcodec.UnmarshalSteps(b)
}
