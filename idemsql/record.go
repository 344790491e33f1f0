package idemsql

import (
	"database/sql"
	"fmt"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemcodec"
)

// scanRecord reads one row of recordColumns, then the columns that
// follow into extra. It returns the recovery points as stored, encoded
// (nil for none), without decoding them into the record: a replay needs
// none, and a record holding steps that do not decode is still replayed.
// decodeSteps decodes them where they are needed.
func scanRecord(d *dialect, row interface{ Scan(...any) error }, extra ...any) (*idem.Record, []byte, error) {
	var (
		rec                               idem.Record
		state                             string
		mode                              int64
		status                            sql.NullInt64
		headers                           []byte
		ref                               sql.NullString
		steps                             []byte
		locked, created, completed, until = dbTime{utcWall: d.utcWall}, dbTime{utcWall: d.utcWall}, dbTime{utcWall: d.utcWall}, dbTime{utcWall: d.utcWall}
	)
	dest := []any{&rec.Tenant, &rec.Key, &rec.Fingerprint, &state, &rec.LeaseToken, &locked,
		&mode, &status, &headers, &rec.Result.Body, &ref,
		&created, &completed, &until, &steps}
	if err := row.Scan(append(dest, extra...)...); err != nil {
		return nil, nil, err
	}
	rec.State = idem.State(state)
	rec.LockedUntil = locked.t
	rec.CreatedAt = created.t
	rec.CompletedAt = completed.t
	rec.ExpiresAt = until.t
	rec.Result.Mode = idem.StorageMode(mode)
	rec.Result.Status = int(status.Int64)
	rec.Result.Reference = ref.String
	var err error
	if rec.Result.Header, err = idemcodec.UnmarshalHeader(headers); err != nil {
		return nil, nil, err
	}
	if len(rec.Fingerprint) == 0 {
		rec.Fingerprint = nil
	}
	if len(steps) == 0 {
		steps = nil
	}
	return &rec, steps, nil
}

// decodeSteps decodes recovery points as stored; nil and empty are none.
// Steps that do not decode are an error, never taken for none: a takeover
// would run again the steps they record.
func decodeSteps(b []byte) ([]idem.RecordedStep, error) {
	if len(b) == 0 {
		return nil, nil
	}
	steps, err := idemcodec.UnmarshalSteps(b)
	if err != nil {
		return nil, fmt.Errorf("idemsql: %w", err)
	}
	return steps, nil
}

// dbTime scans a time column of any dialect into a UTC time.Time; NULL
// gives the zero time.
type dbTime struct {
	// utcWall says that a time.Time from the driver carries the UTC wall
	// clock in whatever location the driver chose (MySQL DATETIME: the
	// driver's loc parameter), so only its fields count.
	utcWall bool
	t       time.Time
}

// mysqlLayout is how MySQL sends DATETIME(6) as text (parseTime=false).
const mysqlLayout = "2006-01-02 15:04:05.999999"

// Scan implements sql.Scanner.
func (d *dbTime) Scan(src any) error {
	switch v := src.(type) {
	case nil:
		d.t = time.Time{}
	case int64: // SQLite: Unix microseconds
		d.t = time.UnixMicro(v).UTC()
	case time.Time:
		if d.utcWall {
			v = time.Date(v.Year(), v.Month(), v.Day(), v.Hour(), v.Minute(), v.Second(), v.Nanosecond(), time.UTC)
		}
		d.t = v.UTC()
	case []byte:
		return d.parse(string(v))
	case string:
		return d.parse(v)
	default:
		return fmt.Errorf("idemsql: cannot read %T as a time", src)
	}
	return nil
}

func (d *dbTime) parse(s string) error {
	t, err := time.ParseInLocation(mysqlLayout, s, time.UTC)
	if err != nil {
		return fmt.Errorf("idemsql: cannot read %q as a time: %w", s, err)
	}
	d.t = t
	return nil
}
