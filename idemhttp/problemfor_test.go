package idemhttp_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/idem-go/idem/idemfront"
	"github.com/idem-go/idem/idemhttp"
)

// ProblemFor answers every kind, on both kinds of store, with a problem
// whose body names its own status, and the texts that say what became of
// the work follow the store.
func TestProblemForEveryKind(t *testing.T) {
	for _, transactional := range []bool{false, true} {
		for _, k := range idemfront.Kinds() {
			status, body := idemhttp.ProblemFor(idemfront.Answer{Kind: k, Ran: true}, transactional)
			var p struct {
				Type   string
				Status int
				Detail string
			}
			if err := json.Unmarshal(body, &p); err != nil || p.Status != status || status < 400 || !strings.HasPrefix(p.Type, idemhttp.ProblemTypeBase) {
				t.Errorf("%s (transactional %v): %d %s", k, transactional, status, body)
			}
		}
		_, body := idemhttp.ProblemFor(idemfront.Answer{Kind: idemfront.Panicked, Ran: true}, transactional)
		if got := strings.Contains(string(body), "rolled back"); got != transactional {
			t.Errorf("the panic problem on a store transactional=%v says rolled back: %v", transactional, got)
		}
	}
	if status, _ := idemhttp.ProblemFor(idemfront.Answer{Kind: idemfront.InvalidKey}, true); status != 400 {
		t.Errorf("invalid key: %d, want 400", status)
	}
}
