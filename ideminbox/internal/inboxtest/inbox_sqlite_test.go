package inboxtest_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/ideminbox"
	"github.com/idem-go/idem/ideminbox/internal/inboxtest"
	"github.com/idem-go/idem/idemmigrate"
	"github.com/idem-go/idem/idemsql"
	"github.com/idem-go/idem/idemsql/idemsqlite"
	"github.com/idem-go/idem/internal/testenv"
)

func newInbox(t *testing.T, store idem.Store, mod func(*ideminbox.Config)) *ideminbox.Inbox {
	t.Helper()
	return newInboxOn(t, inboxtest.Engine(t, store), mod)
}

func newInboxOn(t *testing.T, engine *idem.Engine, mod func(*ideminbox.Config)) *ideminbox.Inbox {
	t.Helper()
	c := ideminbox.Config{
		Consumer:       "orders",
		MaxAttempts:    3,
		InFlightDelay:  time.Millisecond,
		RetryDelayFunc: func(int) time.Duration { return 0 },
	}
	if mod != nil {
		mod(&c)
	}
	in, err := ideminbox.NewInbox(engine, &c)
	if err != nil {
		t.Fatal(err)
	}
	return in
}

func TestPoisonMultilineError(t *testing.T) {
	db, err := idemsqlite.Open(filepath.Join(t.TempDir(), "inbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := idemmigrate.Migrate(context.Background(), db, idemmigrate.SQLite); err != nil {
		t.Fatal(err)
	}
	in := newInbox(t, testenv.Must(idemsql.NewStore(db, idemsql.SQLite)), func(c *ideminbox.Config) { c.MaxAttempts = 1 })
	cause := errors.Join(errors.New("step 1 failed"), errors.New("step 2\x00 failed"))
	msg := ideminbox.Message{ID: "m1", Attempt: 1, Subject: "order\ncreated"}
	if d, err := in.Process(context.Background(), msg, func(context.Context) error { return cause }); d.Action != ideminbox.AckPoison || err != cause {
		t.Fatalf("first delivery: %v, %v; want ack-poison and the cause", d.Action, err)
	}
	st, err := in.Status(context.Background(), "m1")
	if err != nil || st.State != ideminbox.StatePoison || st.Error != `step 1 failed\nstep 2\x00 failed` || st.Subject != `order\ncreated` {
		t.Fatalf("status %+v, %v", st, err)
	}
	msg.Attempt = 2
	if d, err := in.Process(context.Background(), msg, func(context.Context) error {
		t.Error("a copy of a poison message ran")
		return nil
	}); d.Action != ideminbox.AckDuplicate || err != nil {
		t.Fatalf("copy of the poison message: %v, %v; want ack-duplicate", d.Action, err)
	}
}
