package bmdb

import (
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Candidates is the domain half of claiming: which machines a process wants to
// act on ("has no agent", "heartbeat stale"). The generic half (not leased in
// the process's exclusion group, no active backoff, not being claimed by a
// concurrent worker) is added by the BMDB when it claims, so a process author
// never writes it.
//
// Candidates are built by the constructors below, which keeps every SQL
// condition of Shepherd in this package. A condition is a boolean expression
// over the machines table aliased m; its parameters are named (@name).
type Candidates struct {
	name      string
	condition string
	// due is the SQL of the time at which the condition may become true
	// with no watched write (Condition.Due), or NULL.
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

const (
	// condAgentStart: provided machines without a started agent.
	condAgentStart = `
EXISTS (SELECT 1 FROM machine_provided p WHERE p.machine_id = m.machine_id)
AND NOT EXISTS (SELECT 1 FROM machine_agent_started s WHERE s.machine_id = m.machine_id)`

	// condRecovery: provided machines whose agent was started but never
	// heartbeated within the start timeout, or whose last heartbeat is older
	// than the heartbeat timeout.
	condRecovery = `
EXISTS (SELECT 1 FROM machine_provided p WHERE p.machine_id = m.machine_id)
AND EXISTS (
    SELECT 1 FROM machine_agent_started s
    LEFT JOIN machine_agent_heartbeat h ON h.machine_id = s.machine_id
    WHERE s.machine_id = m.machine_id
      AND ((h.machine_id IS NULL AND s.agent_started_at < now() - @start_timeout::interval)
        OR (h.machine_id IS NOT NULL AND h.agent_heartbeat_at < now() - @heartbeat_timeout::interval)))`

	// dueRecovery: when condRecovery becomes true if no heartbeat arrives:
	// the start timeout after the agent's start while it never
	// heartbeated, else the heartbeat timeout after its last heartbeat.
	dueRecovery = `(
    SELECT CASE WHEN h.machine_id IS NULL THEN s.agent_started_at + @start_timeout::interval
                ELSE h.agent_heartbeat_at + @heartbeat_timeout::interval END
    FROM machine_agent_started s
    LEFT JOIN machine_agent_heartbeat h ON h.machine_id = s.machine_id
    WHERE s.machine_id = m.machine_id)`

	// condProvided: every provided machine. Used by tests and benchmarks
	// whose processes act on any machine.
	condProvided = `EXISTS (SELECT 1 FROM machine_provided p WHERE p.machine_id = m.machine_id)`

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

// AgentStartCandidates selects provided machines with no agent started.
func AgentStartCandidates() Candidates {
	return mustCandidates(Condition{Name: "agent_start", SQL: condAgentStart})
}

// RecoveryCandidates selects machines whose agent never heartbeated within
// startTimeout of being started, or whose last heartbeat is older than
// heartbeatTimeout.
func RecoveryCandidates(startTimeout, heartbeatTimeout time.Duration) Candidates {
	return mustCandidates(Condition{
		Name: "recovery",
		SQL:  condRecovery,
		Due:  dueRecovery,
		Args: pgx.NamedArgs{
			"start_timeout":     startTimeout,
			"heartbeat_timeout": heartbeatTimeout,
		},
	})
}

// ProvidedCandidates selects every provided machine: a process whose domain
// condition is "always" (tests, benchmarks, periodic audits).
func ProvidedCandidates() Candidates {
	return mustCandidates(Condition{Name: "provided", SQL: condProvided})
}

// noCandidates selects nothing: for statistics that do not need the
// eligible count.
func noCandidates() Candidates {
	return Candidates{name: "none", condition: condNone, due: noDue}
}

// noDue is the due time of a condition that time alone never makes true.
const noDue = `NULL::timestamptz`

// query splices the condition into a constant template and merges the named
// arguments. Both template and condition are constants of this package.
func (c Candidates) query(template string, args pgx.NamedArgs) (string, pgx.NamedArgs) {
	merged := pgx.NamedArgs{}
	for k, v := range c.args {
		merged[k] = v
	}
	for k, v := range args {
		merged[k] = v
	}
	due := c.due
	if due == "" {
		due = noDue
	}
	query := strings.ReplaceAll(template, "/*CONDITION*/", c.condition)
	return strings.ReplaceAll(query, "/*DUE*/", due), merged
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
		due = noDue
	}
	return Candidates{name: c.Name, condition: c.SQL, due: due, args: args}, nil
}

// checkBalanced refuses SQL that could end the expression it is spliced
// into: parentheses that close more than they opened (`true) OR (true`),
// statement separators, comments (which could swallow the rest of the
// template) and dollar quoting. String literals and quoted identifiers are
// skipped.
func checkBalanced(sql string) error {
	depth := 0
	for i := 0; i < len(sql); i++ {
		switch ch := sql[i]; ch {
		case '\'', '"':
			j := i + 1
			for ; j < len(sql); j++ {
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
		case '(':
			depth++
		case ')':
			depth--
			if depth < 0 {
				return errors.New("a ')' closes more than the condition opened")
			}
		case ';':
			return errors.New("';' is not allowed: a condition is one expression")
		case '$':
			return errors.New("'$' is not allowed: use named @arguments, not positional ones or dollar quoting")
		case '-':
			if i+1 < len(sql) && sql[i+1] == '-' {
				return errors.New("comments (--) are not allowed")
			}
		case '/':
			if i+1 < len(sql) && sql[i+1] == '*' {
				return errors.New("comments (/*) are not allowed")
			}
		}
	}
	if depth != 0 {
		return errors.New("unbalanced parentheses")
	}
	return nil
}
