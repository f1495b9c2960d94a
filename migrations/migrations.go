// Package migrations holds the BMDB schema as versioned golang-migrate files,
// embedded so that the shepherd binary can migrate a database by itself.
package migrations

import "embed"

// FS holds the NNNN_name.up.sql / NNNN_name.down.sql files.
//
//go:embed *.sql
var FS embed.FS
