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
		problemInFlight, problemLeaseLost, problemStoreUnavailable, problemHandlerPanic,
		problemRequestCancelled, problemResponseTooLarge, problemInternal, problemReplayFailed,
	}
	seen := map[string]bool{}
	for _, p := range all {
		if seen[p.slug] {
			t.Errorf("slug %q used twice", p.slug)
		}
		seen[p.slug] = true
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
	if n := strings.Count(text, "\n## "); n != len(all) {
		t.Errorf("docs/PROBLEMS.md has %d sections for %d problems", n, len(all))
	}
}
