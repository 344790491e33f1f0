package idemredis

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemcodec"
)

// SaveStep implements idem.StepStore: it records one step of the
// execution holding (Tenant, Key) under Token in the record's steps
// field, in one Lua script fenced by the token and the in-flight state,
// and returns once Redis has applied it (with the durability of the
// server's persistence settings: see the package documentation). It
// returns idem.ErrLeaseLost when the record is no longer in flight under
// Token.
//
// A name already recorded keeps its first value: the script looks for it
// before it appends, so a resend of the command, or a second save of the
// name, changes nothing.
//
// A server at its memory limit refuses the step (an OOM error) before
// anything is written, whatever its version: the handler then fails with
// idem.ErrStepNotSaved. The record keeps the steps saved before, and the
// release that follows keeps the record for the next claim to take over
// with them.
func (s *Store) SaveStep(ctx context.Context, p idem.SaveStepParams) error {
	if p.Name == "" {
		return errors.New("idemredis: save step: the step has no name")
	}
	ok, err := s.run(ctx, saveStepScript, s.key(p.Tenant, p.Key),
		strconv.FormatInt(p.Token, 10), p.Name, idemcodec.AppendStep(nil, p.Name, p.Value)).Int()
	if err != nil {
		return fmt.Errorf("idemredis: save step: %w", err)
	}
	if ok != 1 {
		return idem.ErrLeaseLost
	}
	return nil
}

// decodeSteps decodes a record's steps field; absent or empty is none.
func decodeSteps(b string) ([]idem.RecordedStep, error) {
	if b == "" {
		return nil, nil
	}
	steps, err := idemcodec.UnmarshalSteps([]byte(b))
	if err != nil {
		return nil, fmt.Errorf("idemredis: stored steps: %w", err)
	}
	return steps, nil
}

// wonClaim reads the reply of a claim that was won: {1} afresh, or
// {1, 1, steps} by a takeover. Steps that do not decode fail the claim
// (the engine then releases it, and the record stays for the next
// claim): the damage is reported rather than the steps run again.
func wonClaim(reply []any) (idem.ClaimResult, error) {
	if len(reply) == 1 {
		return idem.ClaimResult{Won: true}, nil
	}
	if len(reply) != 3 {
		return idem.ClaimResult{}, fmt.Errorf("idemredis: claim: unexpected reply %v", reply)
	}
	steps, ok := reply[2].(string)
	if !ok {
		return idem.ClaimResult{}, fmt.Errorf("idemredis: claim: unexpected steps %T", reply[2])
	}
	decoded, err := decodeSteps(steps)
	if err != nil {
		return idem.ClaimResult{}, fmt.Errorf("idemredis: claim: %w", err)
	}
	return idem.ClaimResult{Won: true, Takeover: true, Steps: decoded}, nil
}
