package deps

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A program that imports one framework adapter gets that framework and
// what it needs, and nothing of the other frameworks or of the
// databases the adapters' suites run on.
func TestFrameworkAdapterGetsItsFrameworkOnly(t *testing.T) {
	for _, a := range []struct{ module, framework string }{
		{"idemgin", "github.com/gin-gonic/gin"},
		{"idemecho", "github.com/labstack/echo/v4"},
		{"idemfiber", "github.com/gofiber/fiber/v3"},
	} {
		t.Run(a.module, func(t *testing.T) {
			dir := program(t, []string{"github.com/idem-go/idem/" + a.module}, []string{".", a.module})
			gocmd(t, dir, nil, "mod", "tidy")
			sum, err := os.ReadFile(filepath.Join(dir, "go.sum"))
			if err != nil {
				t.Fatal(err)
			}
			bin := filepath.Join(t.TempDir(), "user")
			gocmd(t, dir, nil, "build", "-o", bin, ".")
			linked := gocmd(t, dir, nil, "version", "-m", bin)
			if !strings.Contains(linked, a.framework) {
				t.Errorf("the binary does not link %s:\n%s", a.framework, linked)
			}
			for _, forbidden := range []string{"gin-gonic", "labstack", "gofiber", "modernc.org", "jackc/pgx", "go-redis", "prometheus", "opentelemetry", "google.golang.org/grpc"} {
				if strings.Contains(a.framework, forbidden) {
					continue
				}
				if strings.Contains(linked, forbidden) {
					t.Errorf("the binary links %s", forbidden)
				}
				if strings.Contains(string(sum), forbidden) {
					t.Errorf("go.sum mentions %s", forbidden)
				}
			}
		})
	}
}
