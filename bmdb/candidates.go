package bmdb

import (
	"errors"
	"fmt"
	"iter"
	"maps"
	"regexp"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Candidates is a checked condition (NewCandidates), ready for the runner
// to claim with: the domain half of claiming, which machines a process
// wants to act on ("has no agent", "heartbeat stale"). The generic half
// (not leased in the process's exclusion group, no active backoff, not
// being claimed by a concurrent worker) is added by the BMDB when it
// claims, so a process author never writes it. A condition is a boolean
// expression over the machines table aliased m; its parameters are named
// (@name).
type Candidates struct {
	name      string
	condition string
	// due is the SQL of the time at which the condition may become true
	// with no watched write (Condition.Due), or "" when none.
	due  string
	args pgx.NamedArgs
}

// Name identifies the candidate condition in errors and query plans.
func (c Candidates) Name() string { return c.name }

// Arg is the value of the condition's parameter name, for tools that show
// a process's effective settings (the status page's notion of a stale
// agent is Recovery's heartbeat_timeout).
func (c Candidates) Arg(name string) (any, bool) {
	v, ok := c.args[name]
	return v, ok
}

// Args are the condition's parameters and their values, for the BMDB,
// which binds them in every claim, and for tools that list them.
func (c Candidates) Args() iter.Seq2[string, any] { return maps.All(c.args) }

// SQL is the condition's text, for tools that show it next to the one a
// registry row holds.
func (c Candidates) SQL() string { return c.condition }

// Due is the text of the condition's due time, "" when time alone never
// makes it true.
func (c Candidates) Due() string { return c.due }

// condProvided: every provided machine.
const condProvided = `EXISTS (SELECT 1 FROM machine_provided p WHERE p.machine_id = m.machine_id)`

// ProvidedCandidates selects every provided machine: the condition of a
// process that acts on every machine (a periodic audit, a test).
func ProvidedCandidates() Candidates {
	c, err := NewCandidates(Condition{Name: "provided", SQL: condProvided})
	if err != nil { // a constant: an error is a bug
		panic(err)
	}
	return c
}

// Condition is a process's domain condition, declared by its author: which
// machines need the process ("has no agent", "heartbeat stale", "firmware
// not checked"). It is the only part of claiming a process writes.
type Condition struct {
	// Name names the condition in errors and query plans: lower case
	// letters, digits and underscores, starting with a letter.
	Name string
	// SQL is a boolean SQL expression over the machines table, aliased m.
	// It may reference any table by a correlated subquery on
	// m.machine_id (EXISTS (SELECT 1 FROM my_tag t WHERE t.machine_id =
	// m.machine_id ...)), now(), and the named parameters of Args as
	// @name. It must be one balanced expression: no statement separators,
	// no comments, no unbalanced parentheses (which could escape the
	// generic half it is ANDed with). It should be answerable by indexes
	// on machine_id (every tag table's primary key is one), since every
	// claim and every eligible count evaluates it.
	SQL string
	// Due, for a condition that time alone can make true ("last
	// heartbeat older than 10 minutes"), is a SQL expression over m of
	// type timestamptz: the earliest time at which SQL may become true if
	// none of the tables it reads is written meanwhile (NULL: never). Same
	// rules as SQL; it may use Args. Claims do not trust it: they re-check
	// SQL, so a Due that is too early costs a re-check, one that is too
	// late delays work until the reconcile pass (and counts as drift).
	// Leave it empty when only writes make SQL true ("no agent started").
	Due string
	// Args are the values of SQL's named parameters.
	Args pgx.NamedArgs
}

// reservedArgs are the parameters the claim, listing and count templates
// bind themselves; a condition may not redefine them.
var reservedArgs = []string{"after", "chunk", "group", "ids", "limit", "process", "scan", "session"}

var (
	conditionNameRE = regexp.MustCompile(`^[a-z][a-z0-9_]{0,62}$`)
	argNameRE       = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

// NewCandidates turns a process's declared condition into its Candidates,
// for a process defined outside this package. The BMDB always ANDs the
// generic half of claiming to it (no lease of the process's exclusion group
// on the machine, no active backoff, no "check again later" time in the
// future, the process not paused, its limits), so a condition cannot lease
// a machine another process of its group holds, whatever it says.
func NewCandidates(c Condition) (Candidates, error) {
	if !conditionNameRE.MatchString(c.Name) {
		return Candidates{}, fmt.Errorf("candidate condition name %q: want lower case letters, digits and underscores, starting with a letter", c.Name)
	}
	if strings.TrimSpace(c.SQL) == "" {
		return Candidates{}, fmt.Errorf("candidate condition %s: empty SQL", c.Name)
	}
	if err := checkBalanced(c.SQL); err != nil {
		return Candidates{}, fmt.Errorf("candidate condition %s: %w", c.Name, err)
	}
	if c.Due != "" {
		if err := checkBalanced(c.Due); err != nil {
			return Candidates{}, fmt.Errorf("candidate condition %s: due time: %w", c.Name, err)
		}
	}
	for name := range c.Args {
		if slices.Contains(reservedArgs, name) {
			return Candidates{}, fmt.Errorf("candidate condition %s: argument @%s is reserved by Shepherd's claim (reserved: %s)", c.Name, name, strings.Join(reservedArgs, ", "))
		}
		if !argNameRE.MatchString(name) {
			return Candidates{}, fmt.Errorf("candidate condition %s: argument name %q is not an identifier", c.Name, name)
		}
	}
	args := make(pgx.NamedArgs, len(c.Args))
	maps.Copy(args, c.Args)
	due := c.Due
	if strings.TrimSpace(due) == "" {
		due = ""
	}
	return Candidates{name: c.Name, condition: c.SQL, due: due, args: args}, nil
}

// checkBalanced refuses SQL that could end the expression it is spliced
// into: parentheses that close more than they opened (`true) OR (true`),
// statement separators, comments (which could swallow the rest of the
// template) and dollar quoting. String literals and quoted identifiers are
// skipped, so it must find where each ends exactly where PostgreSQL does.
// It therefore refuses the literals whose end depends on escapes or on a
// server setting rather than on doubled quotes alone: E'...' strings (\'
// does not end them) and any backslash in a plain string (with
// standard_conforming_strings off, \' does not end one either); and, as
// no condition needs them, U&'...' strings and U&"..." identifiers, whose
// escapes a reader of the condition would have to decode. A condition
// that needs such a value takes it as an @argument.
func checkBalanced(sql string) error {
	depth := 0
	for i := 0; i < len(sql); {
		ch := sql[i]
		switch {
		case isWordByte(ch):
			// A whole word, so that a letter ending an identifier
			// (date'2024-01-01') is not taken for a prefix.
			j := i
			for j < len(sql) && isWordByte(sql[j]) {
				j++
			}
			if err := checkPrefix(sql[i:j], sql[j:]); err != nil {
				return err
			}
			i = j
			continue
		case ch == '\'' || ch == '"':
			j := i + 1
			for ; j < len(sql); j++ {
				if sql[j] == '\\' && ch == '\'' {
					return errors.New("a backslash in a string literal is not allowed: PostgreSQL reads it as an escape when standard_conforming_strings is off; pass the value as an @argument")
				}
				if sql[j] == ch {
					if j+1 < len(sql) && sql[j+1] == ch { // doubled quote
						j++
						continue
					}
					break
				}
			}
			if j >= len(sql) {
				return errors.New("unterminated quote")
			}
			i = j
		case ch == '(':
			depth++
		case ch == ')':
			depth--
			if depth < 0 {
				return errors.New("a ')' closes more than the condition opened")
			}
		case ch == ';':
			return errors.New("';' is not allowed: a condition is one expression")
		case ch == '$':
			return errors.New("'$' is not allowed: use named @arguments, not positional ones or dollar quoting")
		case ch == '-':
			if i+1 < len(sql) && sql[i+1] == '-' {
				return errors.New("comments (--) are not allowed")
			}
		case ch == '/':
			if i+1 < len(sql) && sql[i+1] == '*' {
				return errors.New("comments (/*) are not allowed")
			}
		case ch == 0:
			return errors.New("a NUL byte is not allowed")
		}
		i++
	}
	if depth != 0 {
		return errors.New("unbalanced parentheses")
	}
	return nil
}

// isWordByte reports whether b continues a keyword, identifier or number
// (PostgreSQL's ident_cont without '$', which checkBalanced refuses, and
// with every byte of a multi-byte UTF-8 letter).
func isWordByte(b byte) bool {
	return b == '_' || b >= 0x80 || ('a' <= b && b <= 'z') || ('A' <= b && b <= 'Z') || ('0' <= b && b <= '9')
}

// checkPrefix refuses a word that PostgreSQL would read as the prefix of
// an escape string (E'...') or of a Unicode-escape string or identifier
// (U&'...', U&"..."), given the text that follows it. PostgreSQL starts
// such a literal at a lone E or U, and also at the E or U ending a number
// (1e'...' lexes as 1 followed by e'...'), so both are refused.
func checkPrefix(word, rest string) error {
	if rest == "" {
		return nil
	}
	last := word[len(word)-1]
	if len(word) > 1 && !('0' <= word[0] && word[0] <= '9') {
		return nil // an identifier or keyword: date'...' is a typed literal
	}
	switch {
	case (last == 'e' || last == 'E') && rest[0] == '\'':
		return errors.New("escape strings (E'...') are not allowed: a backslash-escaped quote does not end them, so where they end is not where quotes alone say; pass the value as an @argument")
	case (last == 'u' || last == 'U') && len(rest) > 1 && rest[0] == '&' && (rest[1] == '\'' || rest[1] == '"'):
		return errors.New("unicode-escape quoting (U&'...', U&\"...\") is not allowed; pass the value as an @argument")
	}
	return nil
}
