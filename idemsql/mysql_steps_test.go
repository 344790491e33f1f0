package idemsql_test

import (
	"bytes"
	"context"
	"database/sql"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmigrate"
	"github.com/idem-go/idem/idemsql"
	"github.com/idem-go/idem/idemsql/idemmysql"
	"github.com/idem-go/idem/internal/testenv"
)

// TestMySQLStepsPastPacketLimit saves steps whose total outgrows the
// server's max_allowed_packet on a session that is not strict (sql_mode
// ”), where CONCAT answers NULL with a warning instead of failing: the
// step that would outgrow it must fail, and the steps saved before it
// must stay, rather than all of them be erased under a success.
func TestMySQLStepsPastPacketLimit(t *testing.T) {
	base, err := mysql.ParseDSN(testenv.MySQLDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	setup := sqlOpen(t, "mysql", base.FormatDSN())
	defer setup.Close()
	if err := idemmigrate.Migrate(ctx, setup, idemmigrate.MySQL); err != nil {
		t.Fatal(err)
	}
	var limit int
	if err := setup.QueryRow(`SELECT @@max_allowed_packet`).Scan(&limit); err != nil {
		t.Fatal(err)
	}
	cfg := base.Clone()
	cfg.Params = map[string]string{"sql_mode": "''"}
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(connector)
	defer db.Close()
	st := testenv.Must(idemsql.NewStore(db, idemmysql.Dialect))

	tenant := newName("tenant")
	p := claimParams(tenant, "order-1", "fp")
	mustClaim(t, st, p, true)
	// Each step fits in a packet with room to spare; the two together
	// do not.
	value := bytes.Repeat([]byte("v"), limit*6/10)
	if err := st.SaveStep(ctx, idem.SaveStepParams{Tenant: tenant, Key: "order-1", Token: p.Token, Name: "first", Value: value}); err != nil {
		t.Fatalf("first step: %v", err)
	}
	err = st.SaveStep(ctx, idem.SaveStepParams{Tenant: tenant, Key: "order-1", Token: p.Token, Name: "second", Value: value})
	if err == nil {
		t.Errorf("a step taking the steps past max_allowed_packet (%d) was saved", limit)
	}
	rec := mustGet(t, st, tenant, "order-1")
	if len(rec.Steps) == 0 || rec.Steps[0].Name != "first" || !bytes.Equal(rec.Steps[0].Value, value) {
		names := []string{}
		for _, s := range rec.Steps {
			names = append(names, s.Name)
		}
		t.Fatalf("steps after the second save = %v, want the first one kept", names)
	}
}
