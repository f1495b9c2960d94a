package bmdb

import (
	"regexp"
	"strings"

	"github.com/shepherd-fleet/shepherd/internal/sqlconst"
)

// statementName is how a constant says it is a statement: qName for one
// run as it is, nameTemplate for one that splices a process's condition.
var statementName = regexp.MustCompile(`^(q[A-Z]\w*|\w+Template)$`)

// SQLStatements derives from the source of this package and of package
// operator every SQL statement constant, by name, ready to prepare, with
// the file that declares it: constants built from others are folded
// (sqlconst), and templates get withDue, a condition with a due time, so
// that both placeholders are filled (the tests pass Recovery's).
// queries_test.go prepares them all, so that a renamed column fails a fast
// test, not a path at run time; the list is read from the source, so a new
// statement cannot be forgotten.
func SQLStatements(withDue Candidates) (sql, file map[string]string, err error) {
	sql, file, err = sqlconst.Read(".", statementName)
	if err != nil {
		return nil, nil, err
	}
	ops, opsFile, err := operatorStatements()
	if err != nil {
		return nil, nil, err
	}
	for name, s := range ops {
		sql[name], file[name] = s, "operator/"+opsFile[name]
	}
	for name, s := range sql {
		if strings.HasSuffix(name, "Template") {
			sql[name], _ = SpliceCondition(withDue, s, nil)
		}
	}
	return sql, file, nil
}

// operatorStatements reads the statements of package operator, whose
// constants build on this package's (bmdb.EligibleFilter, ...).
func operatorStatements() (sql, file map[string]string, err error) {
	core, _, err := sqlconst.Read(".", regexp.MustCompile(`^(EligibleFilter|BudgetCounted)$`))
	if err != nil {
		return nil, nil, err
	}
	imported := make(map[string]string, len(core))
	for name, s := range core {
		imported["bmdb."+name] = s
	}
	return sqlconst.ReadImporting("operator", statementName, imported)
}

// operatorSQL is the statement of package operator named name, for the
// tests of its plans.
func operatorSQL(name string) string {
	sql, _, err := operatorStatements()
	if err != nil {
		panic(err)
	}
	s, ok := sql[name]
	if !ok {
		panic("no statement " + name + " in package operator")
	}
	return s
}
