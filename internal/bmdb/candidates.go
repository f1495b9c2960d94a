package bmdb

import (
	"strings"

	"github.com/jackc/pgx/v5"

	bmdbapi "github.com/shepherd-fleet/shepherd/bmdb"
)

// Candidates is a process's checked condition (the domain half of
// claiming), and Condition the condition as its author declares it: the
// public package's types, which the machinery uses as they are. Shepherd's
// own processes declare their conditions in their packages
// (processes/agentstart, processes/recovery) through the public
// constructor, as a user's process does.
type (
	Candidates = bmdbapi.Candidates
	Condition  = bmdbapi.Condition
)

// NewCandidates checks a declared condition (bmdb.NewCandidates).
func NewCandidates(c Condition) (Candidates, error) { return bmdbapi.NewCandidates(c) }

// ProvidedCandidates selects every provided machine: a process whose
// domain condition is "always" (tests, benchmarks, periodic audits).
func ProvidedCandidates() Candidates { return bmdbapi.ProvidedCandidates() }

// dueSQL is the SQL of c's due time, NULL when time alone never makes it
// true.
func dueSQL(c Candidates) string {
	if c.Due() == "" {
		return noDue
	}
	return c.Due()
}

const (

	// condNone matches no machine; the planner folds it away, so a
	// statement counting with it reads no machine.
	condNone = `false`
)

// mustCandidates builds the shipped processes' conditions through the same
// constructor as a user's; they are constants, so an error is a bug.
func mustCandidates(c Condition) Candidates {
	cand, err := NewCandidates(c)
	if err != nil {
		panic(err)
	}
	return cand
}

// noCandidates selects nothing: for statistics that do not need the
// eligible count.
func noCandidates() Candidates { return noneCandidates }

var noneCandidates = mustCandidates(Condition{Name: "none", SQL: condNone})

// noDue is the due time of a condition that time alone never makes true.
const noDue = `NULL::timestamptz`

// SpliceCondition splices the condition of c into a constant template and merges
// the named arguments. The template is a constant of this package, the
// condition one NewCandidates checked.
func SpliceCondition(c Candidates, template string, args pgx.NamedArgs) (string, pgx.NamedArgs) {
	merged := pgx.NamedArgs{}
	for k, v := range c.Args() {
		merged[k] = v
	}
	for k, v := range args {
		merged[k] = v
	}
	// One pass: a marker inside the spliced condition (in a string
	// literal, where NewCandidates allows it) is text, not replaced.
	return strings.NewReplacer("/*CONDITION*/", c.SQL(), "/*DUE*/", dueSQL(c)).Replace(template), merged
}
