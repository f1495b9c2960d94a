// Package migrations holds the BMDB schema as versioned golang-migrate files,
// embedded so that the shepherd binary can migrate a database by itself.
//
// Migrations are written expand-then-contract, so that a rolling upgrade
// never stops the fleet (docs/upgrading.md): a release adds what its code
// needs (a table, a nullable column or one with a default, a wider check)
// in a migration the running binaries of the release before do not notice,
// and removes what only older code used in a later release's migration,
// once no binary that needs it runs any more.
//
// A migration declares which of the two it is in its .up.sql file, in
// lines of their own (bmdb.Declaration):
//
//	-- shepherd: compatible-with-previous
//	-- shepherd: release v1.4
//
// The first says that binaries of the previous schema version may keep
// running on this one (an expand step); without it, the migration is a
// contract step, and such binaries refuse to start on it. The second names
// the release that brings the migration, for the refusal's message.
// 'shepherd migrate up' records both in the database, where binaries older
// than the migration, which do not embed it, read them at start.
//
// 0030_baseline is the first: the whole schema in one file, replacing the
// migrations 0001 to 0029 written before the first release. It is numbered
// after them so that binaries built before it read it as a newer schema,
// which it declares compatible with them (it is the same schema), rather
// than as an older one their 'migrate up' would apply their 0002 onto.
// 'migrate up' takes a database those migrations built (version 29) over
// as the baseline without running it (bmdb.BaselineVersion,
// docs/upgrading.md). New migrations come after it, from 0031.
//
// A migration that adds or changes a safety gate (holds, budgets, cancel
// requests, ...) also says how binaries that do not know the gate are
// kept to it: "-- shepherd: gate enforced-in-database" (the database
// refuses what they would do against it), "-- shepherd: incompatible:
// WHY" (a contract step), or "-- shepherd: incompatible-before N: WHY"
// (binaries before schema N refuse to start on it). 0033 is the first:
// it binds older binaries to holds and budgets in the database, and
// refuses binaries before schema 18, which ignore cancel requests
// (docs/upgrading.md).
package migrations

import "embed"

// FS holds the NNNN_name.up.sql / NNNN_name.down.sql files.
//
//go:embed *.sql
var FS embed.FS
