package bmdb

import (
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"
)

// The codec registerUUID installs reads a binary uuid into a uuid.UUID
// directly (not through its sql.Scanner's text round trip), keeps a NULL
// from changing the target, refuses a malformed value, and leaves every
// other target to pgx.
func TestUUIDCodecPlans(t *testing.T) {
	m := pgtype.NewMap()
	m.RegisterType(&pgtype.Type{Name: "uuid", OID: pgtype.UUIDOID, Codec: uuidCodec{}})

	var got uuid.UUID
	plan := m.PlanScan(pgtype.UUIDOID, pgtype.BinaryFormatCode, &got)
	if _, ok := plan.(scanUUIDBinary); !ok {
		t.Fatalf("binary plan for *uuid.UUID is %T, want scanUUIDBinary", plan)
	}
	want := uuid.New()
	if err := plan.Scan(want[:], &got); err != nil || got != want {
		t.Fatalf("Scan: %v, %v; want %v", got, err, want)
	}
	if err := plan.Scan(nil, &got); err != nil || got != want {
		t.Fatalf("Scan of NULL: %v, %v; want the target unchanged (%v) and no error", got, err, want)
	}
	if err := plan.Scan(want[:15], &got); err == nil {
		t.Fatal("Scan of 15 bytes: no error")
	}

	var p pgtype.UUID
	if err := m.Scan(pgtype.UUIDOID, pgtype.BinaryFormatCode, want[:], &p); err != nil || p.Bytes != want {
		t.Fatalf("Scan into pgtype.UUID: %v, %v", p, err)
	}
	var text uuid.UUID
	if err := m.Scan(pgtype.UUIDOID, pgtype.TextFormatCode, []byte(want.String()), &text); err != nil || text != want {
		t.Fatalf("Scan of text: %v, %v", text, err)
	}
}
