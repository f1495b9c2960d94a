// Package migrations holds the schema of FirmwareCheck's own table, applied
// by 'migrate up' after Shepherd's and reverted by 'migrate down' before it.
package migrations

import "embed"

// FS holds NNNN_name.up.sql and NNNN_name.down.sql, numbered from 1.
//
//go:embed *.sql
var FS embed.FS
