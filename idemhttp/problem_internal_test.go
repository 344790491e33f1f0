package idemhttp

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
)

// TestProblemsDocumented checks that every problem the middleware can
// answer has its section in docs/PROBLEMS.md, with the same status, since
// the type URIs point there.
func TestProblemsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../docs/PROBLEMS.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(doc)
	all := []*problem{
		problemKeyRequired, problemInvalidKey, problemUnauthenticated,
		problemRequestTooLarge, problemRequestUnreadable, problemFingerprintMismatch,
		problemInFlight, problemInternal, problemReplayFailed,
	}
	// The texts that depend on the store: one slug each, in every variant.
	for _, set := range []problems{problemsTransactional, problemsNotTransactional} {
		all = append(all, set.storeUnavailable, set.storeUnavailableRan, set.requestCancelled,
			set.requestCancelledRan, set.leaseLost, set.handlerPanic, set.responseTooLarge)
	}
	seen := map[string]int{}   // slug → status
	texts := map[string]bool{} // slug and detail
	for _, p := range all {
		if p == nil {
			t.Fatal("a problem variant is missing")
		}
		if texts[p.slug+p.detail] {
			continue // shared by both variants
		}
		texts[p.slug+p.detail] = true
		if status, ok := seen[p.slug]; ok {
			if status != p.status {
				t.Errorf("slug %q answered with %d and %d", p.slug, status, p.status)
			}
			continue
		}
		seen[p.slug] = p.status
		_, section, ok := strings.Cut(text, "\n## "+p.slug+"\n")
		if !ok {
			t.Errorf("docs/PROBLEMS.md has no section %q", p.slug)
			continue
		}
		if !strings.HasPrefix(strings.TrimSpace(section), fmt.Sprintf("**%d", p.status)) {
			t.Errorf("section %q does not start with its status %d", p.slug, p.status)
		}
		if !strings.Contains(text, fmt.Sprintf("| [%s](#%s) | %d |", p.slug, p.slug, p.status)) {
			t.Errorf("the table of docs/PROBLEMS.md lacks %q with status %d", p.slug, p.status)
		}
		var body struct {
			Type   string
			Status int
		}
		if err := json.Unmarshal(p.body, &body); err != nil || body.Type != ProblemTypeBase+p.slug || body.Status != p.status {
			t.Errorf("body of %q: %s (%v)", p.slug, p.body, err)
		}
	}
	// The body stored in place of an error body too large keeps the
	// original status.
	if _, section, ok := strings.Cut(text, "\n## "+slugErrorBodyNotStored+"\n"); !ok || !strings.HasPrefix(strings.TrimSpace(section), "**The original status") {
		t.Errorf("docs/PROBLEMS.md has no section %q starting with the original status", slugErrorBodyNotStored)
	}
	if !strings.Contains(text, fmt.Sprintf("| [%s](#%s) | the original's |", slugErrorBodyNotStored, slugErrorBodyNotStored)) {
		t.Errorf("the table of docs/PROBLEMS.md lacks %q", slugErrorBodyNotStored)
	}
	var body struct {
		Type   string
		Status int
	}
	if err := json.Unmarshal(errorBodyNotStored(409, 10000), &body); err != nil || body.Type != ProblemTypeBase+slugErrorBodyNotStored || body.Status != 409 {
		t.Errorf("body of %q: %+v (%v)", slugErrorBodyNotStored, body, err)
	}
	if n := strings.Count(text, "\n## "); n != len(seen)+1 {
		t.Errorf("docs/PROBLEMS.md has %d sections for %d problems", n, len(seen)+1)
	}
}
