package bmdb

import (
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// registerUUID makes conn read a uuid column into a uuid.UUID by copying
// its 16 bytes. pgx's own uuid codec knows only its UUIDScanner targets;
// for a uuid.UUID it falls back to the type's sql.Scanner, which has the
// codec format the value as text and then parses the text back, two
// allocations and a parse for every machine id of every claim and batch of
// lease ends (UUIDArray is the same fix for parameters). Every other
// target, and the text format, are pgx's as before.
func registerUUID(conn *pgx.Conn) {
	conn.TypeMap().RegisterType(&pgtype.Type{Name: "uuid", OID: pgtype.UUIDOID, Codec: uuidCodec{}})
}

// uuidCodec is pgtype.UUIDCodec with a direct binary plan for *uuid.UUID.
type uuidCodec struct{ pgtype.UUIDCodec }

func (c uuidCodec) PlanScan(m *pgtype.Map, oid uint32, format int16, target any) pgtype.ScanPlan {
	if _, ok := target.(*uuid.UUID); ok && format == pgtype.BinaryFormatCode {
		return scanUUIDBinary{}
	}
	return c.UUIDCodec.PlanScan(m, oid, format, target)
}

// scanUUIDBinary copies a binary uuid into a *uuid.UUID. A NULL leaves the
// target as it is and is no error, as uuid.UUID's sql.Scanner did.
type scanUUIDBinary struct{}

func (scanUUIDBinary) Scan(src []byte, dst any) error {
	if src == nil {
		return nil
	}
	if len(src) != 16 {
		return fmt.Errorf("invalid length for uuid: %d bytes", len(src))
	}
	copy(dst.(*uuid.UUID)[:], src)
	return nil
}
