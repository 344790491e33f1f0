package frontends

import (
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/gofiber/fiber/v3"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemecho"
	"github.com/idem-go/idem/idemfiber"
	"github.com/idem-go/idem/idemgin"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemprom"
	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
)

// Every framework adapter reports its requests to the engine's request
// tracer under the HTTP method and its router's route pattern (never a
// raw path), so that idemprom counts an execution and its replay.
func TestObserversCountEveryFramework(t *testing.T) {
	gin.SetMode(gin.TestMode)
	tenant := "acme"
	for _, fe := range []struct {
		name  string
		serve func(t *testing.T, engine *idem.Engine) string // the base URL of POST /orders/:cart
	}{
		{"gin", func(t *testing.T, engine *idem.Engine) string {
			mw := must(idemgin.New(engine, &idemgin.Config{TenantFunc: func(*gin.Context) (string, error) { return tenant, nil }}))
			r := gin.New()
			r.POST("/orders/:cart", mw, func(c *gin.Context) { c.String(http.StatusCreated, "ok") })
			srv := httptest.NewServer(r)
			t.Cleanup(srv.Close)
			return srv.URL
		}},
		{"echo", func(t *testing.T, engine *idem.Engine) string {
			e := echo.New()
			e.POST("/orders/:cart", func(c echo.Context) error { return c.String(http.StatusCreated, "ok") },
				idemecho.IdempotencyWithConfig(idemecho.IdempotencyConfig{Engine: engine, TenantFunc: func(echo.Context) (string, error) { return tenant, nil }}))
			srv := httptest.NewServer(e)
			t.Cleanup(srv.Close)
			return srv.URL
		}},
		{"fiber", func(t *testing.T, engine *idem.Engine) string {
			mw := must(idemfiber.New(engine, &idemfiber.Config{TenantFunc: func(fiber.Ctx) (string, error) { return tenant, nil }}))
			app := fiber.New()
			app.Post("/orders/:cart", mw, func(c fiber.Ctx) error { return c.Status(http.StatusCreated).SendString("ok") })
			ln := must(net.Listen("tcp", "127.0.0.1:0"))
			done := make(chan error, 1)
			go func() { done <- app.Listener(ln, fiber.ListenConfig{DisableStartupMessage: true}) }()
			t.Cleanup(func() { _ = app.ShutdownWithTimeout(5 * time.Second); _ = ln.Close(); <-done }) // bounded: Shutdown waits for idle kept-alive connections
			return "http://" + ln.Addr().String()
		}},
	} {
		t.Run(fe.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			metrics := must(idemprom.NewCollector(&idemprom.Config{Registerer: reg}))
			engine := must(idem.NewEngine(idemmem.NewStore(nil), &idem.Config{Tracer: metrics}))
			t.Cleanup(func() { _ = engine.Close(t.Context()) })
			base := fe.serve(t, engine)
			for range 2 {
				req := must(http.NewRequestWithContext(t.Context(), http.MethodPost, base+"/orders/c1", strings.NewReader("tea")))
				req.Header.Set(idemhttp.HeaderKey, "k1")
				resp := must(http.DefaultClient.Do(req))
				resp.Body.Close()
			}
			got := map[string]float64{}
			for _, mf := range must(reg.Gather()) {
				if mf.GetName() != "idem_requests_total" {
					continue
				}
				for _, m := range mf.GetMetric() {
					if v := m.GetCounter().GetValue(); v != 0 {
						labels := ""
						for _, l := range m.GetLabel() {
							labels += l.GetName() + "=" + l.GetValue() + " "
						}
						got[labels] = v
					}
				}
			}
			want := map[string]float64{
				"method=POST outcome=executed route=/orders/:cart ": 1,
				"method=POST outcome=replayed route=/orders/:cart ": 1,
			}
			if len(got) != len(want) || got[`method=POST outcome=executed route=/orders/:cart `] != 1 || got[`method=POST outcome=replayed route=/orders/:cart `] != 1 {
				t.Fatalf("idem_requests_total: %v, want %v", got, want)
			}
		})
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
