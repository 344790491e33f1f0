package ideminbox

import (
	"bytes"
	"context"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
)

// A poison record written in the format of earlier builds (status 599,
// Ideminbox-* headers) is still read as poison: its payload and error
// show in Status, and a redelivery is acknowledged without running.
func TestLegacyPoisonRecordRead(t *testing.T) {
	ctx := context.Background()
	engine, err := idem.NewEngine(idemmem.NewStore(nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	in, err := NewInbox(engine, &Config{Consumer: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	legacy := idem.Result{Mode: idem.ModeResponse, Status: legacyStatusPoison, Header: map[string][]string{
		legacyHeaderError:    {"malformed order"},
		legacyHeaderAttempt:  {"5"},
		legacyHeaderSubject:  {"orders"},
		legacyHeaderDataSize: {"9"},
	}, Body: []byte(`{"id":`)}
	if _, err := engine.Do(ctx, idem.Operation{Tenant: Tenant("billing"), Key: Key("m1")}, func(context.Context) (idem.Result, error) {
		return legacy, nil
	}); err != nil {
		t.Fatal(err)
	}
	st, err := in.Status(ctx, "m1")
	if err != nil {
		t.Fatal(err)
	}
	if st.State != StatePoison || st.Error != "malformed order" || st.Attempt != 5 || st.Subject != "orders" || st.DataSize != 9 || string(st.Data) != `{"id":` {
		t.Fatalf("legacy poison record read as %+v", st)
	}
	ran := false
	d, err := in.Process(ctx, Message{ID: "m1", Attempt: 6}, func(context.Context) error { ran = true; return nil })
	if d.Action != AckDuplicate || err != nil || ran {
		t.Fatalf("redelivery of a legacy poison message: %v %v, ran %v", d.Action, err, ran)
	}
}

// The typed records round-trip, legacy last-run records are read, and
// nothing the inbox writes carries a status code or a header.
func TestRecordFormats(t *testing.T) {
	p := poisonRecord{Attempt: 3, Error: "bad\\nline", Subject: "orders.eu", DataSize: 4}
	res := poisonResult(p, []byte("a\nb\x00"))
	if res.Status != 0 || res.Header != nil {
		t.Fatalf("poison record carries status %d, header %v", res.Status, res.Header)
	}
	got, data, ok := decodePoison(res)
	if !ok || got != p || !bytes.Equal(data, []byte("a\nb\x00")) {
		t.Fatalf("poison round trip: %+v %q %v", got, data, ok)
	}
	if !bytes.HasPrefix(res.Body, []byte(poisonMagic+`{"attempt":3,`)) {
		t.Fatalf("poison body %q", res.Body)
	}
	if _, _, ok := decodePoison(processedResult()); ok {
		t.Fatal("a processed record read as poison")
	}
	if isProcessed(res) || !isProcessed(processedResult()) || !isProcessed(idem.Result{Mode: idem.ModeMarker, Status: 200}) {
		t.Fatal("isProcessed")
	}
	for _, r := range []idem.Result{lastRunResult(42), {Mode: idem.ModeResponse, Status: legacyStatusLastRun, Body: []byte("42")}} {
		if h, err := decodeLastRun(r); h != 42 || err != nil {
			t.Fatalf("last run %+v: %d %v", r, h, err)
		}
	}
	if _, err := decodeLastRun(idem.Result{Mode: idem.ModeResponse, Body: []byte("42")}); err == nil {
		t.Fatal("a body without the format read as a last run")
	}
}
