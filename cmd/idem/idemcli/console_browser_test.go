package idemcli

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/idem-go/idem"
	. "github.com/idem-go/idem/cmd/idem/internal/demo/demotest"
	"github.com/idem-go/idem/idemsql"
	"github.com/idem-go/idem/idemsql/idemsqlite"
)

// browser starts headless Chromium (Debian's chromium package), or skips
// the test without it (fails under CI=true, where .ci/run installs it).
func browser(t *testing.T) context.Context {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("chromium is not installed (apt-get install -y chromium)")
		}
		t.Skip("skipping: chromium is not installed (apt-get install -y chromium)")
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.Flag("headless", true),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.NoFirstRun,
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 900),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(actx)
	ctx, cancelTimeout := context.WithTimeout(ctx, 10*time.Minute)
	t.Cleanup(func() { cancelTimeout(); cancelCtx(); cancelAlloc() })
	// Any dialog (alert, confirm) is a script that ran: the pages have none.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	err = chromedp.Listen(ctx, func(ev any) {
		if d, ok := ev.(*page.EventJavascriptDialogOpening); ok {
			t.Errorf("a script opened a dialog: %q", d.Message)
			go chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{}) //nolint:errcheck // best effort
		}
	})
	if err != nil {
		t.Fatalf("listen to chromium: %v", err)
	}
	return ctx
}

// TestConsoleInBrowser drives the console in headless Chromium against
// `idem serve` on SQLite: log in, see a key a real request created, see a
// key left in flight by a kill -9 of its server, release it, and watch the
// retry run; a key and a stored body holding markup stay text. It saves a
// screenshot of each page in a temporary folder and prints its path.
func TestConsoleInBrowser(t *testing.T) {
	ctx := browser(t)
	dir := t.TempDir()
	dbPath := filepath.Join(dir, "idem.db")
	db := "sqlite:" + dbPath
	server := startServe(t, "idem serve", "--db", db)
	holder := startServe(t, "idem serve (holder)", "--db", db, "--handler-delay", "10m")
	base := startConsole(t, "--db", db)

	shots, err := os.MkdirTemp("", "idem-console-screenshots-")
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(os.Stderr, "idem console screenshots: %s\n", shots)
	t.Logf("screenshots in %s", shots)
	shot := func(name string) chromedp.Action[chromedp.Void] {
		return chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			buf, err := chromedp.FullScreenshot(100)(ctx, tg) // 100: PNG
			if err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(shots, name+".png"), buf, 0o644)
		})
	}
	run := func(what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		for i, a := range actions {
			// A step's own bound, so that a failure names the step.
			sctx, cancel := context.WithTimeout(ctx, time.Minute)
			err := chromedp.Do(sctx, a)
			cancel()
			if err != nil {
				loc, _ := chromedp.Run(ctx, chromedp.Location())
				text, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body ? document.body.innerText : ""`))
				t.Fatalf("%s, step %d (at %s): %v; the page says: %q", what, i+1, loc, err, text)
			}
		}
	}
	// into runs a into *dst, as a step.
	into := func(dst *string, a chromedp.Action[string]) chromedp.Action[chromedp.Void] {
		return chromedp.Func(func(ctx context.Context, tg *chromedp.Target) (err error) {
			*dst, err = a(ctx, tg)
			return err
		})
	}
	count := func(dst *int, expr string) chromedp.Action[chromedp.Void] {
		return chromedp.Func(func(ctx context.Context, tg *chromedp.Target) (err error) {
			*dst, err = chromedp.Evaluate[int](expr)(ctx, tg)
			return err
		})
	}

	// A key created by a real request, and one whose name is markup.
	made := "browser-made-1"
	if a := Do(t, Req{Method: "POST", URL: server.url + "/orders", Body: GoodOrder, Key: made}); a.Status != http.StatusCreated {
		t.Fatalf("POST /orders: %s", a)
	}
	xssKey := `<script>alert("key")</script>`
	if a := Do(t, Req{Method: "POST", URL: server.url + "/orders", Body: GoodOrder, Key: xssKey}); a.Status != http.StatusCreated {
		t.Fatalf("POST /orders with a markup key: %s", a)
	}
	// A stored body holding markup, as a handler could have stored it.
	xssBody := `<script>alert("body")</script><img src=x onerror=alert("img")>`
	sdb, err := idemsqlite.Open(dbPath)
	if err != nil {
		t.Fatal(err)
	}
	defer sdb.Close()
	st, err := idemsql.NewStore(sdb, idemsql.SQLite)
	if err != nil {
		t.Fatal(err)
	}
	bg := context.Background()
	if _, err := st.Claim(bg, idem.ClaimParams{Tenant: defaultTenant, Key: "browser-body", Token: 7, Lease: time.Minute, Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	unit, err := st.Begin(bg)
	if err != nil {
		t.Fatal(err)
	}
	if err := unit.Complete(bg, idem.CompleteParams{Tenant: defaultTenant, Key: "browser-body", Token: 7,
		Result: idem.Result{Status: 200, Header: map[string][]string{"Content-Type": {"text/html"}}, Body: []byte(xssBody)}}); err != nil {
		t.Fatal(err)
	}

	// A key a path would lose: "..", under the empty tenant (a shared
	// key space's), which a browser and the mux clean away as path
	// segments.
	if _, err := st.Claim(bg, idem.ClaimParams{Tenant: "", Key: "..", Token: 8, Lease: time.Minute, Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if unit, err = st.Begin(bg); err != nil {
		t.Fatal(err)
	}
	if err := unit.Complete(bg, idem.CompleteParams{Tenant: "", Key: "..", Token: 8, Result: idem.Result{Status: 202}}); err != nil {
		t.Fatal(err)
	}

	// A key left in flight by a server killed -9 under its handler.
	stuck := "browser-stuck-1"
	go Send(http.DefaultClient, Req{Method: "POST", URL: holder.url + "/orders", Body: GoodOrder, Key: stuck})
	waitListed(t, base, "in_flight", stuck)
	if err := holder.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-holder.exited

	// The login form, reached from any page.
	var title string
	run("log in",
		chromedp.Navigate(base+"/"),
		chromedp.WaitVisible(chromedp.ID("token")),
		shot("01-login"),
		chromedp.SendKeys(chromedp.ID("name"), "alice"),
		chromedp.SendKeys(chromedp.ID("token"), consoleToken),
		chromedp.Click(chromedp.ID("login")),
		chromedp.WaitVisible(chromedp.ID("tenants")),
		into(&title, chromedp.Title()),
	)
	if !strings.Contains(title, "Overview") {
		t.Fatalf("after the login the title is %q, want the overview", title)
	}
	var inFlight, oldest string
	run("overview",
		into(&inFlight, chromedp.Text(chromedp.ID("in-flight"))),
		into(&oldest, chromedp.Text(chromedp.ID("oldest"))),
		shot("02-overview"),
	)
	if inFlight != "1" || !strings.Contains(oldest, stuck) {
		t.Errorf("overview: %q in flight, oldest %q; want 1 and %s", inFlight, oldest, stuck)
	}

	var list string
	run("keys", chromedp.Navigate(base+"/keys"), chromedp.WaitVisible(chromedp.ID("keys")),
		into(&list, chromedp.Text(chromedp.ID("keys"))), shot("03-keys"))
	for _, k := range []string{made, stuck, xssKey, "browser-body"} {
		if !strings.Contains(list, k) {
			t.Errorf("the keys page does not show %q:\n%s", k, list)
		}
	}

	// Markup in a key and in a body stays text: no script element, no
	// dialog, the text shown as it is.
	var scripts int
	var keyText, bodyText string
	run("markup key",
		chromedp.Navigate(base+keyPath(defaultTenant, xssKey)),
		chromedp.WaitVisible(chromedp.CSS(`table.facts`)),
		count(&scripts, `document.querySelectorAll("script, img").length`),
		into(&keyText, chromedp.Text(chromedp.CSS(`table.facts`))),
		shot("04-key-markup"),
	)
	if scripts != 0 || !strings.Contains(keyText, xssKey) {
		t.Errorf("key page of %q: %d script/img elements, text %q; want none and the key as text", xssKey, scripts, keyText)
	}
	run("body on request",
		chromedp.Navigate(base+keyPath(defaultTenant, "browser-body")),
		chromedp.WaitVisible(chromedp.ID("show-body")),
		shot("05-key-body-hidden"),
		chromedp.Click(chromedp.ID("show-body")),
		chromedp.WaitVisible(chromedp.ID("body")),
		into(&bodyText, chromedp.Text(chromedp.ID("body"))),
		count(&scripts, `document.querySelectorAll("script, img").length`),
		shot("06-key-body-shown"),
	)
	if scripts != 0 || bodyText != xssBody {
		t.Errorf("body shown as %q with %d script/img elements; want %q as text and none", bodyText, scripts, xssBody)
	}

	// The ".." key: the list links to its own page, in the browser.
	var dotsText string
	run("dot-dot key",
		chromedp.Navigate(base+"/keys?"+url.Values{"prefix": {".."}}.Encode()),
		chromedp.WaitVisible(chromedp.ID("keys")),
		chromedp.Click(chromedp.CSS(`#keys a`)),
		chromedp.WaitVisible(chromedp.CSS(`table.facts`)),
		into(&dotsText, chromedp.Text(chromedp.CSS(`table.facts`))),
	)
	if !strings.Contains(dotsText, `..`) || !strings.Contains(dotsText, "202") {
		t.Errorf("the \"..\" key's page shows %q; want the key and its 202", dotsText)
	}

	// The key left in flight: released through the confirmation.
	retry := Req{Method: "POST", URL: server.url + "/orders", Body: GoodOrder, Key: stuck}
	if a := Do(t, retry); a.Status != http.StatusConflict {
		t.Fatalf("retry of the stuck key before the release: %s, want 409", a)
	}
	var warning, done string
	run("release",
		chromedp.Navigate(base+"/keys?"+url.Values{"state": {"in_flight"}}.Encode()),
		chromedp.WaitVisible(chromedp.ID("keys")),
		shot("07-keys-in-flight"),
		chromedp.Navigate(base+keyPath(defaultTenant, stuck)),
		chromedp.WaitVisible(chromedp.ID("release")),
		shot("08-key-in-flight"),
		chromedp.Click(chromedp.ID("release")),
		chromedp.WaitVisible(chromedp.ID("reason")),
		into(&warning, chromedp.Text(chromedp.ID("warning"))),
		chromedp.SendKeys(chromedp.ID("reason"), "holder killed -9 in the browser test"),
		chromedp.Click(chromedp.ID("confirm")),
		shot("09-confirm-release"),
		chromedp.Click(chromedp.ID("do")),
		chromedp.WaitVisible(chromedp.ID("message")),
		into(&done, chromedp.Text(chromedp.ID("message"))),
		shot("10-released"),
	)
	if !strings.Contains(warning, "lease is live") {
		t.Errorf("the confirmation does not warn that the lease is live: %q", warning)
	}
	if !strings.HasPrefix(done, "released") {
		t.Fatalf("after the release the page says %q", done)
	}
	if a := Do(t, retry); a.Status != http.StatusCreated || a.Replayed() {
		t.Fatalf("retry after the release: %s replayed=%v, want 201 run afresh", a, a.Replayed())
	}
	var status string
	run("the retry ran",
		chromedp.Navigate(base+keyPath(defaultTenant, stuck)),
		chromedp.WaitVisible(chromedp.CSS(`table.facts`)),
		into(&status, chromedp.Text(chromedp.CSS(`span.st`))),
		shot("11-key-after-retry"),
		chromedp.Navigate(base+"/abandoned"),
		chromedp.WaitVisible(chromedp.ID("keys")),
		shot("12-abandoned"),
	)
	if status != "complete" {
		t.Errorf("after the retry the key is %q, want complete", status)
	}

	// A form posted without the session's CSRF token is refused.
	var refused string
	run("csrf",
		chromedp.Navigate(base+"/key/forget?"+url.Values{"tenant": {defaultTenant}, "key": {made}}.Encode()),
		chromedp.WaitVisible(chromedp.ID("reason")),
		chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			_, err := chromedp.Evaluate[string](`document.querySelector('form.action input[name=csrf]').value = 'forged'`)(ctx, tg)
			return err
		}),
		chromedp.SendKeys(chromedp.ID("reason"), "csrf check"),
		chromedp.Click(chromedp.ID("confirm")),
		// The forged token may be refused at the confirmation already or
		// only at the action: read the page through JavaScript until it
		// says which, pressing the action's button if it is offered, so
		// that no step holds a node the navigation replaced.
		chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			for i := 0; i < 200; i++ {
				text, err := chromedp.Evaluate[string](`document.body ? document.body.innerText : ''`)(ctx, tg)
				if err == nil && strings.Contains(text, "CSRF") {
					refused = text
					return nil
				}
				if err == nil {
					_, _ = chromedp.Evaluate[bool](`(function(){ const b = document.getElementById('do'); if (b) { b.click(); return true } return false })()`)(ctx, tg)
				}
				time.Sleep(50 * time.Millisecond)
			}
			return nil
		}),
	)
	if !strings.Contains(refused, "CSRF") {
		t.Errorf("a forged CSRF token was not refused: %q", refused)
	}
	if a := Do(t, Req{Method: "POST", URL: server.url + "/orders", Body: GoodOrder, Key: made}); !a.Replayed() {
		t.Errorf("the key survived no forged forget: %s replayed=%v", a, a.Replayed())
	}
}

// keyPath is the URL of a key's page on the console.
func keyPath(tenant, key string) string {
	return "/key?" + url.Values{"tenant": {tenant}, "key": {key}}.Encode()
}
